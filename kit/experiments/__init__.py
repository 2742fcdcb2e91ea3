"""Experiments: run a built-in workload under one parallelism strategy and measure it.

    from kit.experiments import ExperimentConfig, run, table
    rec = run(ExperimentConfig(strategy="ddp", workload="mlp", bucket_cap_mb=5))

Importing this package is light (no torch): the kernel builds configs and calls `run`;
the strategies (ddp.py, dp.py, pipeline.py, ...) are imported only inside the worker ranks.
"""
from __future__ import annotations

from typing import Any

__all__ = ["ExperimentConfig", "run", "sweep", "load_jsonl", "table", "collective_benchmark"]

_LAZY = {
    "ExperimentConfig": "kit.experiments.config",
    "ExperimentConfigError": "kit.experiments.config",
    "run": "kit.experiments.api",
    "sweep": "kit.experiments.api",
    "load_jsonl": "kit.experiments.records",
    "append_jsonl": "kit.experiments.records",
    "table": "kit.experiments.records",
    "collective_benchmark": "kit.experiments.collectives",
}


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        import importlib

        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'kit.experiments' has no attribute {name!r}")
