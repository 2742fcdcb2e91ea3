"""What a prediction takes from a measured run: the measured pieces of a `kit.run/2` record (pure Python).

Compute per phase as medians, gradient bytes, DDP's bucket layout and when each bucket was
launched in backward (rank 0's timeline), memory per rank, each with where it came from; and, on an
accelerator (`accelerator_pieces`), the roofline's inputs that replace the measured compute.
theory/prediction.py extrapolates them; theory/predict_mesh.py takes a mesh record's own pieces.
"""
from __future__ import annotations

from typing import Any, Mapping, Sequence

from kit.experiments.choices import GPT_SEQ, ONE_PROCESS
from kit.experiments.theory.accelerators import ACCELERATORS, DEFAULT_UTILISATION, UTILISATION_SOURCE
from kit.experiments.theory.predict_comm import bucket_layout
from kit.units import MIB

__all__ = ["measured_pieces", "accelerator_pieces", "TOKENS_PER_SAMPLE"]

TOKENS_PER_SAMPLE = {"mlp": 1, "gpt": GPT_SEQ}  # cnn: no 6N rule


def _center(record: Mapping[str, Any], key: str) -> float:
    """The median of the measured steps where the record has one (kit.run/2), else the mean."""
    sp = (record.get("spread") or {}).get(key) or {}
    v = sp.get("median", (record.get("summary") or {}).get(key))
    return float(v or 0.0)


def measured_pieces(record: Mapping[str, Any], buckets: Sequence[float] | None = None) -> dict[str, Any]:
    """What a prediction takes from a measured run, each piece with where it came from."""
    cfg = record.get("config") or {}
    if cfg.get("instrument", True) is False:  # record_readers.phases_timed (theory/ imports no kernel module)
        raise ValueError("this run was made with instrument=False: its phases were not timed (the record's "
                         "0.0s are not measurements), so a prediction cannot split its step. Measure it again "
                         "with instrument=True (the default).")
    ph = {k: _center(record, k) for k in ("step_ms", "fwd_ms", "bwd_ms", "opt_ms", "comm_exposed_ms")}
    other = max(0.0, ph["step_ms"] - ph["fwd_ms"] - ph["bwd_ms"] - ph["opt_ms"] - ph["comm_exposed_ms"])
    mem = (record.get("memory") or [{}])[0]
    param_b = float(mem.get("params_mib") or 0.0) * MIB
    # A ddp record's comm is its gradients' all-reduce (bytes, buckets); other records' are not read.
    comm = (record.get("comm") or {}) if cfg.get("strategy") == "ddp" else {}
    # With compression the record's bytes are the compressed payload; the gradients are the uncompressed
    # bytes (its report says both), which predict's `compression` divides again where asked.
    grad_b = float((comm.get("report") or {}).get("uncompressed_bytes_per_step") or comm.get("bytes_per_step") or 0)
    grad_b = grad_b or param_b  # fp32 gradients (autocast keeps them fp32): as many bytes as params
    rec_buckets = [float(b["bytes"]) for b in comm.get("buckets") or []]
    cap_b = float(cfg.get("bucket_cap_mb", 25.0)) * MIB
    if buckets is not None:
        layout, where = [float(b) for b in buckets], "given by the caller"
    elif rec_buckets:
        layout, where = rec_buckets, "the record's DDP buckets (launch order)"
    else:
        layout, where = bucket_layout(grad_b, cap_b), f"equal split at bucket_cap_mb={cfg.get('bucket_cap_mb', 25)}"
    ready = _ready_fractions(record, layout) if rec_buckets and buckets is None else None
    if ready is None:
        cum = [sum(layout[: i + 1]) for i in range(len(layout))]
        ready, ready_from = [c / cum[-1] for c in cum], "bytes (gradients produced at an even rate in backward)"
    else:
        ready_from = "the record's timeline (launch of each all-reduce within backward)"
    p0 = 1 if cfg.get("strategy") in ONE_PROCESS else int(cfg.get("world_size", 1))
    return {"run_id": record.get("run_id"), "label": record.get("label"), "world_size": p0,
            "strategy": cfg.get("strategy"), "workload": cfg.get("workload"),
            "batch_per_rank": int(cfg.get("batch_size", 1)) * int(cfg.get("grad_accum_steps", 1)),
            "fwd_ms": ph["fwd_ms"], "bwd_ms": ph["bwd_ms"], "opt_ms": ph["opt_ms"], "other_ms": other,
            "step_ms": ph["step_ms"], "grad_bytes": grad_b, "buckets_bytes": layout, "buckets_from": where,
            "ready_fraction": ready, "ready_from": ready_from, "params_bytes": param_b,
            "optimizer_bytes": float(mem.get("optimizer_mib") or 0.0) * MIB,
            "activations_bytes": float(mem.get("activations_mib") or 0.0) * MIB,
            "gradient_as_bucket_view": bool(cfg.get("gradient_as_bucket_view", False)),
            "device_type": (record.get("env") or {}).get("device_type"),
            "threads_per_rank": (record.get("env") or {}).get("threads_per_rank"),
            "how": "medians of the measured steps; other = step - fwd - bwd - opt - exposed comm"}


