"""Plots that compare run records: pure functions, each returning a `matplotlib.figure.Figure`.

Why pure functions of records: the same call draws a figure in a notebook cell, in the lab
bench's image and in a test on the Agg backend, and a saved JSONL file redraws it later.
`import kit.plots` does not import matplotlib; the first plot call does.

    from kit.plots import step_breakdown
    step_breakdown(records)          # a Figure; Jupyter displays it inline

Colours are Okabe-Ito; hatching "//" marks emulated links, ".." formula predictions.
"""
from __future__ import annotations


from kit._lazy import lazy_dir, lazy_getattr

__all__ = [
    "step_breakdown",
    "step_segments",
    "step_timeline",
    "memmap_memory",
    "memory_breakdown",
    "comm_vs_knob",
    "scaling",
    "infer_knob",
    "bandwidth",
    "alpha_beta_bw_gbps",
    "scaling_prediction",
    "residuals_plot",
    "local_prediction",
    "plan_layouts",
    "plan_vs_published",
    "bytes_by_collective",
    "expert_load",
    "ring_balance",
    "bubble_model",
    "bytes_per_rank",
    "compression_runs",
    "break_even",
    "PLOTS",
]

_LAZY = {
    "step_breakdown": "kit.plots.steps",
    "step_segments": "kit.plots.steps",
    "step_timeline": "kit.plots.timeline",
    "memmap_memory": "kit.plots.data",
    "memory_breakdown": "kit.plots.memory",
    "comm_vs_knob": "kit.plots.sweeps",
    "scaling": "kit.plots.sweeps",
    "infer_knob": "kit.plots.sweeps",
    "bandwidth": "kit.plots.collectives",
    "alpha_beta_bw_gbps": "kit.plots.collectives",
    "scaling_prediction": "kit.plots.predicted",  # takes a kit.prediction/1, not run records
    "residuals_plot": "kit.plots.predicted",
    "local_prediction": "kit.plots.predicted",  # local_check rows: this machine's step, measured and predicted
    "plan_layouts": "kit.plots.plan",  # takes a kit.experiments.plan result
    "plan_vs_published": "kit.plots.plan",  # takes compare_published results
    "bytes_by_collective": "kit.plots.parallel",  # tp, sp, cp, ep, meshes
    "expert_load": "kit.plots.parallel_load",  # ep runs (or check_ep results)
    "ring_balance": "kit.plots.parallel_load",  # cp runs (or check_ring_attention results)
    "bubble_model": "kit.plots.bubble",  # bench_predict_local.py's bubble rows (formula, predicted, measured)
    "bytes_per_rank": "kit.plots.compression",  # lesson 07: a hand-written ring against gather-to-root
    "compression_runs": "kit.plots.compression",  # lesson 07: bytes, step and loss per compression and link
    "break_even": "kit.plots.compression",  # lesson 07: predicted step against link bandwidth
}

# What the lab bench offers in its "plot" dropdown: menu label -> function name. Every entry
# takes the list of run records and draws what it can (timeline: the last record).
PLOTS: dict[str, str] = {
    "Step time breakdown": "step_breakdown",
    "Memory per rank": "memory_breakdown",
    "Comm overhead & throughput vs knob": "comm_vs_knob",
    "Scaling vs world size": "scaling",
    "Timeline of one step (last run)": "step_timeline",
    "Predicted scaling to 1024 ranks (last run)": "scaling_prediction",  # docs/predicting.md
    "Bytes per collective vs formula": "bytes_by_collective",  # tp, sp, cp, ep, meshes
    "Expert load per layer (ep)": "expert_load",  # routed, kept, dropped
    "Ring attention work per rank (cp)": "ring_balance",
}


__getattr__ = lazy_getattr(__name__, _LAZY)
__dir__ = lazy_dir(globals(), _LAZY)
