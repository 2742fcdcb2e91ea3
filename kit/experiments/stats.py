"""Statistics for run records: per-phase spread, repeats, paired ratios, bootstrap, verdicts.

Pure Python (no torch, no numpy): the kernel imports this. Every function takes plain lists
or record dicts, so the tests check the arithmetic with synthetic numbers and no ranks.

Why medians: a step time distribution on a shared machine has a long right tail (a context
switch, a GC pause, another process's burst); one such step moves a mean by several percent
but leaves the median where it was.
"""
from __future__ import annotations

import math
import random
from statistics import median
from typing import Any, Callable, Iterable, Mapping, Sequence

__all__ = ["quantile", "spread", "per_step_values", "phase_spread", "repeat_spread",
           "bootstrap_ci", "median_order_ci", "ratio_ci", "verdict", "interleave", "min_pairs", "range_level",
           "PHASES", "CPU_PHASES", "SPREAD_KEYS", "VERDICTS"]

# Per-step quantities a record summarises; the first seven are the per-rank timer fields.
PHASES: tuple[str, ...] = ("step_ms", "fwd_ms", "bwd_ms", "opt_ms", "comm_ms",
                           "comm_overlap_ms", "comm_exposed_ms")
# Timed where a strategy's steps carry it (timing.StepClock's rows): the optimizer phase's CPU time.
CPU_PHASES: tuple[str, ...] = ("opt_cpu_ms",)
SPREAD_KEYS: tuple[str, ...] = PHASES + CPU_PHASES + ("comm_overhead_pct", "throughput_samples_s")
VERDICTS: tuple[str, ...] = ("faster", "slower", "same within noise")


def quantile(xs: Sequence[float], q: float) -> float:
    """The q-quantile (0..1) with linear interpolation between order statistics (numpy's
    default, "type 7"), so the numbers match what a learner gets from numpy.percentile."""
    if not xs:
        raise ValueError("quantile of an empty list")
    s = sorted(xs)
    pos = (len(s) - 1) * q
    lo = math.floor(pos)
    hi = min(lo + 1, len(s) - 1)
    return s[lo] + (s[hi] - s[lo]) * (pos - lo)


def spread(xs: Iterable[float]) -> dict[str, float] | None:
    """median, quartiles, IQR, min, max and n of the finite values; None when there are none."""
    vals = [float(x) for x in xs if x is not None and math.isfinite(float(x))]
    if not vals:
        return None
    q1, q3 = quantile(vals, 0.25), quantile(vals, 0.75)
    return {"median": median(vals), "q1": q1, "q3": q3, "iqr": q3 - q1,
            "min": min(vals), "max": max(vals), "n": len(vals)}


def per_step_values(steps: Sequence[Mapping[str, Any]], samples_per_step: float) -> dict[str, list[float]]:
    """One value per (repeat, step) for each of SPREAD_KEYS, combining the ranks' rows.

    A step is as long as its slowest rank (the ranks wait for each other at the all-reduce),
    so step_ms is the max over ranks; the phases are the rank mean, as in the record's means.
    """
    by_step: dict[tuple[int, int], list[Mapping[str, Any]]] = {}
    for r in steps:
        by_step.setdefault((int(r.get("repeat", 0)), int(r["step"])), []).append(r)
    out: dict[str, list[float]] = {k: [] for k in SPREAD_KEYS}
    for key in sorted(by_step):
        rows = by_step[key]
        step_ms = max(float(r["step_ms"]) for r in rows)
        out["step_ms"].append(step_ms)
        for k in PHASES[1:]:
            vals = [float(r[k]) for r in rows if r.get(k) is not None]
            out[k].append(sum(vals) / len(vals) if vals else 0.0)
        for k in CPU_PHASES:  # absent from records made before it was timed: no spread, not zeros
            vals = [float(r[k]) for r in rows if r.get(k) is not None]
            if vals:
                out[k].append(sum(vals) / len(vals))
        exposed = out["comm_exposed_ms"][-1]
        out["comm_overhead_pct"].append(100.0 * exposed / step_ms if step_ms > 0 else 0.0)
        out["throughput_samples_s"].append(samples_per_step * 1e3 / step_ms if step_ms > 0 else 0.0)
    return out


def phase_spread(steps: Sequence[Mapping[str, Any]], samples_per_step: float) -> dict[str, dict[str, float]]:
    """{quantity: spread over the measured steps} for a record's step rows."""
    vals = per_step_values(steps, samples_per_step)
    return {k: s for k, v in vals.items() if (s := spread(v)) is not None}


