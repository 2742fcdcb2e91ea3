"""One rank count predicted: a step's compute, communication and memory per rank, by the strategy's formulas.

prediction.predict() calls `point` once per rank count on the measured pieces (predict_inputs.py) and a link
(predict_comm.py); FORMULAS is each formula in words (a prediction carries it, docs/predicting.md explains it)
and PREDICTABLE the strategies it has formulas for. Pure Python (no torch).
"""
from __future__ import annotations

from typing import Any, Mapping

from kit.experiments.theory.bubble import predicted_bubble
from kit.experiments.theory.layout_memory import ParallelConfig, in_flight
from kit.experiments.theory.predict_comm import backward_overlap, collective_ms, zero3_pass
from kit.units import MIB

__all__ = ["point", "PREDICTABLE", "HIDDEN_PCT", "FORMULAS"]

PREDICTABLE = ("ddp", "zero1", "zero2", "zero3", "fsdp", "pipeline", "fp16_compress")
HIDDEN_PCT = 5.0  # communication "hides" while exposed comm is at most this % of the step

FORMULAS: dict[str, str] = {
    "step": "fwd + bwd + exposed comm + opt + other (ms, per rank; ranks run in lockstep)",
    "all_reduce": "sum over links: base + 2(p-1) hop + 2(p-1)/p n / bw(n), bw(n) = gbps*eff*c/(c+c_half), c = n/p",
    "reduce_scatter/all_gather": "sum over links: base + (p-1) hop + (p-1)/p n / bw(n)",
    "overlap": "bucket i ready at fwd + f_i bwd; buckets queue on one FIFO link; overlapped = comm inside "
               "backward, exposed = comm - overlapped",
    "ddp": "one all-reduce of the gradient bytes per step, bucket by bucket",
    "zero1/zero2": "reduce-scatter of gradients (bucketed, overlaps backward) + all-gather of the updated "
                   "parameters after the optimizer (exposed); optimizer on 1/p of the parameters",
    "zero3": "all-gather each chunk's parameters before its forward and its backward (prefetch one), "
             "reduce-scatter its gradients after its backward: 3x the parameter bytes, one FIFO link",
    "pipeline": "s stages, m micro-batches, v chunks per rank (interleaved 1F1B; else 1): (fwd+bwd)/s * "
                "(m+(s-1)/v)/m; bubble (s-1)/(v m+s-1) (GPipe, 1F1B: v = 1); sends between stages not modelled; "
                "data-parallel all-reduce of a stage's gradients over p/s replicas, exposed",
    "compression": "gradient bytes / ratio (fp16_compress: 2); compress/decompress time not modelled",
    "memory": "params P + grads G + optimizer O + activations A per rank; DDP +G bucket copy unless "
              "gradient_as_bucket_view; ZeRO-1 P+G+O/p, ZeRO-2 P+(G+O)/p, ZeRO-3 (P+G+O)/p "
              "(Rajbhandari et al. 2019); pipeline (P+G+O)/s, A/s (GPipe), A/s*min(s,m)/m (1F1B) or "
              "A/s*min(s+(s-1)/v,m)/m (interleaved 1F1B: Korthikanti et al. 2022's 1+(s-1)/(s v))",
    "efficiency": "throughput(p) / (p throughput(1)): weak step(1)/step(p), strong step(1)/(p step(p))",
    "accelerator": "fwd = F/3, bwd = 2F/3 over peak*utilisation, F = 6 N tokens; opt = 28 N bytes / HBM "
                   "(Adam reads p,g,m,v and writes p,m,v); other = 0",
    "oversubscription": "compute x max(1, (p t + load) / cores) / max(1, (p0 t + load) / cores): a fair share "
                        "of the cores among runnable threads (local CPU validation only)",
}


def _compute(pc: Mapping[str, Any], p: int, acc: Mapping[str, Any] | None, batch: str,
             cores: int | None, load: float = 0.0) -> dict[str, float]:
    """Per-rank compute (ms) at p ranks: measured (rescaled) or an accelerator's roofline."""
    work = (pc["world_size"] / p) if batch == "global" else 1.0  # strong scaling: less batch per rank
    if acc is not None:
        f = acc["flops_per_step_per_rank"] * work
        rate = acc["peak_tflops"] * 1e12 * acc["utilisation"]
        return {"fwd_ms": 1e3 * f / 3 / rate, "bwd_ms": 1e3 * 2 * f / 3 / rate,
                "opt_ms": 1e3 * acc["optimizer_bytes"] / (acc["hbm_gbps"] * 1e9), "other_ms": 0.0}
    t = int(pc.get("threads_per_rank") or 1)
    # Fair share of the cores among runnable threads: ours (p x t) and other users' (load).
    over = max(1.0, (p * t + load) / cores) / max(1.0, (pc["world_size"] * t + load) / cores) if cores else 1.0
    return {"fwd_ms": pc["fwd_ms"] * work * over, "bwd_ms": pc["bwd_ms"] * work * over,
            "opt_ms": pc["opt_ms"] * over, "other_ms": pc["other_ms"] * over}


