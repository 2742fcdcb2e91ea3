"""Predict a training step at 1..1024 ranks from one measured run (schema "kit.prediction/1").

    from kit.experiments import predict
    pred = predict(record, ranks=[1, 2, 4, 8, 64, 1024], link="infiniband", strategy="zero3")
    pred["points"][-1]["step_ms"]      # predicted, with its formula and inputs in pred

Pure Python (no torch): the kernel predicts. The measured pieces come from a `kit.run/2` record
(predict_inputs.py: compute per phase as medians, gradient bytes, DDP's bucket layout and when each
bucket was launched in backward, memory per rank); the link is a preset, (alpha_us, gbps), a
collective benchmark fit, or a chain of those (predict_comm.py). Weak scaling by default (the
per-rank batch stays the record's, as DDP is used); batch="global" keeps the global batch (strong).
Each rank count's step, communication and memory come from its strategy's formulas (predict_point.py).
A mesh run's record is predicted on its own mesh, each dimension on its own group (predict_mesh.py).
docs/predicting.md explains the model, what it ignores and how it was checked.
"""
from __future__ import annotations

from typing import Any, Iterable, Mapping, Sequence

from kit.experiments.choices import KNOB_OWNERS
from kit.experiments.theory.cluster import refuse_too_many_ranks
from kit.experiments.theory.predict_notes import weakest
from kit.experiments.theory.predict_comm import describe_link, resolve_link
from kit.experiments.theory.predict_inputs import accelerator_pieces, measured_pieces
from kit.experiments.theory.predict_mesh import MESH_FORMULA, mesh_pieces, mesh_point, mesh_ranks
from kit.experiments.theory.predict_point import FORMULAS, HIDDEN_PCT, PREDICTABLE, point
from kit.experiments.theory.plan_rules import NEAR_KEYWORDS
from kit.keywords import names_unknown_keywords
from kit.units import GIB, MIB
from kit import _renamed

__all__ = ["predict", "measured_pieces", "SCHEMA", "PREDICTABLE", "DEFAULT_RANKS", "FORMULAS"]
__getattr__ = _renamed.renamed_getattr(__name__)  # this release's old names, for one release

SCHEMA = "kit.prediction/1"
SAME_AS = {"fsdp": "zero3"}  # predicted with another's formulas, and labelled so (FSDP2 reshards after forward)
DEFAULT_RANKS = tuple(2**k for k in range(11))  # 1 .. 1024


@names_unknown_keywords(near=NEAR_KEYWORDS)  # predict(rec, lnk=...): 'did you mean link=?'
def predict(record: Mapping[str, Any], ranks: Sequence[int] = DEFAULT_RANKS, link: Any = "infiniband",
            strategy: str | None = None, accelerator: str | None = None, compression: float = 1.0,
            batch: str = "per_rank", stages: int | None = None, micro_batches: int | None = None,
            schedule: str | None = None, virtual_stages: int | None = None,
            buckets: Sequence[float] | None = None, utilisation: float | None = None,
            compute_precision: str | None = None, flops_per_sample: float | None = None,
            host_cores: int | None = None, host_load: float = 0.0) -> dict[str, Any]:
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
    pts = [point(pc, p, strategy, chain, compression, acc, batch, host_cores, stages, micro_batches, schedule,
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
            r["fits_memory"] = r["memory_mib"]["total_mib"] <= acc["memory_gib"] * GIB / MIB


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
