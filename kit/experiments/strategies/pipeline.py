"""Pipeline parallel: model-parallel stages fed with micro-batches, GPipe or 1F1B order.

With p stages and m micro-batches a stage idles (p-1) slots of the m+p-1 in a step:
bubble = (p-1)/(m+p-1) (GPipe, Huang et al. 2018, arXiv:1811.06965). 1F1B has the same bubble
but starts backward early, so a stage holds at most p micro-batches' activations instead of m.
The bubble is measured as 1 - sum of stage busy time / (p x global span) on the common clock and
reported beside the formula, with the difference split into stage imbalance and per-micro-batch
overhead (bubble.py).
"""
from __future__ import annotations

from typing import Any, Callable

import torch

from kit.experiments.theory.bubble import predicted_bubble
from kit.experiments.strategies.common import chunks
from kit.experiments.strategies.model_parallel import ModelParallel

__all__ = ["Pipeline", "schedule", "predicted_bubble"]


def schedule(kind: str, rank: int, stages: int, micro_batches: int) -> list[tuple[str, int]]:
    """The order of ("F", i) forward and ("B", i) backward ops for one stage."""
    m = micro_batches
    if kind == "gpipe":  # all forwards, then all backwards
        return [("F", i) for i in range(m)] + [("B", i) for i in range(m)]
    # 1F1B: warm up with enough forwards to fill the pipe below us, then alternate, then drain.
    warm = min(stages - rank - 1, m)
    ops = [("F", i) for i in range(warm)]
    for i in range(m - warm):
        ops += [("F", warm + i), ("B", i)]
    return ops + [("B", i) for i in range(m - warm, m)]


class Pipeline(ModelParallel):
    """The same stages as ModelParallel; the step runs the micro-batches in schedule order."""

    def __init__(self, *a: Any, **kw: Any):
        super().__init__(*a, **kw)
        m, p = self.cfg.micro_batches, self.world
        self.ops = schedule(self.cfg.schedule, self.rank, p, m)
        self.notes.append(f"{self.cfg.schedule}: p={p} stages, m={m} micro-batches, "
                          f"predicted bubble (p-1)/(m+p-1) = {100 * predicted_bubble(p, m):.0f}%")
        self.inflight_peak_mib: float | None = None

    def train_step(self, x: torch.Tensor, y: torch.Tensor, probe: Callable[[], None] | None = None) -> float:
        self.p2p_bytes = 0
        micro = chunks(x, y, self.cfg.micro_batches)
        if probe:  # memory step (untimed): each micro-batch its own input, as after a copy to the
            # device; a view would make the meter count the whole batch's storage once per micro-batch
            micro = [(xm.clone(), ym) for xm, ym in micro]
        scale = 1.0 / len(micro)  # mean of micro-batch means = the global-batch mean
        held: dict[int, tuple[Any, Any]] = {}
        mb_bytes: dict[int, int] = {}
        live = peak = 0
        loss = 0.0
        for op, i in self.ops:
            if op == "F":
                inp, out, l = self.forward(*micro[i], scale, meter=probe is not None)
                held[i] = (inp, out)
                loss += l
                if probe:  # activations alive at once: what 1F1B saves over GPipe
                    mb_bytes[i] = self.meter.bytes
                    live += mb_bytes[i]
                    peak = max(peak, live)
            else:
                self.backward(*held.pop(i))  # frees micro-batch i's saved activations
                live -= mb_bytes.get(i, 0)
        self.finish_sends()
        if probe:
            self.meter.bytes = peak
        return self._optimizer_step(loss, probe)