def repeat_spread(repeat_spreads: Sequence[Mapping[str, Mapping[str, float]]]) -> dict[str, dict[str, float]]:
    """Spread *across repeats* of each repeat's median: the run-to-run noise a comparison faces
    (step-to-step noise within one run understates it: a whole run can land on a busy spell)."""
    keys = {k for s in repeat_spreads for k in s}
    out = {}
    for k in sorted(keys):
        s = spread(sp[k]["median"] for sp in repeat_spreads if k in sp)
        if s is not None:
            out[k] = s
    return out


def bootstrap_ci(values: Sequence[float], stat: Callable[[Sequence[float]], float] = median,
                 level: float = 0.95, n_boot: int = 4000, seed: int = 0) -> tuple[float, float]:
    """Percentile bootstrap interval of `stat` over `values` (resampled with replacement).

    Seeded with its own `random.Random(seed)`, so the same pairs give the same interval every
    time (a lesson's printed line does not change on re-run) and global random state is untouched.
    """
    if not values:
        raise ValueError("bootstrap of no values")
    if len(values) == 1:
        return float(values[0]), float(values[0])
    rng = random.Random(seed)
    n = len(values)
    boots = sorted(stat([values[rng.randrange(n)] for _ in range(n)]) for _ in range(n_boot))
    alpha = (1.0 - level) / 2.0
    return quantile(boots, alpha), quantile(boots, 1.0 - alpha)


def median_order_ci(values: Sequence[float], level: float = 0.95) -> tuple[float, float]:
    """Distribution-free interval for the median: order statistics [x_(k), x_(n-k+1)] with
    k the largest index whose binomial tail P(Binom(n, 1/2) < k) stays within (1-level)/2.
    Below 6 values no k reaches 95%; the range (k = 1) is the widest there is (5 values: 93.75%)."""
    s = sorted(values)
    n = len(s)
    k, tail = 1, 0.0
    for i in range(n // 2):
        tail += math.comb(n, i) / 2.0 ** n  # P(Binom(n, 1/2) <= i): all but i pairs on one side
        if tail > (1.0 - level) / 2.0:
            break
        k = i + 1
    return s[k - 1], s[n - k]


def range_level(n: int) -> float:
    """How often the range of n paired ratios holds their true median: 1 - 2/2^n (sign test; any
    distribution). 2 pairs: 50%, 3: 75%, 5: 93.75%, 6: 96.9%."""
    return 1.0 - 2.0 / 2.0 ** n if n > 0 else 0.0


def min_pairs(level: float = 0.95) -> int:
    """The fewest pairs whose interval can reach `level` (6 at 95%): with fewer, even the widest interval,
    the range, holds the median less often than that, so no ordering can be claimed at that level."""
    n = 1
    while range_level(n) < level:
        n += 1
    return n


def ratio_ci(values: Sequence[float], level: float = 0.95, seed: int = 0) -> tuple[float, float]:
    """The interval a verdict uses: the seeded percentile bootstrap of the median, widened to
    the order-statistic interval where that is wider.

    Why widen: with 6-9 pairs the percentile bootstrap of a median covers less than it claims
    (simulated with identical configs and heavy noise: 8% false alarms at 6 pairs, 14% at 7,
    against 5% promised); the order-statistic interval is exact for any distribution. With 5
    pairs both are the range of the ratios.
    """
    b_lo, b_hi = bootstrap_ci(values, level=level, seed=seed)
    o_lo, o_hi = median_order_ci(values, level)
    return min(b_lo, o_lo), max(b_hi, o_hi)


def verdict(ratio: float, ci_low: float, ci_high: float, min_effect: float = 0.02) -> str:
    """"slower" / "faster" only when the interval excludes 1 *and* the effect is at least
    `min_effect` (fractional, 0.02 = 2%); otherwise "same within noise".

    The second condition keeps a real but trivial difference (a 0.5% shift that a long, quiet
    run can resolve) from being announced as an ordering a learner would not see again on
    another machine, and it halves the false-alarm rate when the interval is as wide as the
    pairs (small n): a null comparison must then also land its median pair beyond 2%.
    """
    if ci_low > 1.0 and ratio > 1.0 + min_effect:
        return "slower"
    if ci_high < 1.0 and ratio < 1.0 - min_effect:
        return "faster"
    return "same within noise"


def interleave(n_configs: int, repeats: int) -> list[int]:
    """Run order for `repeats` rounds of `n_configs` configurations: every round runs each
    configuration once, and the order is rotated each round (two configs: A B, B A, A B, ...).

    Why: machine load drifts (another process starts, the CPU heats and clocks down). Run all
    of A then all of B and the drift lands on one side as a fake difference; interleaved, each
    round sees the same conditions, and rotating who goes first cancels a first/second effect.
    """
    order: list[int] = []
    for r in range(repeats):
        k = r % n_configs
        order += list(range(k, n_configs)) + list(range(k))
    return order
