"""Model parallel (naive): the layers are cut into world_size stages, one per rank.

Forward: rank r receives rank r-1's activation, runs its stage, sends the result to r+1; the
last rank computes the loss. Backward runs the chain in reverse, each rank sending the gradient
of its input back. Only one rank computes at a time: with p stages each is idle (p-1)/p of
the step. That idle time is what pipeline parallel (pipeline.py) recovers with micro-batches.

Stages are cut to balance measured per-block cost (rank 0 times each block's forward+backward
on a micro-batch and broadcasts it), so the slowest stage is as fast as contiguous cuts allow.

Point-to-point uses isend (waited at the end of the step) and blocking recv: gloo supports
both on CPU, and a non-blocking send cannot deadlock when neighbours send to each other.
"""
from __future__ import annotations

import copy
from typing import Any, Callable

import torch
import torch.distributed as dist
from torch import nn

import kit.experiments.parallel.wire as wire
from kit.experiments.strategies.common import autocast, make_optimizer
from kit.experiments.measure.memory import ActivationMeter
from kit.experiments.measure.timing import StepClock
from kit.experiments.measure.workloads import block_costs_ms, sample_input, split_stages
from kit.experiments.strategies.base import StageTable, Strategy

__all__ = ["ModelParallel"]


class ModelParallel(Strategy):
    """One stage per rank; activations and their gradients travel by send/recv."""

    micro_batches = 1  # the whole batch goes through the stages at once (a pipeline sets its own count first)

    def __init__(self, cfg: Any, model: nn.Sequential, loss_fn: Callable[..., torch.Tensor],
                 device: torch.device, clock: StepClock, pp_group: Any = None):
        self.cfg, self.device, self.clock, self.loss_fn = cfg, device, clock, loss_fn
        self.pp_group = pp_group  # the stages' process group: None, the world; on a mesh, its pp dimension
        self.rank, self.world = dist.get_rank(self.pp_group), dist.get_world_size(self.pp_group)  # stage, stages
        costs = self._costs(model)
        # v chunks per rank (interleaved pipeline; 1 otherwise): chunk c of rank r is stage c*p + r
        self.virtual = getattr(cfg, "virtual_stages", 1)
        self.n_stages = self.world * self.virtual
        self.blocks = split_stages(model, self.n_stages, costs)
        self.full = model  # kept (CPU, untouched) only to learn activation shapes by a dry run
        self.my_stages = [c * self.world + self.rank for c in range(self.virtual)]
        self.chunks = [nn.Sequential(*[model[i] for i in self.blocks[s]]).to(device) for s in self.my_stages]
        self.params = [p for c in self.chunks for p in c.parameters() if p.requires_grad]
        self.opt = make_optimizer(self.params)
        self.meter = ActivationMeter(self.params)
        basis = ("measured fwd+bwd ms per block " + ", ".join(f"{c:.2f}" for c in costs)) if costs \
            else "parameter counts"
        self.notes = [f"stages (block indices per {'stage' if self.virtual > 1 else 'rank'}): {self.blocks}, "
                      f"cut on {basis}" + (f"; rank r holds stages r, r+{self.world}, ..." if self.virtual > 1 else "")]
        if cfg.precision == "fp16":
            self.notes.append("fp16 without loss scaling in model/pipeline parallel (the scaler is not "
                              "split across stages here); prefer bf16")
        self.bucket_bytes: list[int] = []
        self.p2p_bytes = 0
        self.busy_ms: list[float] = []
        self.windows: list[tuple[float, float]] = []  # (first start, last end) of fwd/bwd, per step
        self.offset_ms = 0.0  # this clock minus rank 0's (clocks.py), for the global span
        self._shapes: dict[int, torch.Size] = {}
        self._sends: list[Any] = []
        clock.watch_grads(self.params)

    def extra_grad_bytes(self) -> int:
        return 0

    def _costs(self, model: nn.Sequential) -> list[float] | None:
        """Per-block fwd+bwd ms measured on rank 0 and broadcast (every rank must cut the same
        way); None (parameter counts) when the measurement is not possible."""
        mb = max(1, self.cfg.batch_size // self.micro_batches)  # a block's cost on one micro-batch
        t = torch.zeros(len(model), dtype=torch.float64)
        if self.rank == 0:
            try:
                # time on the device the stages will run on (a copy: the model itself stays on CPU)
                probe = copy.deepcopy(model).to(self.device)
                x = sample_input(self.cfg.workload, mb).to(self.device)
                t = torch.tensor(block_costs_ms(probe, x), dtype=torch.float64)
                del probe
            except Exception:  # an unusual block: fall back to parameter counts on every rank
                t = torch.full((len(model),), -1.0, dtype=torch.float64)
        buf = t.to(self.device)
        dist.broadcast(buf, src=0)
        t = buf.cpu()
        return None if float(t[0]) < 0 else [float(v) for v in t]

    # -- point to point -------------------------------------------------------------------------
    def in_shape(self, x: torch.Tensor, chunk: int = 0) -> torch.Size:
        """Shape of a chunk's input for a micro-batch like `x` (dry run of the earlier blocks)."""
        key = (x.shape[0], chunk)
        if key not in self._shapes:
            with torch.no_grad():
                h = x[:1]
                for i in range(self.blocks[self.my_stages[chunk]][0]):
                    h = self.full[i](h)
            self._shapes[key] = torch.Size([x.shape[0], *h.shape[1:]])
        return self._shapes[key]

    def send(self, t: torch.Tensor, dst: int, tag: int = 0) -> None:
        """To stage rank `dst`. On a mesh's pp dimension that is a rank of the pp group, mapped to its global
        rank, and the message is counted and timed under "pp/send" (wire.py) beside the mesh's other dimensions."""
        if self.pp_group is None:
            with self.clock.phase(f"send to {dst}", "comm"):
                t = t.detach().float().contiguous()
                self._sends.append((dist.isend(t, dst, tag=tag), t))  # keep t alive until the send completes
        else:
            t = t.detach().float().contiguous()
            self._sends.append((wire.isend(t, dist.get_global_rank(self.pp_group, dst), self.pp_group, "pp", tag), t))
        self.p2p_bytes += t.numel() * t.element_size()

    def recv(self, shape: torch.Size, src: int, tag: int = 0) -> torch.Tensor:
        buf = torch.empty(shape, device=self.device)
        if self.pp_group is None:
            with self.clock.phase(f"recv from {src}", "idle"):  # mostly waiting for the neighbour (bubble)
                dist.recv(buf, src, tag=tag)
        else:
            with self.clock.phase("pp recv", "idle"):  # waiting for the neighbour stage (the bubble)
                dist.recv(buf, dist.get_global_rank(self.pp_group, src), group=self.pp_group, tag=tag)
        return buf

    def finish_sends(self) -> None:
        for work, _ in self._sends:
            work.wait()
        self._sends = []

    # -- one micro-batch -----------------------------------------------------------------------
    def _ends(self, chunk: int) -> tuple[bool, bool]:
        """(first stage of the model, last stage) for this rank's chunk."""
        s = self.my_stages[chunk]
        return s == 0, s == self.n_stages - 1

    def forward(self, x: torch.Tensor, y: torch.Tensor, scale: float, meter: bool = False,
                chunk: int = 0) -> tuple[Any, Any, float]:
        """Returns (input needing grad or None, output or loss, loss value). Activations travel
        on tag 0, gradients on tag 1 (with v > 1 and p = 2, rank 1 sends rank 0 both)."""
        first, last = self._ends(chunk)
        if first:
            inp = x.to(self.device)
        else:
            inp = self.recv(self.in_shape(x, chunk), (self.rank - 1) % self.world, tag=0).requires_grad_()
        stage = self.chunks[chunk]
        with self.clock.phase("forward"), autocast(self.cfg.precision, self.device.type):
            if meter:
                with self.meter.record():
                    out = stage(inp)
                    out = self.loss_fn(out, y.to(self.device)) * scale if last else out.float()
            else:
                out = stage(inp)
                out = self.loss_fn(out, y.to(self.device)) * scale if last else out.float()
        if not last:
            self.send(out, (self.rank + 1) % self.world, tag=0)
            return (None if first else inp), out, 0.0
        return (None if first else inp), out, out.item()

    def backward(self, inp: torch.Tensor | None, out: torch.Tensor, chunk: int = 0) -> None:
        _, last = self._ends(chunk)
        grad = None if last else self.recv(out.shape, (self.rank + 1) % self.world, tag=1)
        with self.clock.phase("backward"):
            torch.autograd.backward(out, grad)
        if inp is not None:
            self.send(inp.grad, (self.rank - 1) % self.world, tag=1)

    # -- the step ------------------------------------------------------------------------------------
    def train_step(self, x: torch.Tensor, y: torch.Tensor, probe: Callable[[], None] | None = None) -> float:
        self.p2p_bytes = 0
        inp, out, loss = self.forward(x, y, 1.0, meter=probe is not None)
        self.backward(inp, out)
        self.finish_sends()
        return self._optimizer_step(loss, probe)

    def _optimizer_step(self, loss: float, probe: Callable[[], None] | None) -> float:
        if probe:
            probe()
        with self.clock.phase("optimizer"):
            self.opt.step()
            self.opt.zero_grad(set_to_none=True)
        return loss

    # -- the bubble ----------------------------------------------------------------------------------
    def after_step(self) -> None:
        """After clock.end(): this step's compute (busy) and its fwd/bwd window, resolved ms.

        The window is first compute start to last compute end: a stage that begins the step
        early waits in recv for the previous step's optimizer on its neighbour (skew between
        steps), which is not the schedule's bubble the formula predicts."""
        ev = [(s, e) for n, _, s, e in self.clock.events if n in ("forward", "backward")]
        if self.clock.enabled and ev:
            self.busy_ms.append(sum(e - s for n, _, s, e in self.clock.events if n in ("forward", "backward")))
            # on rank 0's clock, so every stage's window is on one axis
            self.windows.append((min(s for s, _ in ev) - self.offset_ms, max(e for _, e in ev) - self.offset_ms))

    def stage_table(self, lo: int, hi: int) -> StageTable:
        """Collective: busy ms of every stage and the *global* span (first start of any stage to
        last end of any stage) of steps [lo, hi). The bubble is 1 - sum busy / (p x span)."""
        if not self.clock.enabled:  # the same on every rank: no collective, no table
            return StageTable([], [], self.rank, self.p2p_bytes, self.micro_batches, self.virtual)
        n = max(0, min(hi, len(self.busy_ms)) - lo)
        mine = torch.tensor([[b, s, e] for b, (s, e) in zip(self.busy_ms[lo:lo + n], self.windows[lo:lo + n])],
                            dtype=torch.float64).reshape(n, 3).to(self.device)
        every = [torch.zeros_like(mine) for _ in range(self.world)]
        dist.all_gather(every, mine, group=self.pp_group)
        busy = [[float(t[i, 0]) for t in every] for i in range(n)]
        span = [max(float(t[i, 2]) for t in every) - min(float(t[i, 1]) for t in every) for i in range(n)]
        return StageTable(busy, span, self.rank, self.p2p_bytes, self.micro_batches, self.virtual)
