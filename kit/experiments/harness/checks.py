"""Run several strategy checks in one process group (starting ranks is the slow part).

`run_checks([("tp", {...}), ("cp", {...})])` on every rank returns each check's result in order;
tests and bench/bench_parallelisms.py call it through `kit.experiments.harness.local.run_local`.
"""
from __future__ import annotations

import importlib
from typing import Any

import torch.distributed as dist

__all__ = ["CHECKS", "run_checks"]

CHECKS = {
    "tp": "kit.experiments.parallel.tensor:check_tp",
    "ring_attention": "kit.experiments.parallel.context:check_ring_attention",
    "ep": "kit.experiments.parallel.expert:check_ep",
    "sp": "kit.experiments.parallel.sequence:check_sp",
    "mesh": "kit.experiments.parallel.mesh:check_mesh",
}


def run_checks(items: list[tuple[str, dict[str, Any]]]) -> list[dict[str, Any]]:
    out = []
    for name, kw in items:
        mod, fn = CHECKS[name].split(":")
        out.append(getattr(importlib.import_module(mod), fn)(**kw))
        dist.barrier()
    return out
