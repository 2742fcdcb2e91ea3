"""Predictions for sharding and compression: ZeRO memory per rank, bytes on the wire per step.

Pure Python (no torch): the ranks put these numbers into the record beside what they measured,
and the kernel can recompute them for a sweep without starting a rank.

Sources (see docs/strategies.md):
- ZeRO memory, Rajbhandari et al. 2020 (arXiv:1910.02054), Fig. 1 / Sec. 5: mixed-precision Adam
  keeps 2 (fp16 params) + 2 (fp16 grads) + K=12 (fp32 master params, m, v) bytes per parameter.
  The kit trains fp32 Adam (autocast keeps fp32 weights): 4 + 4 + 8 bytes per parameter.
- Bytes on the wire, ring algorithms (Thakur, Rabenseifner, Gropp 2005; nccl-tests PERFORMANCE.md):
  all_reduce sends 2(N-1)/N * S per rank, reduce_scatter and all_gather (N-1)/N * S.
- PowerSGD, Vogels et al. 2019 (arXiv:1905.13727) and torch's powerSGD_hook.py: an n x m gradient
  is sent as P (n x r) and Q (m x r); compressed only when (n + m) r * 2 < n m.
"""
from __future__ import annotations

from typing import Any

from kit.experiments.theory.links import ring_factor
from kit.units import MIB

__all__ = ["zero_bytes_per_param", "zero_prediction", "wire_prediction",
           "powersgd_elements", "break_even_gbps", "ZERO_STAGE"]

# Which ZeRO stage each kit strategy is (fsdp depends on reshard_after_forward).
ZERO_STAGE = {"ddp": 0, "zero1": 1}


def zero_bytes_per_param(stage: int, world_size: int, mixed: bool = False) -> dict[str, float]:
    """Bytes per parameter on one rank for params, grads and optimizer state at a ZeRO stage.

    fp32 Adam: params 4, grads 4, optimizer 8 (m, v). Mixed precision (the paper's numbers):
    params 2, grads 2, optimizer 12 (fp32 master copy + m + v). Stage 1 shards the optimizer
    state, stage 2 also the gradients, stage 3 also the parameters, each over N ranks.
    """
    p, g, o = (2.0, 2.0, 12.0) if mixed else (4.0, 4.0, 8.0)
    n = float(world_size)
    return {"params": p / n if stage >= 3 else p, "grads": g / n if stage >= 2 else g,
            "optimizer": o / n if stage >= 1 else o}


def _formula(stage: int, mixed: bool) -> str:
    p, g, o = ("2", "2", "12") if mixed else ("4", "4", "8")
    return {0: f"{p} + {g} + {o} = 16 bytes/param (replicated on every rank)",
            1: f"{p} + {g} + {o}/N bytes/param (ZeRO-1: optimizer state sharded)",
            2: f"{p} + ({g} + {o})/N bytes/param (ZeRO-2: + gradients sharded)",
            3: f"({p} + {g} + {o})/N = 16/N bytes/param (ZeRO-3: + parameters sharded)"}[stage]


def zero_prediction(stage: int, n_params: int, world_size: int) -> dict[str, Any]:
    """Predicted MiB per rank (fp32, what the kit trains) plus the mixed-precision variant."""
    out: dict[str, Any] = {"stage": stage, "world_size": world_size, "n_params": n_params,
                           "source": "Rajbhandari et al. 2020, ZeRO (arXiv:1910.02054)"}
    for name, mixed in (("fp32", False), ("mixed", True)):
        b = zero_bytes_per_param(stage, world_size, mixed)
        out[name] = {"formula": _formula(stage, mixed), "bytes_per_param": b,
                     **{f"{k}_mib": v * n_params / MIB for k, v in b.items()},
                     "total_mib": sum(b.values()) * n_params / MIB}
    return out


def wire_prediction(collectives: list[tuple[str, int]], world_size: int) -> dict[str, Any]:
    """Sum (op, payload bytes) per step into bytes sent per rank, labelled predicted.

    "broadcast" is ZeroRedundancyOptimizer's parameter sync: every rank broadcasts its shard
    S/N once, so averaged over ranks each sends (N-1)/N * S, the same as an all_gather.
    """
    per_op: dict[str, dict[str, float]] = {}
    for op, nbytes in collectives:
        d = per_op.setdefault(op, {"payload_bytes": 0, "wire_bytes_per_rank": 0.0})
        d["payload_bytes"] += nbytes
        d["wire_bytes_per_rank"] += ring_factor(op, world_size) * nbytes
    return {"kind": "predicted from the algorithm (ring), not measured",
            "formula": "all_reduce 2(N-1)/N*S; reduce_scatter, all_gather, broadcast (N-1)/N*S",
            "per_op": per_op,
            "payload_bytes_per_step": int(sum(d["payload_bytes"] for d in per_op.values())),
            "wire_bytes_per_rank": sum(d["wire_bytes_per_rank"] for d in per_op.values())}


def powersgd_elements(shapes: list[tuple[int, ...]], rank: int, min_compression_rate: float = 2.0) -> dict[str, int]:
    """Elements sent for one bucket by torch's powerSGD_hook (same rule as its _should_compress).

    Each gradient is viewed as (shape[0], rest); a matrix is sent as P and Q when
    (n + m) r * min_compression_rate < n m, else (vectors, small matrices) as is.
    """
    before = after = 0
    for shape in shapes:
        n = shape[0] if shape else 1
        m = 1
        for s in shape[1:]:
            m *= s
        r = min(n, m, rank)
        before += n * m
        after += (n + m) * r if (n + m) * r * min_compression_rate < n * m else n * m
    return {"numel_before": before, "numel_after": after}


def break_even_gbps(saved_wire_bytes: float, extra_compute_ms: float) -> float | None:
    """Link bandwidth (GB/s) below which compression wins: the time the saved bytes would take
    on the wire equals the time compressing costs. None when compression costs nothing extra."""
    if extra_compute_ms <= 0:
        return None
    return saved_wire_bytes / (extra_compute_ms * 1e-3) / 1e9
