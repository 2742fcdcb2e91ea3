"""A mesh run predicted at more ranks: each dimension's collectives on its own group (pure Python).

A record of `ExperimentConfig(mesh=...)` counted every collective per "<dimension>/<kind>"
(parallel/wire.py: calls, payload bytes and ms per step, rank 0). At p ranks the dimensions that
split the model keep their size (tp's all-reduces stay on t ranks, pp's sends between the same
stages, HSDP's shards on s ranks) and the data dimension grows to d = p / (the others' product):
dp for dp x tp, pp x dp and HSDP (dp x fsdp: replicas added, shards kept), fsdp for fsdp x tp.

    step(p) = (measured step - measured collectives) + sum over rows of calls x cost(kind, n, group(p))

the first term the median over rank 0's timed steps of (that step - its collectives); n = payload / calls (the bytes one call is about, the same n as the ring formulas take) and
cost the link's ring formula (predict_comm.collective_ms) or, for a send, one message on one hop.
Every collective is counted exposed: the kit's mesh collectives block the step on CPU (tp's inside
forward and backward, dp's flat all-reduce after backward, FSDP2's on gloo). Weak scaling: each
replica keeps the record's batch. Memory per rank: the record's rank 0, with parameters, gradients
and Adam state divided by d / d0 where the growing dimension shards them (fsdp x tp).
"""
from __future__ import annotations

import math
import statistics
from typing import Any, Mapping, Sequence

from kit.experiments.theory.links import effective_gbps
from kit.experiments.theory.predict_comm import collective_ms

__all__ = ["growing_dimension", "mesh_pieces", "mesh_point", "mesh_ranks", "MESH_FORMULA"]

MESH_FORMULA = ("non-communication time (measured step - measured collectives, rank 0) + every collective "
                "of each mesh dimension on its own group: the data dimension (dp; fsdp in fsdp x tp) on "
                "p / (the others' product) ranks, the others at their recorded size; all exposed")


def growing_dimension(mesh: Mapping[str, int]) -> str:
    """The data dimension, which grows with the ranks: fsdp beside tp, else dp."""
    return "fsdp" if "tp" in mesh and "fsdp" in mesh else "dp"


def mesh_pieces(record: Mapping[str, Any]) -> dict[str, Any]:
    """What the mesh model takes from a record, each piece with where it came from."""
    cfg = record.get("config") or {}
    mesh = {str(k): int(v) for k, v in cfg["mesh"].items()}
    report = ((record.get("comm") or {}).get("report") or {})
    rows = report.get("measured_per_step") or {}
    if not rows:
        raise ValueError(f"this record of mesh {mesh} has no collectives counted per dimension "
                         "(comm.report.measured_per_step): give the record run() returned for the mesh run")
    summary = record.get("summary") or {}
    step_ms = float(((record.get("spread") or {}).get("step_ms") or {}).get("median", summary.get("step_ms")) or 0)
    comm_ms = sum(float(r["ms"]) for r in rows.values())
    # The non-communication time from each timed step itself (rank 0: its step - its collectives, the same
    # phases the rows count), median over the steps: a median step less one step's collectives mixed a slow
    # step with a fast one (a dp x tp run: 40 ms where its five steps each kept 16 to 35)
    # (instrument=False: the rows' comm_ms are 0.0, never timed, so only the wire's own times are used;
    # record_readers.phases_timed, which theory/ does not import)
    untimed = cfg.get("instrument", True) is False
    timed = [] if untimed else [s for s in record.get("steps") or []
                                if s.get("rank") == 0 and s.get("step_ms") is not None and s.get("comm_ms") is not None]
    other_ms = (statistics.median(max(0.0, float(s["step_ms"]) - float(s["comm_ms"])) for s in timed) if timed
                else max(0.0, step_ms - comm_ms))
    mem = (record.get("memory") or [{}])[0]
    samples = float(summary.get("throughput_samples_s") or 0) * float(summary.get("step_ms") or 0) / 1e3
    grow = growing_dimension(mesh)
    return {"run_id": record.get("run_id"), "label": record.get("label"), "strategy": cfg.get("strategy"),
            "mesh": mesh, "grows": grow, "fixed_ranks": math.prod(v for k, v in mesh.items() if k != grow),
            "world_size": math.prod(mesh.values()), "step_ms": step_ms, "collectives_ms": comm_ms,
            "other_ms": other_ms, "samples_per_step": samples,
            "collectives": {k: {"calls": int(r["calls"]), "payload_bytes": float(r["payload_bytes"])}
                            for k, r in rows.items()},
            "memory_mib": {k: float(mem.get(k) or 0.0) for k in
                           ("params_mib", "grads_mib", "optimizer_mib", "activations_mib")},
            "device_type": (record.get("env") or {}).get("device_type"),
            "how": "step: median of the measured steps; collectives: rank 0's last measured step "
                   "(calls, bytes, ms per dimension and kind); other: median over rank 0's measured steps of "
                   "(step - its collectives)" if timed else "step: median of the measured steps; collectives: "
                   "rank 0's last measured step (calls, bytes, ms per dimension and kind); other = step - collectives"}


