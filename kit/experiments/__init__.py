"""Experiments: run a built-in workload under one parallelism strategy and measure it.

    from kit.experiments import ExperimentConfig, run, table
    rec = run(ExperimentConfig(strategy="ddp", workload="mlp", bucket_cap_mb=5))
    res = compare(ExperimentConfig(strategy="dp"), ExperimentConfig(strategy="ddp"))
    print(res["summary"])   # "ddp is 1.21x slower than dp (95% CI ...)" or "same within noise"

Importing this package is light (no torch): the kernel builds configs and calls `run`;
the strategies (ddp.py, dp.py, pipeline.py, ...) are imported only inside the worker ranks.
"""
from __future__ import annotations


from kit._lazy import lazy_getattr

__all__ = ["ExperimentConfig", "run", "sweep", "compare", "conclude", "load_jsonl", "table", "collective_benchmark", "predict", "plan"]

_LAZY = {
    "ExperimentConfig": "kit.experiments.config",
    "ExperimentConfigError": "kit.experiments.config",
    "run": "kit.experiments.api",
    "sweep": "kit.experiments.api",
    "compare": "kit.experiments.comparison",
    "conclude": "kit.experiments.comparison",
    "combine_repeats": "kit.experiments.records",
    "load_jsonl": "kit.experiments.records",
    "append_jsonl": "kit.experiments.records",
    "table": "kit.experiments.records",
    "memmap_benchmark": "kit.experiments.memmap_bench",
    "collective_benchmark": "kit.experiments.collectives",
    "allreduce_algorithms_benchmark": "kit.experiments.allreduce_algos",
    "compression_break_even_sweep": "kit.experiments.compression_bench",
    "predict": "kit.experiments.prediction",  # kit.prediction/1; docs/predicting.md
    "plan": "kit.experiments.theory.plan",  # layouts of a model on a cluster, no torch; docs/predicting.md
}


__getattr__ = lazy_getattr(__name__, _LAZY)
