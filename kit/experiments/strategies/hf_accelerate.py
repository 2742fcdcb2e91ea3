"""Hugging Face Accelerate in the kit's ranks: the DDP training loop written the Accelerate way.

    accelerator = Accelerator(mixed_precision=...)
    model, optimizer, loader = accelerator.prepare(model, optimizer, loader)
    loss = loss_fn(model(x), y); accelerator.backward(loss); optimizer.step(); optimizer.zero_grad()
    losses = accelerator.gather_for_metrics(per_sample_losses)

On CPU ranks `prepare` wraps the model in torch's DistributedDataParallel, so this is the kit's
`ddp` strategy with Accelerate's bookkeeping around it (checked equal after N steps).

Two traps of persistent notebook ranks, verified with accelerate 1.15 and handled here:
- A plain `Accelerator()` on CPU ranks picks DistributedType.NO (it looks for an accelerator
  device, and takes the CPU path only with `cpu=True` / ACCELERATE_USE_CPU, which
  `accelerate launch --cpu` sets): num_processes == 1, no gradient averaging, N independent
  copies training silently. `accelerate_env()` sets what Accelerate reads; the kit's CPU ranks
  set ACCELERATE_USE_CPU at start-up (rank/setup.py) so tutorial code works as written.
- Accelerate's state is a process-wide singleton (AcceleratorState, a Borg): a second
  `Accelerator(mixed_precision=...)` with another precision raises ValueError in the same
  ranks. The strategy saves whatever state the notebook's cells made, resets it, runs, and
  puts it back (`close`), so a lab-bench run does not change a learner's `accelerator`.
"""
from __future__ import annotations

import os
import time
from typing import Any, Callable

import torch
import torch.distributed as dist
from torch import nn

from kit.experiments.strategies.common import make_optimizer
from kit.experiments.strategies.ddp import DDPStrategy, HookState, timed_allreduce_hook
from kit.experiments.measure.memory import ActivationMeter

__all__ = ["AccelerateStrategy", "accelerate_env", "MIXED", "SECOND_ACCELERATOR_FIX"]

MIXED = {"fp32": "no", "bf16": "bf16", "fp16": "fp16"}  # kit precision -> Accelerate's flag
SECOND_ACCELERATOR_FIX = (
    "Accelerate keeps one AcceleratorState per process, and the kit's ranks live across cells. "
    "To change mixed_precision (or cpu) in the same ranks, run first:\n"
    "    from accelerate.state import AcceleratorState\n"
    "    AcceleratorState._reset_state(reset_partial_state=True)\n"
    "then create the new Accelerator (the old one must not be used again), or `%dist restart` "
    "for fresh ranks.")


def accelerate_env(device: torch.device) -> None:
    """Set the environment Accelerate reads, from the process group this rank already joined.

    Accelerate decides "distributed or not" from env vars (LOCAL_RANK / WORLD_SIZE, and
    ACCELERATE_USE_CPU for CPU ranks), not from torch.distributed.is_initialized(). The kit's
    ranks set RANK/WORLD_SIZE/LOCAL_RANK; a test's spawn harness does not. setdefault: a value
    the user set wins.
    """
    if not dist.is_initialized():
        return
    world = str(dist.get_world_size())
    for k, v in (("RANK", str(dist.get_rank())), ("WORLD_SIZE", world), ("LOCAL_RANK", str(dist.get_rank())),
                 ("LOCAL_WORLD_SIZE", world)):
        os.environ.setdefault(k, v)
    if device.type == "cpu":
        os.environ.setdefault("ACCELERATE_USE_CPU", "true")
    else:  # GPU ranks: the kit's placement, not cuda:LOCAL_RANK (untested here: no GPU on this box)
        os.environ.setdefault("ACCELERATE_TORCH_DEVICE", str(device))


