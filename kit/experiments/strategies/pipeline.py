"""Pipeline parallel: model-parallel stages fed with micro-batches, GPipe, 1F1B or interleaved 1F1B.

With p stages and m micro-batches a stage idles (p-1) slots of the m+p-1 in a step:
bubble = (p-1)/(m+p-1) (GPipe, Huang et al. 2018, arXiv:1811.06965). 1F1B has the same bubble
but starts backward early, so a stage holds at most p micro-batches' activations instead of m.
Interleaved 1F1B (Narayanan et al., SC 2021, arXiv:2104.04473) gives each rank v chunks (stages
r, r+p, ...): the slots of filling and draining are 1/v as long, bubble (p-1)/(v m + p-1), for v
times more messages. The schedules are lists of operations (theory/pipeline_schedule.py, where a
simulation checks them for deadlocks). The bubble is measured as 1 - sum of stage busy time /
(p x global span) on the common clock and reported beside the formula, with the difference split
into stage imbalance and per-micro-batch overhead (bubble.py).
"""
from __future__ import annotations

from typing import Any, Callable

import torch

from kit.experiments.theory.bubble import predicted_bubble
from kit.experiments.theory.pipeline_schedule import schedule
from kit.experiments.strategies.common import chunks
from kit.experiments.strategies.model_parallel import ModelParallel

__all__ = ["Pipeline", "schedule", "predicted_bubble"]


class Pipeline(ModelParallel):
    """The same stages as ModelParallel (v per rank when interleaved); the step runs the
    micro-batches in schedule order."""

    def __init__(self, *a: Any, **kw: Any):
        super().__init__(*a, **kw)
        self.micro_batches = self.cfg.micro_batches
        m, p, v = self.micro_batches, self.world, self.virtual
        self.ops = schedule(self.cfg.schedule, self.rank, p, m, v)
        formula = "(p-1)/(m+p-1)" if v == 1 else "(p-1)/(v*m+p-1)"
        self.notes.append(f"{self.cfg.schedule}: p={p} stages" + (f" x v={v} chunks each" if v > 1 else "")
                          + f", m={m} micro-batches, predicted bubble {formula} = {100 * predicted_bubble(p, m, v):.0f}%")
        self.inflight_peak_mib: float | None = None

    def train_step(self, x: torch.Tensor, y: torch.Tensor, probe: Callable[[], None] | None = None) -> float:
        self.p2p_bytes = 0
        micro = chunks(x, y, self.cfg.micro_batches)
        if probe:  # memory step (untimed): each micro-batch its own input, as after a copy to the
            # device; a view would make the meter count the whole batch's storage once per micro-batch
            micro = [(xm.clone(), ym) for xm, ym in micro]
        scale = 1.0 / len(micro)  # mean of micro-batch means = the global-batch mean
        held: dict[tuple[int, int], tuple[Any, Any]] = {}
        mb_bytes: dict[tuple[int, int], int] = {}
        live = peak = 0
        loss = 0.0
        for op, c, i in self.ops:
            if op == "F":
                inp, out, l = self.forward(*micro[i], scale, meter=probe is not None, chunk=c)
                held[c, i] = (inp, out)
                loss += l
                if probe:  # activations alive at once: what 1F1B saves over GPipe
                    mb_bytes[c, i] = self.meter.bytes
                    live += mb_bytes[c, i]
                    peak = max(peak, live)
            else:
                self.backward(*held.pop((c, i)), chunk=c)  # frees its saved activations
                live -= mb_bytes.get((c, i), 0)
        self.finish_sends()
        if probe:
            self.meter.bytes = peak
        return self._optimizer_step(loss, probe)
