"""How much of the peak a training step's matmuls reach, by their shape (pure Python; predicted).

One utilisation constant for every layout cannot tell a 1.7B model from a 1T one: the per-GPU matmuls of a
layer are (tokens x h) by (h x h/tp) and (h x 4h/tp), and a narrow one (small h/tp) keeps fewer tensor
cores busy per byte it loads and spends relatively longer in the kernels around it (norms, activations,
softmax, which scale with h where the matmuls scale with h^2). The efficiency here rises with the
per-GPU width w = h/tp in Hockney's n_1/2 form (the form links.py uses for message sizes):

    efficiency(w) = E_MAX * w / (w + W_HALF)

E_MAX and W_HALF are fitted, not sourced: `bench/bench_plan_published.py --fit` fits them on half of the
published runs in data/published_runs.json (every other run) and reports the other half, so a reader sees
how well the form generalises; docs/predicting.md states the values and the held-out error. Applied to
the hardware FLOPs (the recompute included), end to end: it also carries what the planner does not
model (data loading, kernel launch gaps, the optimizer's own kernels beyond its memory traffic).
"""
from __future__ import annotations

__all__ = ["E_MAX", "W_HALF", "gemm_efficiency"]

E_MAX = 0.62      # fitted (bench_plan_published.py --fit); see the module docstring
W_HALF = 0.0      # fitted: the per-GPU width at which half of E_MAX is reached (0: no width effect)


def gemm_efficiency(hidden: int, tp: int, e_max: float = E_MAX, w_half: float = W_HALF) -> float:
    """The share of the dense peak a layer's matmuls sustain at per-GPU width hidden/tp."""
    w = hidden / max(tp, 1)
    return e_max * w / (w + w_half)
