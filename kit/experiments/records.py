"""Run records: merge the ranks' partial results, append to JSONL at once, compare as a table
(reading one record's centre and spread, for plots and the lab bench: record_readers.py).

Pure Python (no torch): the kernel imports this. Schema "kit.run/2" = "kit.run/1" plus
`complete`, `spread` (per-phase median/IQR/min-max over measured steps) and, for a record of
several repeats, `repeats` and `repeat_spread`; every kit.run/1 field keeps its meaning, so
readers of /1 read /2 unchanged (docs/measuring.md).
"""
from __future__ import annotations

import json
import math
import os
import time
import uuid
from statistics import fmean
from typing import Any, Iterable, Mapping, Sequence

from kit.experiments.choices import DDP_BUCKETS, STAGED
from kit.experiments.record_readers import NOT_TIMED, phases_timed, run_summary
from kit.experiments.stats import CPU_PHASES, PHASES, phase_spread, repeat_spread
from kit.units import MIB
from kit import _renamed

__all__ = ["SCHEMA", "merge", "combine_repeats", "append_jsonl", "load_jsonl", "table", "bucket_report", "rows"]
__getattr__ = _renamed.renamed_getattr(__name__)  # this release's old names, for one release

SCHEMA = "kit.run/2"


def _mean(xs: Iterable[float]) -> float:
    xs = [x for x in xs if x is not None and not math.isnan(x)]
    return fmean(xs) if xs else 0.0


def merge(per_rank: dict[int, dict[str, Any]], config: Any) -> dict[str, Any]:
    """Combine the ranks' results into one record (pure: no torch, no I/O)."""
    cfg = config.to_dict() if hasattr(config, "to_dict") else dict(config)
    from kit.experiments.config import ExperimentConfig
    c = ExperimentConfig.from_dict(cfg)
    parts = [per_rank[r] for r in sorted(per_rank) if not per_rank[r].get("skipped")]
    steps = _step_rows(c, parts)
    by_step: dict[int, list[dict[str, Any]]] = {}
    for r in steps:
        by_step.setdefault(r["step"], []).append(r)
    # A step is as slow as its slowest rank (they wait for each other); other parts: rank mean.
    step_ms = _mean(max(r["step_ms"] for r in rs) for rs in by_step.values())
    mean = {k: _mean(r[k] for r in steps) for k in PHASES[1:]}
    final = by_step[max(by_step)] if by_step else []
    loss_final = _mean(r["loss"] for r in final)
    buckets = parts[0]["buckets"] if parts else []
    report = parts[0].get("comm_report") if parts else None
    bytes_per_step, bubble = _bytes_and_bubble(c, parts, step_ms)
    peaks = [p["memory"].get("peak_mib") for p in parts if p.get("memory")]
    peaks = [x for x in peaks if x is not None]
    env = parts[0]["env"] if parts else {}
    notes = _notes(c, parts, env)
    record = {
        "schema": SCHEMA, "run_id": uuid.uuid4().hex[:12], "created_unix_s": time.time(), "label": c.label(),
        "config": cfg, "env": env, "emulated": any(p.get("emulated") for p in parts), "notes": notes,
        "steps": steps,
        "memory": [p["memory"] for p in parts if p.get("memory")],
        "timeline": [e for p in parts for e in p.get("timeline", [])],
        "comm": {"bytes_per_step": bytes_per_step, "buckets": [{"index": i, "bytes": int(b)} for i, b in enumerate(buckets)]},
        "summary": {**{k: v for k, v in mean.items()}, "step_ms": step_ms,
                    "comm_overhead_pct": 100.0 * mean["comm_exposed_ms"] / step_ms if step_ms else 0.0,
                    "throughput_samples_s": c.global_batch_size * 1e3 / step_ms if step_ms else 0.0,
                    "peak_mib": max(peaks) if peaks else None, "loss_final": loss_final,
                    "bytes_per_step": bytes_per_step, "bubble_pct": bubble},
    }
    if report:
        record["comm"]["report"] = report
    if any("ddp_logging" in p for p in parts):
        record["ddp_logging"] = {p["rank"]: p.get("ddp_logging") for p in parts}  # cross-check, extra field
    clocks = {p["rank"]: p["clock"] for p in parts if p.get("clock")}
    if clocks:
        record["clock"] = clocks  # each rank's origin, offset and its error (timelines share this origin)
    if parts and parts[0].get("bubble"):
        record["pipeline"] = parts[0]["bubble"]  # formula, measured, imbalance and per-micro-batch overhead
    record["complete"] = not any(p.get("stopped") for p in parts)
    if not record["complete"]:
        record["notes"].append("stopped early by the user: fewer steps than configured")
    # Spread beside the means: the means stay (kit.run/1 readers), medians resist outlier steps.
    record["spread"] = phase_spread(steps, c.global_batch_size)
    return record


