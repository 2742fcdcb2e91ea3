"""Reading a run record (the plots, the lab bench, bucket_report): its summary filled in from the step
rows, the spread of one field, medians in place of means, whether it ran to the end. kit.run/1 records
read alike (records.py writes them; docs/measuring.md has the schema).

Pure Python (no torch): the kernel imports this.
"""
from __future__ import annotations

from statistics import fmean
from typing import Any, Mapping

from kit.experiments.stats import PHASES

__all__ = ["run_summary", "run_spread", "run_center", "is_complete", "phases_timed", "NOT_TIMED"]

# How a run with ExperimentConfig(instrument=False) is said wherever its phases would show: only whole
# steps were timed there (StepClock is off), so its forward, backward, optimizer and comm read as 0.0
# in the record and are not measurements.
NOT_TIMED = "phases not timed: instrument=False times whole steps only"


def run_summary(record: Mapping[str, Any]) -> dict[str, float]:
    """The record's `summary`, filled in from per-step rows where a field is missing.

    Means are over every step row present (records keep only measured, post-warm-up steps).
    """
    out: dict[str, float] = {k: v for k, v in (record.get("summary") or {}).items()
                             if isinstance(v, (int, float))}
    steps = record.get("steps") or []
    for key in PHASES:
        if key not in out:
            vals = [float(s[key]) for s in steps if s.get(key) is not None]
            out[key] = fmean(vals) if vals else 0.0
    if "throughput_samples_s" not in out:
        step_ms = out.get("step_ms") or 0.0
        samples = [s.get("samples", 0) for s in steps if s.get("rank", 0) == 0]
        per_step = fmean(samples) if samples else 0.0
        ranks = {s.get("rank", 0) for s in steps} or {0}
        out["throughput_samples_s"] = (per_step * len(ranks) * 1e3 / step_ms) if step_ms else 0.0
    if "comm_overhead_pct" not in out:
        step_ms = out.get("step_ms") or 0.0
        out["comm_overhead_pct"] = 100.0 * out["comm_exposed_ms"] / step_ms if step_ms else 0.0
    return out


def run_spread(record: Mapping[str, Any], key: str) -> tuple[float, float, float, str] | None:
    """(median, whisker low, whisker high, "repeats" or "steps") for `key`, or None (kit.run/1).

    A record of several repeats: the median and min-max of the repeats' medians (the
    run-to-run noise, what decides whether two runs differ; IQR of 3-5 values means little).
    One run: the median and IQR of its measured steps.
    """
    rs = (record.get("repeat_spread") or {}).get(key)
    if rs and int(rs.get("n", 0)) > 1:
        return float(rs["median"]), float(rs["min"]), float(rs["max"]), "repeats"
    st = (record.get("spread") or {}).get(key)
    if st:
        return float(st["median"]), float(st["q1"]), float(st["q3"]), "steps"
    return None


def run_center(record: Mapping[str, Any]) -> dict[str, float]:
    """run_summary with medians in place of means wherever the record has a spread."""
    out = run_summary(record)
    for key in list(out):
        sp = run_spread(record, key)
        if sp is not None:
            out[key] = sp[0]
    return out


def phases_timed(record: Mapping[str, Any]) -> bool:
    """False for a run made with instrument=False: its phase fields (fwd_ms ... comm_exposed_ms,
    comm_overhead_pct, opt_cpu_ms) are zeros, not measurements; its step time is measured."""
    return (record.get("config") or {}).get("instrument", True) is not False


def is_complete(record: Mapping[str, Any]) -> bool:
    """False for a run stopped mid-way (kit.run/2 `complete`); older records count as complete."""
    return record.get("complete", True) is not False
