"""Predict a training step at 1..1024 ranks from one measured run (schema "kit.prediction/1").

    from kit.experiments import predict
    pred = predict(record, ranks=[1, 2, 4, 8, 64, 1024], link="infiniband", strategy="zero3")
    pred["points"][-1]["step_ms"]      # predicted, with its formula and inputs in pred

Pure Python (no torch): the kernel predicts. The measured pieces come from a `kit.run/2` record
(predict_inputs.py: compute per phase as medians, gradient bytes, DDP's bucket layout and when each
bucket was launched in backward, memory per rank); the link is a preset, (alpha_us, gbps), a
collective benchmark fit, or a chain of those (predict_comm.py). Weak scaling by default (the
per-rank batch stays the record's, as DDP is used); batch="global" keeps the global batch (strong).
A mesh run's record is predicted on its own mesh, each dimension on its own group (predict_mesh.py).
docs/predicting.md explains the model, what it ignores and how it was checked.
"""
from __future__ import annotations

import inspect
from typing import Any, Iterable, Mapping, Sequence

from kit.experiments.choices import KNOB_OWNERS
from kit.experiments.theory.bubble import predicted_bubble
from kit.experiments.theory.cluster import refuse_too_many_ranks
from kit.experiments.theory.layout_memory import ParallelConfig, in_flight
from kit.experiments.theory.predict_notes import weakest
from kit.experiments.theory.predict_comm import backward_overlap, collective_ms, describe_link, resolve_link, zero3_pass
from kit.experiments.theory.predict_inputs import accelerator_pieces, measured_pieces
from kit.experiments.theory.predict_mesh import MESH_FORMULA, mesh_pieces, mesh_point, mesh_ranks
from kit.experiments.theory.plan_rules import refuse_unknown
from kit.units import MIB
from kit import _renamed

__all__ = ["predict", "measured_pieces", "SCHEMA", "PREDICTABLE", "DEFAULT_RANKS", "FORMULAS"]
__getattr__ = _renamed.renamed_getattr(__name__)  # this release's old names, for one release

SCHEMA = "kit.prediction/1"
PREDICTABLE = ("ddp", "zero1", "zero2", "zero3", "fsdp", "pipeline", "fp16_compress")
SAME_AS = {"fsdp": "zero3"}  # predicted with another's formulas, and labelled so (FSDP2 reshards after forward)
DEFAULT_RANKS = tuple(2**k for k in range(11))  # 1 .. 1024
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


def _point(pc: Mapping[str, Any], p: int, strategy: str, chain: list[Any], ratio: float, acc: Any,
           batch: str, cores: int | None, stages: int, m: int, schedule: str, load: float, v: int = 1
           ) -> dict[str, Any]:
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


