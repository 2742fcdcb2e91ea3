"""Which class runs a config's strategy: one line per strategy, imported only when used.

A value is "module:Class" under kit.experiments.strategies; the module (and torch) is imported
on a rank, when a run asks for it. Adding a strategy: its file here, one line below, and its
name in config.STRATEGIES (docs/architecture.md, "Adding a strategy").
"""
from __future__ import annotations

import importlib
from typing import Any

__all__ = ["STRATEGY_CLASSES", "strategy_class", "build_strategy"]

STRATEGY_CLASSES: dict[str, str] = {
    "single": "single:Single",
    "ddp": "ddp:DDPStrategy",
    "ddp+compression": "compression:CompressedDDP",  # ddp with compression != "none"
    "naive_dp": "ddp:NaiveDataParallel",
    "dp": "dp:DataParallelStrategy",
    "zero1": "sharding:ZeRO1Strategy",
    "fsdp": "sharding:FSDPStrategy",
    "param_server": "param_server:ParamServer",
    "accelerate": "hf_accelerate:AccelerateStrategy",
    "model_parallel": "model_parallel:ModelParallel",
    "pipeline": "pipeline:Pipeline",
    "tp": "parallel_gpt:TensorParallel",
    "tp+mesh": "mesh_strategies:MeshTensorParallel",  # tp with mesh={"dp" | "fsdp": d, "tp": t}
    "pipeline+mesh": "mesh_strategies:MeshPipeline",  # pipeline with mesh={"pp": p, "dp": d}
    "sp": "parallel_gpt:SequenceParallel",
    "cp": "parallel_gpt_cp_ep:ContextParallel",
    "ep": "parallel_gpt_cp_ep:ExpertParallel",
}


def strategy_class(cfg: Any) -> type:
    """The class for `cfg.strategy` (DDP with a comm-hook compression, and a strategy on a mesh, are
    their own classes)."""
    key = "ddp+compression" if cfg.strategy == "ddp" and cfg.compression != "none" else cfg.strategy
    if getattr(cfg, "mesh", None):
        key += "+mesh"
    module, _, name = STRATEGY_CLASSES[key].partition(":")
    return getattr(importlib.import_module(f"kit.experiments.strategies.{module}"), name)


def build_strategy(cfg: Any, model: Any, loss_fn: Any, device: Any, clock: Any) -> Any:
    return strategy_class(cfg)(cfg, model, loss_fn, device, clock)
