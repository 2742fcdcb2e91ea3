"""`strategy="single"`, the run loop's one-process baseline: one model, one optimizer (Adam), one plain
training step. (The hand-written parallelisms are checked against another reference, parallel/reference.py,
which trains with SGD: its docstring says why.)

The data-parallel and staged strategies are checked against it (same loss, same gradients for the
same global batch: tests/test_strategy_matches_single_process.py). DDP and naive data parallel reuse its
loop and change only what they must.
"""
from __future__ import annotations

from contextlib import nullcontext
from typing import Any, Callable, ContextManager

import torch
from torch import nn

from kit.experiments.strategies.common import autocast, chunks, make_optimizer, make_scaler
from kit.experiments.measure.memory import ActivationMeter
from kit.experiments.measure.timing import StepClock
from kit.experiments.strategies.base import Strategy

__all__ = ["Single"]


class Single(Strategy):
    """Forward, backward, optimizer step; `grad_accum_steps` micro-batches per optimizer step."""

    def __init__(self, cfg: Any, model: nn.Module, loss_fn: Callable[..., torch.Tensor],
                 device: torch.device, clock: StepClock):
        self.cfg, self.device, self.clock, self.loss_fn = cfg, device, clock, loss_fn
        self.notes: list[str] = []
        self.bucket_bytes: list[int] = []  # set by wrap() where the strategy knows them
        self.base = model.to(device)
        self.params = [p for p in self.base.parameters() if p.requires_grad]
        self.model = self.wrap(self.base)
        self.opt = make_optimizer(self.params)
        self.scaler = make_scaler(cfg.precision, device.type)
        self.meter = ActivationMeter(self.params)
        clock.watch_grads(self.params)

    def wrap(self, model: nn.Module) -> nn.Module:
        return model

    def sync_context(self, last_micro: bool) -> ContextManager[Any]:
        """No gradient sync to skip in one process."""
        return nullcontext()

    def after_backward(self) -> None:
        """Hook for strategies that communicate after backward (naive data parallel)."""

    def train_step(self, x: torch.Tensor, y: torch.Tensor, probe: Callable[[], None] | None = None) -> float:
        x, y = x.to(self.device, non_blocking=True), y.to(self.device, non_blocking=True)
        micro = chunks(x, y, self.cfg.grad_accum_steps)
        total = 0.0
        for i, (xm, ym) in enumerate(micro):
            last = i == len(micro) - 1
            # no_sync on all but the last micro-batch: grads accumulate locally, one all-reduce.
            with self.sync_context(last):
                with self.clock.phase("forward"), autocast(self.cfg.precision, self.device.type), \
                        (self.meter.record() if probe and i == 0 else nullcontext()):
                    loss = self.loss_fn(self.model(xm), ym) / len(micro)
                with self.clock.phase("backward"):
                    self.scaler.scale(loss).backward()
            total += loss.item()
        self.after_backward()
        if probe:
            probe()  # grads and optimizer state exist here: the memory snapshot
        with self.clock.phase("optimizer"):
            self.scaler.step(self.opt)
            self.scaler.update()
            self.opt.zero_grad(set_to_none=True)
        return total