class _SavedState:
    """The three Borg dicts of accelerate.state, copied out and put back (in place: every
    Accelerator object made earlier shares those very dicts)."""

    def __init__(self) -> None:
        from accelerate.state import AcceleratorState, GradientState, PartialState
        self.dicts = [PartialState._shared_state, AcceleratorState._shared_state, GradientState._shared_state]
        self.saved = [dict(d) for d in self.dicts]
        self.had_state = bool(self.saved[1])
        AcceleratorState._reset_state(reset_partial_state=True)
        GradientState._reset_state()

    def restore(self) -> None:
        for d, s in zip(self.dicts, self.saved):
            d.clear()
            d.update(s)


class AccelerateStrategy(DDPStrategy):
    """`accelerator.prepare` instead of DDP(...): the same phases, timed by the kit's clock."""

    def __init__(self, cfg: Any, model: nn.Module, loss_fn: Callable[..., torch.Tensor],
                 device: torch.device, clock: Any):
        import accelerate
        from accelerate import Accelerator
        from accelerate.utils import DistributedDataParallelKwargs

        self.cfg, self.device, self.clock, self.loss_fn = cfg, device, clock, loss_fn
        self.notes: list[str] = []
        self.bucket_bytes: list[int] = []
        self.buckets: dict[int, int] = {}
        self.link = None
        self.gather_ms: list[float] = []  # wall time of each step's gather_for_metrics
        self.gather_bytes = 0
        self.world_size = dist.get_world_size() if dist.is_initialized() else 1
        accelerate_env(device)
        self._saved = _SavedState()  # a learner's Accelerator from a %%distributed cell survives the run
        ddp_kw = DistributedDataParallelKwargs(bucket_cap_mb=cfg.bucket_cap_mb,
                                               gradient_as_bucket_view=cfg.gradient_as_bucket_view)
        try:
            self.acc = Accelerator(mixed_precision=MIXED[cfg.precision], cpu=device.type == "cpu",
                                   kwargs_handlers=[ddp_kw])
        except BaseException:
            self._saved.restore()
            raise
        if self.acc.num_processes != self.world_size:  # the silent-copies trap: never train through it
            self._saved.restore()
            raise RuntimeError(
                f"Accelerator().num_processes={self.acc.num_processes} but the process group has "
                f"{self.world_size} ranks (distributed_type={self.acc.distributed_type}): each rank would "
                "train its own copy. On CPU ranks pass cpu=True or set ACCELERATE_USE_CPU=true before "
                "creating the Accelerator.")
        self.base = model
        self.params = [p for p in model.parameters() if p.requires_grad]
        opt = make_optimizer(self.params)
        self.model, self.opt_acc = self.acc.prepare(model, opt)
        self.opt = opt  # the torch optimizer (its state is what memory counts)
        # One process on a GPU: Accelerate's distributed_type is NO and prepare() returns the model as it is
        # (no DDP: no gradient all-reduce to time, no bucket copy of the gradients); on CPU ranks it wraps
        # even one process.
        self.ddp = isinstance(self.model, nn.parallel.DistributedDataParallel)
        if cfg.instrument and self.ddp:
            # prepare() returned torch's DDP: the kit's timed hook stamps each bucket's all-reduce.
            self.model.register_comm_hook(HookState(self.buckets, None, clock, self.world_size),
                                          timed_allreduce_hook)
        self.meter = ActivationMeter(self.params)
        clock.watch_grads(self.params)
        self.notes.append(
            f"accelerate {accelerate.__version__}: distributed_type={self.acc.distributed_type.value}, "
            f"num_processes={self.acc.num_processes}, mixed_precision={self.acc.mixed_precision!r}, "
            f"model wrapped as {type(self.model).__name__}; gather_for_metrics of per-sample losses is timed "
            "as its own comm phase (DDP runs do not have it)")
        if self._saved.had_state:
            self.notes.append("an Accelerator made earlier in these ranks was set aside for this run and "
                              "restored after it")

    def prepare_loader(self, loader: Any) -> Any:
        """`accelerator.prepare(loader)`: Accelerate shards the batches itself (rank r takes
        batches r, r+N, ...), so it must get the *unsharded* loader; a loader that already has a
        DistributedSampler(num_replicas=N) would be sharded twice (1/N^2 of the data per rank)."""
        sampler = getattr(loader, "sampler", None)
        if getattr(sampler, "num_replicas", 1) != 1:
            raise ValueError("give accelerator.prepare the unsharded loader: this one already has a "
                             f"DistributedSampler over {sampler.num_replicas} ranks and would be sharded twice")
        return _EpochLoader(self.acc.prepare(loader))

    def train_step(self, x: torch.Tensor, y: torch.Tensor, probe: Callable[[], None] | None = None) -> float:
        x, y = x.to(self.device), y.to(self.device)
        with self.clock.phase("forward"), (self.meter.record() if probe else _null()):
            out = self.model(x)  # prepare() put autocast around forward when mixed_precision is on
            loss = self.loss_fn(out, y)
        with self.clock.phase("backward"):
            self.acc.backward(loss)  # GradScaler for fp16 on GPU; loss.backward() otherwise
        if probe:
            probe()
        with self.clock.phase("optimizer"):
            self.opt_acc.step()
            self.opt_acc.zero_grad(set_to_none=True)
        t0 = time.perf_counter()
        with self.clock.phase("gather_for_metrics", "comm"):
            # Per-sample values, as gather_for_metrics expects (on an uneven last batch it drops
            # the duplicated samples; a per-rank scalar would be cut wrongly). Mean = global loss.
            per_sample = nn.functional.cross_entropy(out.detach().reshape(-1, out.shape[-1]).float(),
                                                     y.reshape(-1), reduction="none")
            losses = self.acc.gather_for_metrics(per_sample)
            loss_value = float(losses.mean())  # float(): waits for the gather on any device
        self.gather_ms.append((time.perf_counter() - t0) * 1e3)
        self.gather_bytes = losses.numel() * losses.element_size()
        return loss_value

    def comm_report(self) -> dict[str, Any]:
        """The step's collectives: DDP's all-reduce of the gradients, and the metrics gather
        (its own time per step, so a comparison with `ddp` can leave it out)."""
        from kit.experiments.theory.sharding_theory import wire_prediction
        grads = sum(p.numel() * p.element_size() for p in self.params)
        # one process, not wrapped in DDP: no collective at all (gather_for_metrics returns its input)
        ops = ([("all_reduce", grads)] if self.ddp else []) + \
            ([("all_gather", self.gather_bytes)] if self.acc.num_processes > 1 else [])
        out = wire_prediction(ops, self.world_size)
        out["gather_for_metrics_ms_by_step"] = [round(x, 4) for x in self.gather_ms]
        out["note"] = (("all_reduce = DDP's gradient buckets (inside backward)" if self.ddp else
                        "one process, not wrapped in DDP: no gradient all-reduce") +
                       "; all_gather = gather_for_metrics of the per-sample losses (after the optimizer step)")
        return out

    def extra_grad_bytes(self) -> int:
        """DDP's bucket copy of the gradients (DDPStrategy's count), none where prepare() did not wrap."""
        return super().extra_grad_bytes() if self.ddp else 0

    def ddp_logging(self) -> dict[str, Any] | None:
        """torch's DDP timers where prepare() wrapped the model in DDP; None (no field) where it did not."""
        return super().ddp_logging() if self.ddp else None

    def close(self) -> None:
        """Put back the Accelerate state the notebook had before this run (none: an empty one)."""
        self._saved.restore()


class _EpochLoader:
    """The prepared loader behind the runner's `loader.sampler.set_epoch(e)`: Accelerate's
    DataLoaderShard.set_epoch reaches the DistributedSampler inside its batch sampler."""

    def __init__(self, prepared: Any):
        self.prepared = prepared
        self.sampler = self  # runner calls loader.sampler.set_epoch(e)

    def set_epoch(self, epoch: int) -> None:
        self.prepared.set_epoch(epoch)

    def __iter__(self) -> Any:
        return iter(self.prepared)

    def __len__(self) -> int:
        return len(self.prepared)


def _null() -> Any:
    from contextlib import nullcontext
    return nullcontext()
