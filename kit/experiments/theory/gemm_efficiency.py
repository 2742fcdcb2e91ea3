"""How much of the peak a layer's matmuls reach, by their size (pure Python; predicted).

One utilisation constant for every layout cannot tell a 1.7B model from a 1T one, nor tp=1 from tp=8 at
micro-batch 1: a small per-GPU matmul (few tokens, narrow h/tp) keeps fewer tensor cores busy. The shape
of the curve is Calculon's (Isaev et al., SC23; calculon-ai/calculon systems/a100_80g.json, which it
calibrated on Korthikanti et al.'s step times): a matmul of at least 128 GFLOP runs at 0.95 of its best,
16 GFLOP at 0.90, 1 GFLOP at 0.60, smaller at 0.10 (the first threshold at or below the size). A layer's
efficiency is its matmuls' FLOPs over the time they take at those rates (Q, K, V and the output
projection; the MLP's two or three matrices, each per GPU after tp).

The level, `E_MAX` (what the largest matmuls reach end to end), is fitted, not sourced:
`bench/bench_plan_published.py --fit` fits it on every other published run in data/published_runs.json and
reports the other half, so a reader sees whether it generalises; docs/predicting.md states the value. It
is applied to the hardware FLOPs (recompute included) and so also carries what the planner does not
model (data loading, launch gaps, the optimizer's kernels beyond their memory traffic).
"""
from __future__ import annotations

from functools import lru_cache
from typing import Any

__all__ = ["E_MAX", "SIZE_EFFICIENCY", "gemm_efficiency"]

E_MAX = 0.64   # fitted (bench_plan_published.py --fit); see the module docstring
# (GFLOP of one matmul, share of E_MAX it reaches): Calculon's a100_80g.json "gflops_efficiency", over its 0.95
SIZE_EFFICIENCY = ((128.0, 0.95 / 0.95), (16.0, 0.90 / 0.95), (1.0, 0.60 / 0.95), (0.0, 0.10 / 0.95))


def _share(gflop: float) -> float:
    return next(e for size, e in SIZE_EFFICIENCY if gflop >= size)


@lru_cache(maxsize=4096)  # a plan asks for a few dozen (tp, tokens) thousands of times; the spec is frozen
def gemm_efficiency(m: Any, tp: int, tokens: float, e_max: float = E_MAX) -> float:
    """The share of the dense peak a layer's matmuls sustain: `tokens` per micro-batch on this GPU."""
    h, q = m.hidden, m.heads * m.head_dim
    kv = 2 * m.kv_heads * m.head_dim
    mlp = [m.ffn] * (3 if m.gated_mlp else 2)
    shapes = [(h, q + kv), (q, h)] + [(h, f) for f in mlp]   # (in, out) before the tp split
    flops = [2 * tokens * a * b / tp for a, b in shapes]
    seconds = sum(f / _share(f / 1e9) for f in flops)
    return e_max * sum(flops) / seconds
