"""The pipeline bubble, measured, predicted, and what the difference is made of (pure Python).

measured = 1 - sum_r busy_r / (p x span), span = the *global* fwd/bwd window of the step
(first start on any stage to last end on any stage, on the common clock). This is the quantity
GPipe's formula (p-1)/(m+p-1) predicts (Huang et al. 2018), which assumes equal stages and free
communication. The difference is split, per step, into:

With v virtual stages per rank (interleaved 1F1B) the formula is (p-1)/(v m + p-1) and a slot
is one chunk op: read m as v m below.

- imbalance: the formula with the measured stages. An ideal pipeline (no overhead) of stage
  busy times b_r, each micro-batch costing b_r/m on stage r, spans (sum_r b_r + (m-1) b_max)/m:
  the first micro-batch passes every stage once, the other m-1 follow at the slowest stage's
  pace. Its bubble is 1 - sum(b) / (p x that span); imbalance = that - formula (>= 0, and 0
  for equal stages, where the span is b (m+p-1)/m and the bubble is the formula).
- overhead: the rest, measured - (formula + imbalance): time per micro-batch slot that no stage
  spends computing (send/recv, Python between ops). Reported also in ms per slot:
  (span - ideal span) / (m+p-1). (Charging every stage b_max per slot, b_max (m+p-1)/m, would
  overstate the ideal span of unequal stages and report a negative overhead.)

Means over the timed steps (the record's bubble_pct is the same mean), and the quietest step's
parts beside them.
"""
from __future__ import annotations

from statistics import fmean
from typing import Any

__all__ = ["predicted_bubble", "bubble_report", "explain", "split_min_max"]


def predicted_bubble(stages: int, micro_batches: int, virtual: int = 1) -> float:
    """(p-1)/(v m + p-1): GPipe's with v = 1; with v virtual stages (chunks) per rank each slot
    of filling and draining is 1/v as long (Narayanan et al. 2021, arXiv:2104.04473, sec. 2.2.2,
    whose (p-1)/(v m) is the same bubble relative to the compute time)."""
    return (stages - 1) / (virtual * micro_batches + stages - 1)


def _parts(b: list[float], s: float, m: int, v: int) -> dict[str, float]:
    """One step; with v chunks per rank a slot is one chunk op, v m of them per rank."""
    p, n = len(b), v * m
    slots = n + p - 1
    ideal_span = (sum(b) + (n - 1) * max(b)) / n
    balanced = 1 - sum(b) / (p * ideal_span)
    measured = 1 - sum(b) / (p * s)
    return {"measured": measured, "imbalance": balanced - predicted_bubble(p, m, v), "overhead": measured - balanced,
            "overhead_ms_per_slot": (s - ideal_span) / slots, "span_ms": s}


def bubble_report(busy_ms: list[list[float]], span_ms: list[float], micro_batches: int,
                  virtual: int = 1) -> dict[str, Any]:
    """busy_ms[step][stage], span_ms[step]: the bubble and its parts as fractions (0..1), the
    mean over steps, plus the quietest step (shortest span: on a shared machine descheduling
    only adds time, so that step shows the schedule with the least noise). `virtual`: chunks
    per rank (interleaved 1F1B); busy_ms is then each rank's total over its chunks."""
    rows = [(b, s) for b, s in zip(busy_ms, span_ms) if s > 0 and b and max(b) > 0]
    if not rows:
        return {}
    p, m, v = len(rows[0][0]), micro_batches, virtual
    per = [_parts(b, s, m, v) for b, s in rows]
    mean = {k: fmean(x[k] for x in per) for k in per[0]}
    return {"stages": p, "micro_batches": m, "virtual_stages": v, "formula": predicted_bubble(p, m, v),
            "formula_text": "(p-1)/(m+p-1)" if v == 1 else "(p-1)/(v*m+p-1)", **mean,
            "stage_busy_ms": [fmean(col) for col in zip(*(b for b, _ in rows))],
            "quietest_step": min(per, key=lambda x: x["span_ms"])}


def explain(rep: dict[str, Any]) -> str:
    """One line for the record's notes."""
    if not rep:
        return "bubble: no timed steps"
    pct = lambda x: f"{100 * x:.0f}%"  # noqa: E731
    return (f"bubble measured {pct(rep['measured'])} = formula {rep.get('formula_text', '(p-1)/(m+p-1)')} "
            f"{pct(rep['formula'])} "
            f"+ stage imbalance {pct(rep['imbalance'])} (stage busy ms "
            f"{', '.join(f'{b:.1f}' for b in rep['stage_busy_ms'])}) + per-micro-batch overhead "
            f"{pct(rep['overhead'])} ({rep['overhead_ms_per_slot']:.2f} ms per slot: send/recv, Python, "
            f"descheduling); quietest step {pct(rep['quietest_step']['measured'])} "
            f"(overhead {rep['quietest_step']['overhead_ms_per_slot']:.2f} ms per slot)")


def split_min_max(costs: list[float], n: int) -> list[list[int]]:
    """Cut blocks of the given costs into n contiguous stages minimising the largest stage's cost (the
    pipeline runs at its slowest stage's pace): block indices per stage. The kit's pipeline strategies split
    this way (measure/workloads.split_stages) and the time model predicts the same split
    (theory/local_time.mlp_pipeline_bubble)."""
    k = len(costs)
    if not 1 <= n <= k:
        raise ValueError(f"cannot split {k} blocks into {n} stages; use between 1 and {k} stages")
    pre = [0.0]
    for c in costs:
        pre.append(pre[-1] + c)
    inf = float("inf")
    # best[j][i]: smallest max-stage cost putting blocks [0, i) into j stages; cut[j][i]: last cut.
    best = [[inf] * (k + 1) for _ in range(n + 1)]
    cut = [[0] * (k + 1) for _ in range(n + 1)]
    best[0][0] = 0.0
    for j in range(1, n + 1):
        for i in range(j, k - (n - j) + 1):
            for c in range(j - 1, i):
                v = max(best[j - 1][c], pre[i] - pre[c])
                if v < best[j][i]:
                    best[j][i], cut[j][i] = v, c
    stages, i = [], k
    for j in range(n, 0, -1):
        c = cut[j][i]
        stages.append(list(range(c, i)))
        i = c
    return stages[::-1]
