"""Which class runs a config's strategy: one line per strategy, imported only when used.

A value is "module:Class" under kit.experiments.strategies; the module (and torch) is imported
on a rank, when a run asks for it. Adding a strategy: its file here, one line below, and its
name in config.STRATEGIES (docs/architecture.md, "Adding a strategy").
"""
from __future__ import annotations

import importlib
from typing import Any

__all__ = ["STRATEGY_CLASSES", "ON_A_MESH", "WITH_COMPRESSION", "strategy_class", "build_strategy"]

STRATEGY_CLASSES: dict[str, str] = {
    "single": "single:Single",
    "ddp": "ddp:DDPStrategy",
    "naive_dp": "ddp:NaiveDataParallel",
    "dp": "dp:DataParallelStrategy",
    "zero1": "sharding:ZeRO1Strategy",
    "fsdp": "sharding:FSDPStrategy",
    "param_server": "param_server:ParamServer",
    "accelerate": "hf_accelerate:AccelerateStrategy",
    "model_parallel": "model_parallel:ModelParallel",
    "pipeline": "pipeline:Pipeline",
    "tp": "parallel_gpt:TensorParallel",
    "sp": "parallel_gpt:SequenceParallel",
    "cp": "parallel_gpt_cp_ep:ContextParallel",
    "ep": "parallel_gpt_cp_ep:ExpertParallel",
}
# A strategy on a mesh (ExperimentConfig.mesh; choices.MESH_DIMS says which meshes each takes) ...
ON_A_MESH: dict[str, str] = {
    "tp": "mesh_strategies:MeshTensorParallel",  # {"dp" | "fsdp": d, "tp": t}
    "pipeline": "pipeline:Pipeline",  # {"pp": p, "dp": d}: the stages on pp, then data parallel over dp
    "fsdp": "mesh_strategies:HSDPStrategy",  # {"dp": r, "fsdp": s}: FSDP2 replicated over dp, sharded over fsdp
}
# ... and with a gradient compression hook (compression != "none").
WITH_COMPRESSION: dict[str, str] = {"ddp": "compression:CompressedDDP"}


def strategy_class(cfg: Any) -> type:
    """The class that runs `cfg`: its strategy's, or the one for that strategy on a mesh or with
    compression."""
    if getattr(cfg, "mesh", None):
        where = ON_A_MESH[cfg.strategy]
    elif getattr(cfg, "compression", "none") != "none":
        where = WITH_COMPRESSION[cfg.strategy]
    else:
        where = STRATEGY_CLASSES[cfg.strategy]
    module, _, name = where.partition(":")
    return getattr(importlib.import_module(f"kit.experiments.strategies.{module}"), name)


def build_strategy(cfg: Any, model: Any, loss_fn: Any, device: Any, clock: Any) -> Any:
    return strategy_class(cfg)(cfg, model, loss_fn, device, clock)