def _bytes_and_bubble(c: Any, parts: list[dict[str, Any]], step_ms: float) -> tuple[int, float | None]:
    """(bytes sent per step, the pipeline bubble in % of the step or None when the run is not staged)."""
    buckets = parts[0]["buckets"] if parts else []
    bytes_per_step = int(sum(buckets))
    if c.strategy in DDP_BUCKETS and not buckets:
        bytes_per_step = int(parts[0]["param_bytes"])  # uninstrumented: DDP reduces every gradient
    # grad_accum_steps > 1: one all-reduce per optimizer step (no_sync on the others): bytes unchanged
    report = parts[0].get("comm_report") if parts else None
    if report:  # zero1/fsdp/compression: every collective of the step, compressed sizes
        bytes_per_step = int(report["payload_bytes_per_step"])
    bubble = None
    if c.strategy in STAGED and step_ms:
        # Bubble: the fraction of the step a stage sits idle = 1 - busy / step, averaged over stages.
        idle = [1.0 - b / s for p in parts for b, s in zip(p.get("busy_ms") or [], p.get("span_ms") or []) if s > 0]
        bubble = 100.0 * _mean(idle) if idle else None
        if not report:  # a mesh's report counts each dimension; else activations + their grads
            bytes_per_step = int(sum(p.get("p2p_bytes", 0) for p in parts))
    return bytes_per_step, bubble


