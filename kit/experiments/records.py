"""Run records: merge the ranks' partial results, append to JSONL at once, compare as a table.

Pure Python (no torch): the kernel imports this. Schema "kit.run/1" (see the issue / README).
"""
from __future__ import annotations

import json
import math
import os
import time
import uuid
from statistics import fmean
from typing import Any, Iterable

__all__ = ["SCHEMA", "merge", "append_jsonl", "load_jsonl", "table", "rows"]

SCHEMA = "kit.run/1"


def _mean(xs: Iterable[float]) -> float:
    xs = [x for x in xs if x is not None and not math.isnan(x)]
    return fmean(xs) if xs else 0.0


def merge(per_rank: dict[int, dict[str, Any]], config: Any) -> dict[str, Any]:
    """Combine the ranks' results into one record (pure: no torch, no I/O)."""
    cfg = config.to_dict() if hasattr(config, "to_dict") else dict(config)
    from kit.experiments.config import ExperimentConfig
    c = ExperimentConfig.from_dict(cfg)
    parts = [per_rank[r] for r in sorted(per_rank) if not per_rank[r].get("skipped")]
    steps = sorted((row for p in parts for row in p["steps"]), key=lambda r: (r["step"], r["rank"]))
    if c.strategy in ("model_parallel", "pipeline"):
        # Only the last stage computes the loss; show it on every rank's row.
        last = {r["step"]: r["loss"] for r in steps if r["rank"] == c.world_size - 1}
        for r in steps:
            r["loss"] = last.get(r["step"], r["loss"])
    by_step: dict[int, list[dict[str, Any]]] = {}
    for r in steps:
        by_step.setdefault(r["step"], []).append(r)
    # A step is as slow as its slowest rank (they wait for each other); other parts: rank mean.
    step_ms = _mean(max(r["step_ms"] for r in rs) for rs in by_step.values())
    mean = {k: _mean(r[k] for r in steps) for k in ("fwd_ms", "bwd_ms", "opt_ms", "comm_ms",
                                                     "comm_overlap_ms", "comm_exposed_ms")}
    final = by_step[max(by_step)] if by_step else []
    loss_final = _mean(r["loss"] for r in final)
    buckets = parts[0]["buckets"] if parts else []
    bytes_per_step = int(sum(buckets))
    if c.strategy == "ddp" and not buckets:
        bytes_per_step = int(parts[0]["param_bytes"])  # uninstrumented: DDP reduces every gradient
    if c.strategy in ("ddp", "naive_dp") and c.grad_accum_steps > 1:
        pass  # one all-reduce per optimizer step (no_sync on the others): bytes unchanged
    report = parts[0].get("comm_report") if parts else None
    if report:  # zero1/fsdp/compression: every collective of the step, compressed sizes
        bytes_per_step = int(report["payload_bytes_per_step"])
    bubble = None
    if c.strategy in ("model_parallel", "pipeline") and step_ms:
        # Bubble: the fraction of the step a stage sits idle = 1 - busy / step, averaged over stages.
        idle = [1.0 - b / s for p in parts for b, s in zip(p.get("busy_ms") or [], p.get("span_ms") or []) if s > 0]
        bubble = 100.0 * _mean(idle) if idle else None
        bytes_per_step = int(sum(p.get("p2p_bytes", 0) for p in parts))  # activations + their grads
    peaks = [p["memory"].get("peak_mib") for p in parts if p.get("memory")]
    peaks = [x for x in peaks if x is not None]
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
    env = parts[0]["env"] if parts else {}
    if env.get("device_type") == "cpu":
        notes.append("CPU run: peak_mib is None (RSS would mix in the interpreter); breakdown is exact tensor bytes")
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
    if any(p.get("stopped") for p in parts):
        record["notes"].append("stopped early by the user: fewer steps than configured")
    return record


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


_COLS = (("label", "run", "{}"), ("step_ms", "step ms", "{:.1f}"), ("fwd_ms", "fwd", "{:.1f}"),
         ("bwd_ms", "bwd", "{:.1f}"), ("opt_ms", "opt", "{:.1f}"), ("comm_ms", "comm", "{:.1f}"),
         ("comm_exposed_ms", "exposed", "{:.1f}"), ("throughput_samples_s", "samples/s", "{:.0f}"),
         ("loss_final", "loss", "{:.3f}"), ("bubble_pct", "bubble %", "{:.0f}"))


def rows(records: Iterable[dict[str, Any]]) -> list[dict[str, Any]]:
    """One flat dict per run: label, the summary fields and whether it was emulated."""
    return [{"label": r.get("label", r.get("run_id")), **r.get("summary", {}), "emulated": r.get("emulated", False)}
            for r in records]


def table(records: Iterable[dict[str, Any]]) -> str:
    """A compact fixed-width comparison of runs (emulated runs marked with *)."""
    recs = rows(records)
    body = []
    for r in recs:
        cells = []
        for key, _, fmt in _COLS:
            v = r.get(key)
            cells.append("-" if v is None else fmt.format(v) + ("*" if key == "label" and r["emulated"] else ""))
        body.append(cells)
    head = [h for _, h, _ in _COLS]
    widths = [max(len(x) for x in col) for col in zip(head, *body)]
    fmt_row = lambda cs: "  ".join(c.ljust(w) if i == 0 else c.rjust(w) for i, (c, w) in enumerate(zip(cs, widths)))
    lines = [fmt_row(head)] + [fmt_row(b) for b in body]
    if any(r["emulated"] for r in recs):
        lines.append("* emulated: a virtual interconnect or a re-enacted strategy (see the record's notes)")
    return "\n".join(lines)
