"""Sharding, twice: ZeRO-1 (torch's ZeroRedundancyOptimizer over DDP) and FSDP2 (`fully_shard`).

Both train exactly what DDP trains (same global batch, same Adam), so after N steps their
parameters equal DDP's and the single process's within fp32 reordering error; what changes is
what each rank *holds* and what it *sends*:

- zero1: DDP all-reduces the full gradients as usual; each rank's Adam then updates only its
  1/N of the parameters (it holds m, v and `step` for those whole tensors only) and broadcasts them
  to the others. Per rank: params 4, grads 4, optimizer 8/N bytes/param + 4 bytes x tensors/N.
- fsdp: each rank stores 1/N of every parameter (a DTensor shard). Forward all-gathers a
  block's parameters just in time; backward reduce-scatters the gradients so each rank keeps
  1/N. reshard_after_forward=True frees the gathered parameters after forward and gathers
  them again in backward (ZeRO-3, 16/N bytes/param + a 4-byte `step` per tensor at rest, 1.5x DDP's traffic);
  False keeps them until backward (ZeRO-2-like: no second all-gather, more memory in between).
"""
from __future__ import annotations

from typing import Any, Callable

import torch
import torch.distributed as dist
from torch import nn

from kit.experiments.strategies.common import ADAM_LR, make_optimizer, make_scaler
from kit.experiments.strategies.ddp import DDPStrategy
from kit.experiments.measure.memory import ShardAwareMeter, beside_formula, optimizer_bytes, sharded_memory
from kit.experiments.theory.sharding_theory import wire_prediction, zero_prediction
from kit.experiments.strategies.single import Single
import kit.experiments.parallel.wire as wire
from kit.experiments.parallel.wire_fsdp import CustomCollectives, install_fsdp_comms
from kit.units import MIB
from kit import _renamed

__all__ = ["ZeRO1Strategy", "FSDPStrategy", "full_params"]
__getattr__ = _renamed.renamed_getattr(__name__)  # this release's old names, for one release


def full_params(model: nn.Module) -> dict[str, torch.Tensor]:
    """Every parameter, whole (DTensor shards gathered), for comparing against a reference."""
    return {n: (p.full_tensor() if hasattr(p, "full_tensor") else p).detach().clone()
            for n, p in model.named_parameters()}


def _set_prediction(memory: dict[str, Any], stage: int, n_params: int, n_tensors: int, world_size: int,
                    whole_tensors: bool = False) -> None:
    """Replace the plot's 'predicted' bars by the ZeRO stage's fp32 numbers (parallel_memory.state_mib, Adam's
    `step` per tensor included), put them beside what was measured (`by_kind`), and keep both variants."""
    z = zero_prediction(stage, n_params, world_size, n_tensors, whole_tensors)
    pred = {"activations_mib": None, **memory.get("predicted", {}),
            **{k: z["fp32"][k] for k in ("params_mib", "grads_mib", "optimizer_mib")},
            "formula": z["fp32"]["formula_by_kind"]}
    beside_formula(memory, pred)
    memory["zero"] = z


class ZeRO1Strategy(DDPStrategy):
    """DDP for the gradients + ZeroRedundancyOptimizer for the optimizer state and update."""

    def __init__(self, *a: Any, **kw: Any):
        super().__init__(*a, **kw)
        from torch.distributed.optim import ZeroRedundancyOptimizer
        self.opt = ZeroRedundancyOptimizer(self.params, optimizer_class=torch.optim.Adam, lr=ADAM_LR)
        # ZeRO's step() = local Adam on this rank's shard, then _sync_params (a broadcast per
        # rank). We run the sync ourselves right after, in its own "comm" phase, so the step
        # breakdown shows the broadcast instead of hiding it inside "optimizer".
        if not hasattr(self.opt, "_sync_params"):
            raise RuntimeError("this torch's ZeroRedundancyOptimizer has no _sync_params; the kit "
                               "cannot time its parameter broadcast separately")
        self._sync: Callable[[], None] = self.opt._sync_params
        self.opt._sync_params = lambda: None  # type: ignore[method-assign]
        self.n_params = sum(p.numel() for p in self.params)
        self.n_tensors = len(self.params)
        self.notes.append("zero1: torch ZeroRedundancyOptimizer over DDP; the parameter broadcast "
                          "after Adam is timed as comm (exposed: nothing overlaps it)")

    def train_step(self, x: torch.Tensor, y: torch.Tensor, probe: Callable[[], None] | None = None) -> float:
        loss = super().train_step(x, y, probe)
        with self.clock.phase("param broadcast", "comm"):
            self._sync()
        return loss

    def adjust_memory(self, memory: dict[str, Any]) -> None:
        memory["optimizer_mib"] = optimizer_bytes(self.opt.optim) / MIB  # this rank's shard only
        # ZeroRedundancyOptimizer hands each rank whole tensors (m, v and step): tensors / N steps on average
        _set_prediction(memory, 1, self.n_params, self.n_tensors, self.world_size, whole_tensors=True)

    def comm_report(self) -> dict[str, Any]:
        grads = [b for _, b in sorted(self.buckets.items())] or [4 * self.n_params]
        colls = [("all_reduce", b) for b in grads] + [("broadcast", 4 * self.n_params)]
        out = wire_prediction(colls, self.world_size)
        out["note"] = ("torch's ZeRO-1 all-reduces full gradients then broadcasts updated shards: "
                       "3(N-1)/N*S per rank, vs the paper's reduce-scatter + all-gather 2(N-1)/N*S")
        return out


