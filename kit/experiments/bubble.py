"""The pipeline bubble, measured, predicted, and what the difference is made of (pure Python).

measured = 1 - sum_r busy_r / (p x span), span = the *global* fwd/bwd window of the step
(first start on any stage to last end on any stage, on the common clock). This is the quantity
GPipe's formula (p-1)/(m+p-1) predicts (Huang et al. 2018), which assumes equal stages and free
communication. The difference is split, per step, into:

- imbalance: the formula with the measured stages. The slowest stage sets the pace: an ideal
  pipeline (no overhead) of stage busy times b_r spans b_max (m+p-1)/m, so its bubble is
  1 - mean(b) / b_max x m/(m+p-1). imbalance = that - formula.
- overhead: the rest, measured - (formula + imbalance): time per micro-batch slot that no stage
  spends computing (send/recv, Python between ops). Reported also in ms per slot:
  (span - b_max (m+p-1)/m) / (m+p-1).
"""
from __future__ import annotations

from statistics import fmean
from typing import Any

__all__ = ["predicted_bubble", "bubble_report", "explain"]


def predicted_bubble(stages: int, micro_batches: int) -> float:
    return (stages - 1) / (micro_batches + stages - 1)


def bubble_report(busy_ms: list[list[float]], span_ms: list[float], micro_batches: int) -> dict[str, Any]:
    """busy_ms[step][stage], span_ms[step]: the bubble and its parts as fractions (0..1)."""
    rows = [(b, s) for b, s in zip(busy_ms, span_ms) if s > 0 and b and max(b) > 0]
    if not rows:
        return {}
    p, m = len(rows[0][0]), micro_batches
    slots = m + p - 1
    formula = predicted_bubble(p, m)
    measured = fmean(1 - sum(b) / (p * s) for b, s in rows)
    balanced = fmean(1 - fmean(b) / max(b) * m / slots for b, _ in rows)
    per_slot = fmean((s - max(b) * slots / m) / slots for b, s in rows)
    return {"stages": p, "micro_batches": m, "measured": measured, "formula": formula,
            "imbalance": balanced - formula, "overhead": measured - balanced,
            "overhead_ms_per_slot": per_slot, "stage_busy_ms": [fmean(col) for col in zip(*(b for b, _ in rows))],
            "span_ms": fmean(s for _, s in rows)}


def explain(rep: dict[str, Any]) -> str:
    """One line for the record's notes."""
    if not rep:
        return "bubble: no timed steps"
    pct = lambda x: f"{100 * x:.0f}%"  # noqa: E731
    return (f"bubble measured {pct(rep['measured'])} = formula (p-1)/(m+p-1) {pct(rep['formula'])} "
            f"+ stage imbalance {pct(rep['imbalance'])} (stage busy ms "
            f"{', '.join(f'{b:.1f}' for b in rep['stage_busy_ms'])}) + per-micro-batch overhead "
            f"{pct(rep['overhead'])} ({rep['overhead_ms_per_slot']:.2f} ms per slot: send/recv, Python)")