def predict(record: Mapping[str, Any], ranks: Sequence[int] = DEFAULT_RANKS, link: Any = "infiniband",
            strategy: str | None = None, accelerator: str | None = None, compression: float = 1.0,
            batch: str = "per_rank", stages: int | None = None, micro_batches: int | None = None,
            schedule: str | None = None, virtual_stages: int | None = None,
            buckets: Sequence[float] | None = None, utilisation: float | None = None,
            compute_precision: str | None = None, flops_per_sample: float | None = None,
            host_cores: int | None = None, host_load: float = 0.0, **unknown: Any) -> dict[str, Any]:
    """Predicted step time, exposed/overlapped comm, efficiency and memory per rank at each rank count.

    A mesh run's record (`ExperimentConfig(mesh=...)`) is predicted on its own mesh, each dimension's
    collectives on its own group (theory/predict_mesh.py), with `ranks` and `link` only.
    `strategy` (default ddp): ddp, zero1, zero2, zero3 (= fsdp), pipeline (`stages`, `micro_batches`,
    `schedule`, `virtual_stages`: each None takes the record's own when it is a pipeline run, else
    4, 8, "gpipe", 1), fp16_compress (= ddp with compression 2). `compression`: gradient bytes divided
    by this. `accelerator`: "h100", "a100", "t4" rescales compute to peak x `utilisation`
    (default 0.52, sourced). `host_cores`, `host_load`: model CPU oversubscription, our ranks'
    threads and other users' runnable threads sharing the cores (local validation only).
    `buckets`: bucket sizes in bytes (gradient order) when the record has none.
    """
    refuse_unknown(unknown, [n for n in inspect.signature(predict).parameters if n != "unknown"], "predict")
    if not isinstance(ranks, Iterable) or isinstance(ranks, (str, bytes)):
        raise TypeError(f"ranks={ranks!r}: give the rank counts as a list, e.g. ranks=[1, {ranks!r}]")
    ranks = list(ranks)  # a generator is read once
    refuse_too_many_ranks(ranks)  # a mesh's too: 3,000,000 ranks means nothing on any link
    if isinstance(accelerator, str):
        accelerator = accelerator.lower()  # "H100" as plan() takes it
    if not isinstance(record, Mapping):
        raise TypeError(f"predict() takes the record run() returned (a kit.run dict), not {type(record).__name__}: "
                        "rec = run(config); predict(rec)")
    if (record.get("config") or {}).get("mesh"):
        _refuse_on_a_mesh(record, dict(strategy=strategy, accelerator=accelerator, stages=stages,
                                       micro_batches=micro_batches, schedule=schedule, virtual_stages=virtual_stages,
                                       buckets=buckets, utilisation=utilisation, compute_precision=compute_precision,
                                       flops_per_sample=flops_per_sample, host_cores=host_cores), compression, batch)
        return _predict_mesh(record, ranks, resolve_link(link))
    asked = strategy or "ddp"  # the label names what the learner ran (an FSDP run is predicted as ZeRO-3)
    strategy, compression = _predicted_as(asked, compression, batch)
    asked_ranks = list(ranks)
    ranks = sorted({int(r) for r in asked_ranks} | {1})
    if ranks[0] < 1:
        raise ValueError(f"ranks={asked_ranks}: every rank count must be at least 1 (1 is always added: the "
                         "efficiency's baseline)")
    stages, micro_batches, schedule, v = _pipeline_knobs(record, stages, micro_batches, schedule, virtual_stages)
    chain = resolve_link(link)
    pc = measured_pieces(record, buckets)
    if not pc["step_ms"] > 0:  # a curve of zeros, labelled predicted, would pass for an answer
        raise ValueError("this record has no measured step time (step_ms): give a finished run's record, "
                         "rec = run(config); predict(rec)")
    acc = accelerator_pieces(pc, accelerator, utilisation, compute_precision, flops_per_sample)
    pts = [_point(pc, p, strategy, chain, compression, acc, batch, host_cores, stages, micro_batches, schedule,
                  host_load, v) for p in ranks]
    _efficiency_and_fit(pts, acc)
    stops = next((r["ranks"] for r in pts if not r["comm_hidden"]), None)
    out = {"schema": SCHEMA, "predicted": True, "strategy": strategy, "compression": compression,
           "batch": batch, "ranks": ranks, "link": describe_link(chain), "accelerator": acc,
           "host_cores": host_cores, "host_load": host_load, "inputs": pc, "points": pts,
           "comm_stops_hiding_at": stops,
           "hidden_threshold_pct": HIDDEN_PCT, "formulas": FORMULAS,
           "pipeline": {"stages": stages, "micro_batches": micro_batches, "schedule": schedule,
                        "virtual_stages": v} if strategy == "pipeline" else None,
           "label": _label(asked, compression, chain, record, acc)}
    out["weakest"] = weakest(out)
    return out


def _refuse_on_a_mesh(record: Mapping[str, Any], knobs: dict[str, Any], compression: float, batch: str) -> None:
    """A mesh record is predicted on its own mesh: any knob given for a one-dimensional run is refused."""
    given = sorted(k for k, v in knobs.items() if v is not None)
    given += ["compression"] * (compression != 1.0) + ["batch"] * (batch != "per_rank")
    if given:
        raise ValueError(f"this record ran on mesh {record['config']['mesh']}: predict(record, ranks, link) "
                         "predicts it on its own mesh (the data dimension grows, the others keep their size), "
                         f"with the measured compute and weak scaling; drop {', '.join(given)}, or predict "
                         "a one-dimensional run's record with them")


def _predicted_as(strategy: str, compression: float, batch: str) -> tuple[str, float]:
    """(the strategy the formulas know, compression): fsdp is zero3, fp16_compress is ddp halving the bytes."""
    strategy = SAME_AS.get(strategy, strategy)
    if strategy == "fp16_compress":
        strategy, compression = "ddp", compression * 2.0
    wrong = ([f"strategy={strategy!r}: one of {', '.join(PREDICTABLE)}"]
             * (strategy not in PREDICTABLE)
             + ["batch=" + repr(batch) + ": 'per_rank' (weak scaling) or 'global' (strong)"]
             * (batch not in ("per_rank", "global"))
             + [f"compression={compression}: the gradient bytes are divided by it, so at least 1"] * (compression < 1.0))
    if wrong:  # only what is wrong (before, all three were listed whichever one was)
        raise ValueError("; ".join(wrong))
    return strategy, compression