class FSDPStrategy(Single):
    """FSDP2: fully_shard every block of the Sequential, then the root. Its all-gathers and reduce-scatters
    are counted and timed in the wire (parallel/wire.py, wire_fsdp.CustomCollectives) under "fsdp", by the
    same rules as every other collective the kit times: one clock reading per end for both the call's ms
    and its "fsdp <kind>" timeline phase, a step's report waits for the completion callbacks due, and a
    callback from a step stopped mid-collective is dropped at the next step's reset."""

    def wrap(self, model: nn.Module) -> nn.Module:
        from torch.distributed.fsdp import fully_shard
        self.world_size = dist.get_world_size()
        self.n_params = sum(p.numel() for p in model.parameters())
        self.n_tensors = sum(1 for _ in model.parameters())
        reshard = bool(self.cfg.reshard_after_forward)
        wire.WIRE.clock = self.clock
        comms, timed = CustomCollectives("fsdp", self.world_size), True
        for block in model.children():
            if any(True for _ in block.parameters()):
                fully_shard(block, reshard_after_forward=reshard)
                # instrument=False keeps FSDP's own collectives: the baseline for timing overhead
                timed &= self.cfg.instrument and install_fsdp_comms(block, comms)
        fully_shard(model, reshard_after_forward=reshard)
        self.last_step: dict[str, Any] = {}  # the last timed step's wire report
        # fully_shard replaced every parameter by a DTensor: the optimizer must see the new ones.
        self.params = [p for p in model.parameters() if p.requires_grad]
        self.gathered_after_forward_bytes = 0
        model.register_forward_hook(self._after_forward)
        self.notes.append(
            f"fsdp (FSDP2 fully_shard, reshard_after_forward={reshard}): " +
            ("all-gathers and reduce-scatters timed and counted through FSDP2's set_custom_all_gather/"
             "set_custom_reduce_scatter" if timed else
             "all-gathers and reduce-scatters run inside forward/backward, not timed (no custom comm API)"))
        return model

    def _after_forward(self, module: nn.Module, _in: Any, _out: Any) -> None:
        # Parameters still unsharded once forward is done are held until backward:
        # nothing with ZeRO-3 (reshard after forward), the whole model with ZeRO-2-like.
        self.gathered_after_forward_bytes = sum(
            q.numel() * q.element_size() for q in module.parameters() if not hasattr(q, "to_local"))

    def __init__(self, cfg: Any, model: nn.Module, loss_fn: Callable[..., torch.Tensor],
                 device: torch.device, clock: Any):
        # Single.__init__'s steps, except the two that read parameter storages: a DTensor has
        # no plain storage, so the activation meter and the gradient stamps (FSDP assigns
        # sharded grads after its reduce-scatter; no accumulate hook fires) are FSDP-aware here.
        self.cfg, self.device, self.clock, self.loss_fn = cfg, device, clock, loss_fn
        self.notes: list[str] = []
        self.bucket_bytes: list[int] = []
        self.base = model.to(device)
        self.model = self.wrap(self.base)
        self.opt = make_optimizer(self.params)
        self.scaler = make_scaler(cfg.precision, device.type)
        self.meter = ShardAwareMeter(self.model)

    def train_step(self, x: torch.Tensor, y: torch.Tensor, probe: Callable[[], None] | None = None) -> float:
        wire.WIRE.reset()  # a callback of a step stopped mid-collective is dropped, not added to this step
        loss = super().train_step(x, y, probe)
        step = wire.WIRE.report()  # waits for the completion callbacks due: their phases land in this step
        if probe is None:  # the untimed memory probe step's times are not a timed step's
            self.last_step = step
        return loss

    def adjust_memory(self, memory: dict[str, Any]) -> None:
        sharded_memory(memory, self.params, self.opt)
        memory["gathered_params_after_forward_mib"] = self.gathered_after_forward_bytes / MIB
        _set_prediction(memory, 3, self.n_params, self.n_tensors, self.world_size)  # every rank: a step per tensor
        memory["zero"]["note"] = (
            "at rest (after backward) FSDP holds ZeRO-3's 16/N; with reshard_after_forward=False "
            "the gathered parameters (gathered_params_after_forward_mib) live from forward to "
            "backward, as ZeRO-2 keeps full parameters")

    def comm_report(self) -> dict[str, Any]:
        s = 4 * self.n_params  # fp32 parameters and gradients
        colls = [("all_gather", s)] + ([("all_gather", s)] if self.cfg.reshard_after_forward else []) \
            + [("reduce_scatter", s)]
        out = wire_prediction(colls, self.world_size)
        measured = {k.split("/", 1)[1]: row["payload_bytes"] for k, row in self.last_step.items()
                    if k.startswith("fsdp/")}
        if any(measured.values()):
            out["measured_payload_bytes_per_step"] = measured  # counted at FSDP's collective calls
        out["note"] = ("forward all-gather, backward all-gather again only when resharded after "
                       "forward (ZeRO-3: 3(N-1)/N*S, 1.5x DDP), gradient reduce-scatter")
        return out
