"""What `run(cfg)` returns: the run's record (records.py builds it; docs/measuring.md has the schema),
still a plain dict to ==, `in`, iteration, json.dumps, pickle, `repr` and `print`, that shows itself
in a notebook as a short summary instead of every step row and timeline event.

Why `repr` and `print` stay the whole dict: code relies on them (logs, results files written with
`str`, the renamed-keys promise that a result is "the same dict" to repr); only IPython's display of
a cell's last value (its pretty printer, text/plain in JupyterLab) is short, and it says how to see
the rest. Every number in it is labelled measured, or predicted where it is a formula.
Pure Python (no torch): the kernel imports this.
"""
from __future__ import annotations

import statistics
from typing import Any, Mapping

from kit import _renamed
from kit.experiments.record_readers import NOT_TIMED, is_complete, phases_timed, run_center, run_spread

__all__ = ["RunRecord", "record_text", "INTERRUPTED_NOTE", "ComparisonResult", "comparison_text"]

# The note api.run adds when the interrupt ended a run of repeats early; the display reads it back, since
# such a record's `complete: False` would otherwise be said as a stopped run's "fewer measured steps".
INTERRUPTED_NOTE = "interrupted: {done} of the {asked} repeats asked for"


class RunRecord(_renamed.RenamedKeys):
    """A run record (a dict). It answers no renamed keys this release; it derives from RenamedKeys so
    that a result the kit returns is one kind of dict (when kit._renamed goes, this derives from dict)."""

    def __init__(self, record: Mapping[str, Any]) -> None:
        super().__init__("run()", dict(record))

    def _repr_pretty_(self, p: Any, cycle: bool) -> None:  # IPython's display; repr/print: the whole dict
        p.text("RunRecord(...)" if cycle else record_text(self))


def _g(x: float) -> str:
    return f"{x:.3g}" if abs(x) < 1 else f"{x:.1f}"


def record_text(record: Mapping[str, Any]) -> str:
    """The short text a notebook shows for a run record."""
    cfg, env = record.get("config") or {}, record.get("env") or {}
    said = [n for n in record.get("notes") or [] if isinstance(n, str)
            and n.startswith(INTERRUPTED_NOTE.partition("{")[0])]
    state = "complete" if is_complete(record) else said[0] if said else \
        "stopped early: fewer measured steps than configured"
    spread = run_spread(record, "step_ms")
    over = "the repeats" if spread is not None and spread[3] == "repeats" else "the measured steps"
    link = ", on an emulated link" if record.get("emulated") else ""
    lines = [f"run record: {record.get('label', '?')}, {cfg.get('world_size', '?')} rank(s), "
             f"{env.get('backend', '?')} on {env.get('device_name') or env.get('device_type', '?')} ({state})",
             f"measured on this machine{link} (medians over {over}):"]
    if spread is not None:
        median, low, high, kind = spread
        n = int(((record.get("repeat_spread" if kind == "repeats" else "spread") or {}).get("step_ms") or {})
                .get("n", 0))
        of = f"min-max {low:.1f}-{high:.1f} over {n} repeats' medians" if kind == "repeats" else \
            f"IQR {low:.1f}-{high:.1f} over {n} steps"
        lines.append(f"  step time         {median:.1f} ms ({of})")
    center = run_center(record)
    if phases_timed(record):
        lines.append(f"  exposed comm      {center.get('comm_overhead_pct', 0.0):.1f} % of the step")
    else:
        lines.append(f"  exposed comm      not timed ({NOT_TIMED})")
    lines.append(f"  throughput        {center.get('throughput_samples_s', 0.0):.0f} samples/s")
    summary = record.get("summary") or {}
    if summary.get("loss_final") is not None:
        lines.append(f"  final loss        {summary['loss_final']:.4g}")
    if summary.get("peak_mib") is not None:
        lines.append(f"  peak memory       {summary['peak_mib']:.0f} MiB")
    pipeline = record.get("pipeline")
    if pipeline:
        lines.append(f"  pipeline bubble   {100 * pipeline['measured']:.0f} % of the step "
                     f"(predicted by {pipeline.get('formula_text', 'the formula')}: {100 * pipeline['formula']:.0f} %)")
    check = ((record.get("comm") or {}).get("report") or {}).get("check_vs_one_process")
    if check and check.get("max_abs_diff") is not None:
        moved = check.get("weights_moved")
        lines.append(f"  vs one process    max |difference| {_g(check['max_abs_diff'])}"
                     + (f" (training moved the weights by {_g(moved)})" if moved is not None else ""))
    keys = ", ".join(f'["{k}"]' for k in ("summary", "spread", "steps", "notes") if k in record)
    lines.append(f"{len(record.get('notes') or [])} note(s) in record[\"notes\"]. A dict: read {keys}; "
                 "print(record) shows all of it")
    return "\n".join(lines)


class ComparisonResult(_renamed.RenamedKeys):
    """What `compare(a, b)` returns (a dict, as run records are): a notebook shows its verdict line and the
    two sides' times; print(result) shows all of it, both sides' records included."""

    def __init__(self, result: Mapping[str, Any]) -> None:
        super().__init__("compare()", dict(result))

    def _repr_pretty_(self, p: Any, cycle: bool) -> None:
        p.text("ComparisonResult(...)" if cycle else comparison_text(self))


def comparison_text(result: Mapping[str, Any]) -> str:
    """The short text a notebook shows for a comparison."""
    pairs = result.get("pairs") or []
    lines = [f"comparison: {result.get('summary', '?')}"]
    if pairs:
        a_ms, b_ms, ratios = ([float(q[k]) for q in pairs] for k in ("a_ms", "b_ms", "ratio"))
        lines.append(f"measured on this machine, {len(pairs)} interleaved pair(s): A = {result.get('name_a', '?')}, "
                     f"B = {result.get('name_b', '?')}")
        lines.append(f"  step time (runs' medians)  A {statistics.median(a_ms):.1f} ms, "
                     f"B {statistics.median(b_ms):.1f} ms")
        lines.append(f"  B/A per pair               {min(ratios):.2f}-{max(ratios):.2f} "
                     f"(median {result.get('ratio', 0.0):.2f})")
    if not result.get("complete", True):
        lines.append(f"  incomplete: {len(pairs)} of the {result.get('repeats', '?')} pairs asked for")
    keys = ", ".join(f'["{k}"]' for k in ("verdict", "summary", "pairs", "a", "b") if k in result)
    lines.append(f"A dict: read {keys}; print(result) shows all of it")
    return "\n".join(lines)
