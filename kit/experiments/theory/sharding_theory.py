"""Predictions for sharding and compression: ZeRO memory per rank, bytes on the wire per step.

Pure Python (no torch): the ranks put these numbers into the record beside what they measured,
and the kernel can recompute them for a sweep without starting a rank.

Sources (see docs/strategies.md):
- ZeRO memory, Rajbhandari et al. 2020 (arXiv:1910.02054), Fig. 1 / Sec. 5: mixed-precision Adam
  keeps 2 (fp16 params) + 2 (fp16 grads) + K=12 (fp32 master params, m, v) bytes per parameter.
  The kit trains fp32 Adam (autocast keeps fp32 weights): 4 + 4 + 8 bytes per parameter. Both rows are
  the planner's (layout_memory.PLAN_PRECISIONS "fp32" and "bf16-bf16grads"), read by
  parallel_memory.zero_bytes_per_param (re-exported here): one table of bytes per parameter. A run's
  prediction (zero_prediction) goes through parallel_memory.state_mib, which adds Adam's `step`, 4 bytes
  per parameter tensor: the planner leaves it out, a few hundred tensors beside billions of parameters.
- Bytes on the wire, ring algorithms (Thakur, Rabenseifner, Gropp 2005; nccl-tests PERFORMANCE.md):
  all_reduce sends 2(N-1)/N * S per rank, reduce_scatter and all_gather (N-1)/N * S.
- PowerSGD, Vogels et al. 2019 (arXiv:1905.13727) and torch's powerSGD_hook.py: an n x m gradient
  is sent as P (n x r) and Q (m x r); compressed only when (n + m) r * 2 < n m.
"""
from __future__ import annotations

from typing import Any

from kit.experiments.theory.links import ring_factor
from kit.experiments.theory.parallel_memory import state_mib, zero_bytes_per_param

__all__ = ["zero_bytes_per_param", "zero_prediction", "wire_prediction",
           "powersgd_elements", "break_even_gbps", "ZERO_STAGE"]

# Which ZeRO stage each kit strategy is (fsdp depends on reshard_after_forward).
ZERO_STAGE = {"ddp": 0, "zero1": 1}


def _formula(stage: int, mixed: bool) -> str:
    p, g, o = (f"{b:g}" for b in zero_bytes_per_param(0, 1, mixed).values())
    return {0: f"{p} + {g} + {o} = 16 bytes/param (replicated on every rank)",
            1: f"{p} + {g} + {o}/N bytes/param (ZeRO-1: optimizer state sharded)",
            2: f"{p} + ({g} + {o})/N bytes/param (ZeRO-2: + gradients sharded)",
            3: f"({p} + {g} + {o})/N = 16/N bytes/param (ZeRO-3: + parameters sharded)"}[stage]


def zero_prediction(stage: int, n_params: int, world_size: int, n_tensors: int,
                    whole_tensors: bool = False) -> dict[str, Any]:
    """Predicted MiB per rank (fp32, what the kit trains) plus the mixed-precision variant, each through
    parallel_memory.state_mib: the bytes per parameter above plus Adam's `step` per tensor (`whole_tensors`:
    torch's ZeroRedundancyOptimizer gives each rank whole tensors, so a rank keeps tensors / N steps on average;
    FSDP splits every tensor, so every rank keeps all of them)."""
    out: dict[str, Any] = {"stage": stage, "world_size": world_size, "n_params": n_params, "n_tensors": n_tensors,
                           "source": "Rajbhandari et al. 2020, ZeRO (arXiv:1910.02054); torch.optim.Adam's step"}
    for name, mixed in (("fp32", False), ("mixed", True)):
        st = state_mib(n_params, n_tensors, world_size, over="N", stage=stage, whole_tensors=whole_tensors, mixed=mixed)
        step = "tensors / N" if whole_tensors and world_size > 1 else "tensors"
        out[name] = {"formula": f"{_formula(stage, mixed)} + 4 bytes x {step} (Adam's step)",
                     "formula_by_kind": st["formula"], "bytes_per_param": zero_bytes_per_param(stage, world_size, mixed),
                     **{k: st[k] for k in ("params_mib", "grads_mib", "optimizer_mib")},
                     "total_mib": st["params_mib"] + st["grads_mib"] + st["optimizer_mib"]}
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