def mesh_ranks(ranks: Sequence[int], fixed: int) -> list[int]:
    """The rank counts a mesh can have (multiples of the fixed dimensions' product), from that product."""
    return sorted({int(r) for r in ranks if int(r) >= fixed and int(r) % fixed == 0} | {fixed})


def _send_ms(chain: Sequence[Any], nbytes: float) -> float:
    """One point-to-point message on one hop of every link of the chain."""
    if nbytes <= 0:
        return 0.0
    return 1e3 * sum((link.base_us + link.hop_us) * 1e-6
                     + nbytes / (effective_gbps(nbytes, 1, link.gbps, link.efficiency, link.chunk_half_bytes) * 1e9)
                     for link in chain)


def _cost_ms(kind: str, chain: Sequence[Any], nbytes: float, group: int) -> float:
    if kind == "send":
        return _send_ms(chain, nbytes)
    if kind in ("all_reduce", "all_gather", "reduce_scatter"):
        return collective_ms(kind, chain, nbytes, group)
    raise ValueError(f"a mesh collective of kind {kind!r} has no cost model; the mesh prediction takes "
                     "all_reduce, all_gather, reduce_scatter and send")


def mesh_point(mp: Mapping[str, Any], p: int, chain: Sequence[Any]) -> dict[str, Any]:
    """The predicted step at p ranks (a multiple of the fixed dimensions' product)."""
    d = p // mp["fixed_ranks"]
    d0 = mp["mesh"][mp["grows"]]
    by_row = {}
    for key, row in mp["collectives"].items():
        dim, kind = key.split("/", 1)
        group = d if dim == mp["grows"] else mp["mesh"][dim]
        calls = row["calls"]
        by_row[key] = calls * _cost_ms(kind, chain, row["payload_bytes"] / calls, group) if calls else 0.0
    comm = sum(by_row.values())
    step = mp["other_ms"] + comm
    mem = dict(mp["memory_mib"])
    if mp["grows"] == "fsdp":  # FSDP shards parameters, gradients and Adam state over the growing dimension
        for k in ("params_mib", "grads_mib", "optimizer_mib"):
            mem[k] *= d0 / d
    mem["total_mib"] = sum(mem.values())
    samples = mp["samples_per_step"] * d / d0  # weak scaling: each replica keeps its batch
    return {"ranks": p, "predicted": True, "mesh": {**mp["mesh"], mp["grows"]: d}, "step_ms": step,
            "other_ms": mp["other_ms"], "comm_ms": comm, "comm_overlap_ms": 0.0, "comm_exposed_ms": comm,
            "comm_ms_by_collective": by_row, "throughput_samples_s": samples * 1e3 / step if step else 0.0,
            "memory_mib": mem}