def _ready_fractions(record: Mapping[str, Any], layout: Sequence[float]) -> list[float] | None:
    """Where in backward (0..1) each bucket's all-reduce was launched, rank 0, last timed step."""
    tl = [e for e in record.get("timeline") or [] if e.get("rank", 0) == 0]
    bwd = [e for e in tl if e["name"] == "backward"]
    ar = sorted((e for e in tl if e["name"].startswith("all_reduce")), key=lambda e: e["start_ms"])
    if not bwd or len(ar) != len(layout):
        return None
    s, e = bwd[0]["start_ms"], bwd[0]["end_ms"]
    span = max(e - s, 1e-9)
    return [min(1.0, max(0.0, (a["start_ms"] - s) / span)) for a in ar]


def accelerator_pieces(pc: Mapping[str, Any], name: str | None, util: float | None, precision: str | None,
                       flops_per_sample: float | None) -> dict[str, Any] | None:
    """What replaces the measured compute on accelerator `name` (None: nothing, the measured compute stays):
    its peak at `precision` x `util`, its HBM, 6N FLOPs per token; `pc` is `measured_pieces`."""
    if name is None:
        return None
    if name not in ACCELERATORS:
        raise ValueError(f"accelerator={name!r}; choose one of {sorted(ACCELERATORS)}")
    a = ACCELERATORS[name]
    precision = precision or ("bf16" if "bf16" in a.peak_tflops else "fp16")  # what training would use
    if precision not in a.peak_tflops:
        raise ValueError(f"{a.name} has no {precision} peak; choose one of {sorted(a.peak_tflops)}")
    n_params = pc["params_bytes"] / 4  # fp32 parameters (autocast keeps fp32 weights)
    if flops_per_sample is None:
        tokens = TOKENS_PER_SAMPLE.get(pc["workload"] or "")
        if tokens is None:
            raise ValueError(f"no FLOP count rule for workload {pc['workload']!r} (6N per token holds for "
                             "dense layers only); pass flops_per_sample=")
        flops_per_sample = 6.0 * n_params * tokens
    return {"name": a.name, "peak_tflops": a.peak_tflops[precision], "compute_precision": precision,
            "utilisation": DEFAULT_UTILISATION if util is None else util,
            "utilisation_source": UTILISATION_SOURCE if util is None else "given by the caller",
            "hbm_gbps": a.hbm_gbps, "memory_gib": a.memory_gib, "source": a.source,
            "flops_per_sample": flops_per_sample,
            "flops_per_step_per_rank": flops_per_sample * pc["batch_per_rank"],
            "optimizer_bytes": 28.0 * n_params, "measured_compute_replaced": True}