def _efficiency_and_fit(pts: list[dict[str, Any]], acc: Mapping[str, Any] | None) -> None:
    """Each point's efficiency and, on an accelerator, whether its memory fits (in place)."""
    x1 = pts[0]["throughput_samples_s"]
    for r in pts:  # throughput per rank against one rank's: weak step(1)/step(p), strong step(1)/(p step(p))
        r["efficiency"] = r["throughput_samples_s"] / (r["ranks"] * x1) if x1 else 0.0
    if acc is not None:
        for r in pts:
            r["fits_memory"] = r["memory_mib"]["total_mib"] <= acc["memory_gib"] * 1024


def _label(asked: str, compression: float, chain: list[Any], record: Mapping[str, Any],
           acc: Mapping[str, Any] | None) -> str:
    return (f"predicted {asked}{f' ({SAME_AS[asked]})' if asked in SAME_AS else ''}{f' /{compression:g}' if compression > 1 else ''}"
            f" on {'+'.join(d['name'] for d in describe_link(chain))} from [{record.get('label', '')}]"
            f"{' (' + acc['name'] + ')' if acc else ''}")


def _predict_mesh(record: Mapping[str, Any], ranks: Sequence[int], chain: list[Any]) -> dict[str, Any]:
    """A mesh record at each rank count it can have (predict_mesh.py), in predict()'s schema."""
    mp = mesh_pieces(record)
    if not mp["step_ms"] > 0:
        raise ValueError("this record has no measured step time (step_ms): give a finished run's record, "
                         "rec = run(config); predict(rec)")
    fixed = mp["fixed_ranks"]
    if ranks and not any(int(r) >= fixed and int(r) % fixed == 0 for r in ranks):  # else only the baseline came back
        keep = " x ".join(f"{k}{v}" for k, v in mp["mesh"].items() if k != mp["grows"])
        raise ValueError(f"ranks={list(ranks)}: a mesh keeps {keep}, so its rank counts are multiples of {fixed}; "
                         f"ask for some of {[fixed * d for d in (1, 2, 4, 8)]} ... (the {mp['grows']} dimension grows)")
    pts = [mesh_point(mp, p, chain) for p in mesh_ranks(ranks, fixed)]
    first = pts[0]
    for r in pts:  # throughput per replica against the smallest mesh's (data dimension 1)
        x = first["throughput_samples_s"] * r["ranks"] / first["ranks"]
        r["efficiency"] = r["throughput_samples_s"] / x if x else 0.0
        r["comm_hidden"] = r["comm_exposed_ms"] <= HIDDEN_PCT / 100 * r["step_ms"]
    mesh = " x ".join(f"{k}{v}" for k, v in mp["mesh"].items())
    out = {"schema": SCHEMA, "predicted": True, "strategy": mp["strategy"], "mesh": mp["mesh"], "grows": mp["grows"],
           "compression": 1.0, "batch": "per_rank", "ranks": [r["ranks"] for r in pts], "link": describe_link(chain),
           "accelerator": None, "host_cores": None, "host_load": 0.0, "inputs": mp, "points": pts,
           "comm_stops_hiding_at": next((r["ranks"] for r in pts if not r["comm_hidden"]), None),
           "hidden_threshold_pct": HIDDEN_PCT, "formulas": {**FORMULAS, "mesh": MESH_FORMULA}, "pipeline": None,
           "label": f"predicted {mp['strategy']} on mesh {mesh}, {mp['grows']} growing, on "
                    f"{'+'.join(d['name'] for d in describe_link(chain))} from [{record.get('label', '')}]"}
    out["weakest"] = weakest(out)
    return out


def _pipeline_knobs(record: Mapping[str, Any], stages: int | None, micro_batches: int | None,
                    schedule: str | None, virtual: int | None) -> tuple[int, int, str, int]:
    """(stages, micro-batches, schedule, virtual stages): given, else the record's when it ran the
    pipeline strategy (its world_size is the stages), else 4, 8, GPipe, 1."""
    cfg = record.get("config") or {}
    own = cfg.get("strategy") in KNOB_OWNERS["schedule"]  # the record's run took these knobs
    s = int(stages or (cfg.get("world_size") if own else 0) or 4)
    m = int(micro_batches or (cfg.get("micro_batches") if own else 0) or 8)
    kind = str(schedule or (cfg.get("schedule") if own else None) or "gpipe")
    v = int(virtual or (cfg.get("virtual_stages") if own and kind == "interleaved_1f1b" else 1) or 1)
    if kind not in ("gpipe", "1f1b", "interleaved_1f1b") or v < 1 or (v > 1 and kind != "interleaved_1f1b"):
        raise ValueError(f"schedule={kind!r} (gpipe, 1f1b or interleaved_1f1b), virtual_stages={v}: v > 1 "
                         "only with schedule='interleaved_1f1b'")
    return s, m, kind, v