def _memory(pc: Mapping[str, Any], strategy: str, p: int, s: int, m: int, schedule: str, batch: str,
            v: int = 1) -> dict[str, float]:
    P, G, O = pc["params_bytes"], pc["params_bytes"], pc["optimizer_bytes"]
    A = pc["activations_bytes"] * ((pc["world_size"] / p) if batch == "global" else 1.0)
    if strategy == "ddp":
        G = G * (1 if pc["gradient_as_bucket_view"] else 2)  # DDP's flat bucket copy
    elif strategy == "zero1":
        O /= p
    elif strategy == "zero2":
        G, O = G / p, O / p
    elif strategy == "zero3":
        P, G, O = P / p, G / p, O / p
    elif strategy == "pipeline":
        P, G, O = P / s, G / s, O / s
        held, _ = in_flight(ParallelConfig(pp=s, micro_batches=m, schedule=schedule, virtual_stages=v))
        A = A / s * held / m  # micro-batches in flight on the first stage, of m
    out = {"params_mib": P / MIB, "grads_mib": G / MIB, "optimizer_mib": O / MIB, "activations_mib": A / MIB}
    out["total_mib"] = sum(out.values())
    return out


def point(pc: Mapping[str, Any], p: int, strategy: str, chain: list[Any], ratio: float, acc: Any,
          batch: str, cores: int | None, stages: int, m: int, schedule: str, load: float, v: int = 1
          ) -> dict[str, Any]:
    """One rank count's row of predict()'s points: step time, communication (overlapped and exposed),
    throughput and memory per rank, for `strategy` (one of PREDICTABLE but fsdp and fp16_compress, which
    predict() maps to zero3 and ddp) on the link `chain`, gradient bytes divided by `ratio`."""
    c = _compute(pc, p, acc, batch, cores, load)
    fwd, bwd, opt, other = c["fwd_ms"], c["bwd_ms"], c["opt_ms"], c["other_ms"]
    layout, frac = pc["buckets_bytes"], pc["ready_fraction"]
    row: dict[str, Any] = {"ranks": p, "predicted": True}
    s = max(1, min(stages, p)) if strategy == "pipeline" else 1
    if strategy in ("ddp", "zero1", "zero2"):
        op = "all_reduce" if strategy == "ddp" else "reduce_scatter"
        dur = [collective_ms(op, chain, b / ratio, p) for b in layout]
        ov = backward_overlap([fwd + f * bwd for f in frac], dur, fwd, fwd + bwd)
        tail = 0.0
        if strategy != "ddp":  # the optimizer updates 1/p of the parameters, then all-gathers them
            opt /= p
            tail = collective_ms("all_gather", chain, pc["params_bytes"], p)
        row.update(comm_ms=ov["comm_ms"] + tail, comm_overlap_ms=ov["comm_overlap_ms"],
                   comm_exposed_ms=ov["comm_exposed_ms"] + tail)
        step = fwd + bwd + ov["comm_exposed_ms"] + opt + tail + other
    elif strategy == "zero3":
        fwd_order = list(reversed(layout))  # buckets are in gradient (reverse) order
        share = [b / sum(layout) for b in fwd_order] if layout else []
        ag = [collective_ms("all_gather", chain, b, p) for b in fwd_order]
        f = zero3_pass([fwd * x for x in share], ag, [0.0] * len(ag))
        rs = [collective_ms("reduce_scatter", chain, b / ratio, p) for b in layout]
        b = zero3_pass([bwd * x for x in reversed(share)], list(reversed(ag)), rs)
        opt /= p
        row.update(comm_ms=f["comm_ms"] + b["comm_ms"], comm_overlap_ms=f["comm_overlap_ms"] + b["comm_overlap_ms"],
                   comm_exposed_ms=f["comm_exposed_ms"] + b["comm_exposed_ms"])
        step = f["pass_ms"] + b["pass_ms"] + opt + other
    elif strategy == "pipeline":
        dp = max(1, p // s)
        busy = (fwd + bwd) / s
        span = busy * (m + (s - 1) / v) / m  # (s-1)/v fill/drain slots of a micro-batch time
        ar = collective_ms("all_reduce", chain, pc["grad_bytes"] / s / ratio, dp)
        opt /= s
        row.update(comm_ms=ar, comm_overlap_ms=0.0, comm_exposed_ms=ar, stages=s, data_parallel=dp,
                   bubble_ms=span - busy, bubble_fraction=predicted_bubble(s, m, v))
        step = span + ar + opt + other
    else:
        raise ValueError(f"strategy={strategy!r}; choose one of {PREDICTABLE}")
    row.update(fwd_ms=fwd, bwd_ms=bwd, opt_ms=opt, other_ms=other, step_ms=step)
    samples = pc["batch_per_rank"] * (p // s) if batch != "global" else pc["batch_per_rank"] * pc["world_size"]
    row["throughput_samples_s"] = samples * 1e3 / step if step else 0.0
    row["memory_mib"] = _memory(pc, strategy, p, s, m, schedule, batch, v)
    row["comm_hidden"] = row["comm_exposed_ms"] <= HIDDEN_PCT / 100 * step
    return row