def _step_rows(c: Any, parts: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Every rank's step rows, by step then rank; staged runs show the last stage's loss on each row."""
    steps = sorted((row for p in parts for row in p["steps"]), key=lambda r: (r["step"], r["rank"]))
    if c.strategy in STAGED:
        # Only the last stage computes the loss; show it on every rank's row.
        last = {r["step"]: r["loss"] for r in steps if r["rank"] == c.world_size - 1}
        for r in steps:
            r["loss"] = last.get(r["step"], r["loss"])
    return steps


def _notes(c: Any, parts: list[dict[str, Any]], env: Mapping[str, Any]) -> list[str]:
    """The ranks' notes (each once), then what the config and the device mean for the numbers."""
    notes: list[str] = []
    for p in parts:
        notes += [n for n in p.get("notes", []) if n not in notes]
    if c.link:
        a, g = c.link
        notes.append(f"emulated link {c.interconnect}: alpha={a:g} us, beta={g:g} GB/s per direction; "
                     "real gloo all-reduce underneath, bucket completion delayed to the link's time")
    if c.precision == "fp16":
        notes.append("fp16 autocast with a GradScaler (loss scaling, skipped steps on inf); on CPU fp16 "
                     "matmuls are emulated and slow, unlike tensor cores")
    if not c.instrument:
        notes.append(NOT_TIMED + ". The record's phase fields are 0.0, not measurements: the kit's tables, "
                     "plots and predictions do not read them as times")
    if env.get("device_type") == "cpu":
        notes.append("CPU run: peak_mib is None (RSS would mix in the interpreter); breakdown is exact tensor bytes")
    return notes


def combine_repeats(records: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """One record for R runs of the same configuration (each with a fresh model).

    `steps` holds every repeat's rows tagged with `repeat`; `summary` means and `spread` pool
    all measured steps (as one longer run would); `repeats` keeps each run's own summary and
    spread; `repeat_spread` is the spread of the per-repeat medians, the run-to-run noise.
    Memory and timeline come from the last repeat. One record is returned as it is.
    """
    if not records:
        raise ValueError("combine_repeats needs at least one record")
    if len(records) == 1:
        return records[0]
    last = records[-1]
    steps = [{**row, "repeat": i} for i, r in enumerate(records) for row in r["steps"]]
    c = last["config"]
    from kit.experiments.config import ExperimentConfig
    samples = ExperimentConfig.from_dict(c).global_batch_size
    spread = phase_spread(steps, samples)
    summary = dict(last["summary"])
    for key in PHASES:
        summary[key] = _mean(_repeat_means(records, key))  # pooled, as if one run had all the steps
    step_ms = summary["step_ms"]
    summary["comm_overhead_pct"] = 100.0 * summary["comm_exposed_ms"] / step_ms if step_ms else 0.0
    summary["throughput_samples_s"] = samples * 1e3 / step_ms if step_ms else 0.0
    summary["loss_final"] = _mean(r["summary"].get("loss_final") for r in records)
    notes = list(dict.fromkeys(n for r in records for n in r["notes"]))
    notes.append(f"{len(records)} repeats of this configuration, each with a fresh model; "
                 "repeat_spread is the spread of the repeats' medians")
    return {**last, "run_id": uuid.uuid4().hex[:12], "created_unix_s": time.time(), "steps": steps,
            "summary": summary, "spread": spread, "notes": notes,
            "complete": all(r.get("complete", True) for r in records),
            "repeats": [{"run_id": r["run_id"], "created_unix_s": r["created_unix_s"],
                         "complete": r.get("complete", True), "summary": r["summary"],
                         "spread": r.get("spread", {})} for r in records],
            "repeat_spread": repeat_spread([r.get("spread", {}) for r in records])}


def _repeat_means(records: Sequence[dict[str, Any]], key: str) -> list[float]:
    """Each repeat's mean of `key`, weighted by its number of measured steps."""
    out: list[float] = []
    for r in records:
        n = int((r.get("spread", {}).get("step_ms") or {}).get("n", 0))
        out += [float(r["summary"][key])] * n
    return out


def append_jsonl(path: str | os.PathLike[str], record: dict[str, Any]) -> None:
    """Append one record and make it durable now (a crash later loses no finished run)."""
    line = json.dumps(record, allow_nan=False) + "\n"
    with open(path, "a", encoding="utf-8") as f:
        f.write(line)
        f.flush()
        os.fsync(f.fileno())


def load_jsonl(path: str | os.PathLike[str]) -> list[dict[str, Any]]:
    """All records in the file; a torn last line (crash mid-write) is skipped."""
    out = []
    if not os.path.exists(path):
        return out
    with open(path, encoding="utf-8") as f:
        for line in f:
            if line.strip():
                try:
                    out.append(json.loads(line))
                except json.JSONDecodeError:
                    continue
    return out


_COLS = (("label", "run", "{}"), ("step_ms", "step ms", "{:.1f}"), ("step_ms_median", "median", "{:.1f}"),
         ("step_ms_iqr", "IQR", "{:.1f}"), ("fwd_ms", "fwd", "{:.1f}"),
         ("bwd_ms", "bwd", "{:.1f}"), ("opt_ms", "opt", "{:.1f}"), ("opt_cpu_ms", "opt CPU", "{:.1f}"),
         ("comm_ms", "comm", "{:.1f}"),
         ("comm_exposed_ms", "exposed", "{:.1f}"), ("throughput_samples_s", "samples/s", "{:.0f}"),
         ("loss_final", "loss", "{:.3f}"), ("bubble_pct", "bubble %", "{:.0f}"))


def rows(records: Iterable[dict[str, Any]]) -> list[dict[str, Any]]:
    """One flat dict per run: label, the summary fields (means), the step time's median and
    IQR (kit.run/2), the optimizer phase's mean CPU time over the step rows that carry it (None for
    records made before it was timed), whether it was emulated and whether it ran to the end."""
    out = []
    for r in records:
        st = (r.get("spread") or {}).get("step_ms") or {}
        cpu = [float(s["opt_cpu_ms"]) for s in r.get("steps") or [] if s.get("opt_cpu_ms") is not None]
        row = {"label": r.get("label", r.get("run_id")), **r.get("summary", {}),
               "step_ms_median": st.get("median"), "step_ms_iqr": st.get("iqr"),
               "opt_cpu_ms": fmean(cpu) if cpu else None,
               "emulated": r.get("emulated", False), "complete": r.get("complete", True),
               "phases_timed": phases_timed(r)}
        if not row["phases_timed"]:  # zeros there are not measurements: the table prints "-"
            row.update({k: None for k in _UNTIMED})
        out.append(row)
    return out


_UNTIMED = PHASES[1:] + CPU_PHASES + ("comm_overhead_pct", "bubble_pct")  # zeros when phases_timed is False


def table(records: Iterable[dict[str, Any]]) -> str:
    """A compact fixed-width comparison of runs (emulated runs marked with *, runs stopped
    mid-way with "(stopped)"). "step ms" is the mean, "median" and "IQR" its robust twins; the phases
    are means in ms. "opt CPU" is the optimizer phase's CPU time (part of "opt", the wall clock:
    not another phase), "-" for a record saved before it was timed. A run made with instrument=False
    timed whole steps only: its phase columns are "-" (a line under the table says so)."""
    recs = rows(records)
    body = []
    for r in recs:
        cells = []
        for key, _, fmt in _COLS:
            v = r.get(key)
            mark = ("*" if r["emulated"] else "") + ("" if r["complete"] else " (stopped)")
            cells.append("-" if v is None else fmt.format(v) + (mark if key == "label" else ""))
        body.append(cells)
    head = [h for _, h, _ in _COLS]
    widths = [max(len(x) for x in col) for col in zip(head, *body)]
    fmt_row = lambda cs: "  ".join(c.ljust(w) if i == 0 else c.rjust(w) for i, (c, w) in enumerate(zip(cs, widths)))
    lines = [fmt_row(head)] + [fmt_row(b) for b in body]
    if any(r["emulated"] for r in recs):
        lines.append("* emulated: a virtual interconnect or a re-enacted strategy (see the record's notes)")
    untimed = list(dict.fromkeys(str(r["label"]) for r in recs if not r["phases_timed"]))
    if untimed:  # "-" elsewhere means "not recorded" (opt CPU) or "not a pipeline" (bubble): name the runs
        lines.append(f"phase columns \"-\" for {', '.join(untimed)}: {NOT_TIMED}")
    return "\n".join(lines)


def bucket_report(record: Mapping[str, Any]) -> str:
    """Two lines on a DDP run (lesson 03): its buckets' sizes in the order DDP reduced them, then where
    the step and the all-reduce went, means over the measured steps ("hidden": overlapped backward)."""
    sizes = [b["bytes"] / MIB for b in (record.get("comm") or {}).get("buckets", [])]
    s, cap = run_summary(record), (record.get("config") or {}).get("bucket_cap_mb")
    if not phases_timed(record):
        return f"cap {cap:g} MiB: buckets not recorded\n   step {s['step_ms']:.0f} ms; {NOT_TIMED}"
    return (f"cap {cap:g} MiB: {len(sizes)} bucket(s), {' + '.join(f'{x:.2f}' for x in sizes)} MiB\n"
            f"   step {s['step_ms']:.0f} ms, backward {s['bwd_ms']:.0f} ms; all-reduce {s['comm_ms']:.0f} ms = "
            f"{s['comm_overlap_ms']:.0f} hidden + {s['comm_exposed_ms']:.0f} exposed")
