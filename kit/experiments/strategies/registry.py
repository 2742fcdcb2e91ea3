"""Which class runs a config's strategy: one line per strategy, imported only when used.

A value is "module:Name" under kit.experiments.strategies; the module (and torch) is imported
on a rank, when a run asks for it. Adding a strategy: its file here, one line below, and its
name in choices.STRATEGIES (docs/architecture.md, "Adding a strategy"). The hand-written
parallelisms share one class, hand_parallel.HandParallel, given their parts (`HAND_PARTS`).
"""
from __future__ import annotations

import importlib
from typing import Any

__all__ = ["STRATEGY_CLASSES", "ON_A_MESH", "WITH_COMPRESSION", "HAND_PARTS", "HAND_PARTS_ON_A_MESH", "strategy_class",
           "hand_parts", "build_strategy"]

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
    "tp": "hand_parallel:HandParallel",
    "sp": "hand_parallel:HandParallel",
    "cp": "hand_parallel:HandParallel",
    "ep": "hand_parallel:HandParallel",
}
# A strategy on a mesh (ExperimentConfig.mesh; choices.MESH_DIMS says which meshes each takes) ...
ON_A_MESH: dict[str, str] = {
    "tp": "hand_parallel:HandParallel",  # {"dp" | "fsdp": d, "tp": t}
    "pipeline": "pipeline:Pipeline",  # {"pp": p, "dp": d}: the stages on pp, then data parallel over dp
    "fsdp": "mesh_strategies:HSDPStrategy",  # {"dp": r, "fsdp": s}: FSDP2 replicated over dp, sharded over fsdp
}
# ... and with a gradient compression hook (compression != "none").
WITH_COMPRESSION: dict[str, str] = {"ddp": "compression:CompressedDDP"}
# The parts HandParallel runs each hand-written parallelism with (hand_parallel.HandParts) ...
HAND_PARTS: dict[str, str] = {"tp": "hand_parts:TP", "sp": "hand_parts:SP", "cp": "hand_parts:CP", "ep": "hand_parts:EP"}
# ... and tp on a mesh, by the mesh's dimensions (tp's parts with the mesh's groups, model and check).
HAND_PARTS_ON_A_MESH: dict[tuple[str, ...], str] = {("dp", "tp"): "mesh_strategies:DP_X_TP",
                                                    ("fsdp", "tp"): "mesh_strategies:FSDP_X_TP"}


def strategy_class(cfg: Any) -> type:
    """The class that runs `cfg`: its strategy's, or the one for that strategy on a mesh or with
    compression."""
    if getattr(cfg, "mesh", None):
        where = ON_A_MESH[cfg.strategy]
    elif getattr(cfg, "compression", "none") != "none":
        where = WITH_COMPRESSION[cfg.strategy]
    else:
        where = STRATEGY_CLASSES[cfg.strategy]
    return _load(where)


def hand_parts(cfg: Any) -> Any:
    """The parts (hand_parallel.HandParts) HandParallel runs `cfg` with, or None for another strategy."""
    mesh = getattr(cfg, "mesh", None)
    where = HAND_PARTS_ON_A_MESH.get(tuple(mesh)) if mesh else HAND_PARTS.get(cfg.strategy)
    return _load(where) if where else None


def build_strategy(cfg: Any, model: Any, loss_fn: Any, device: Any, clock: Any) -> Any:
    parts = hand_parts(cfg)
    if parts is not None:  # HandParallel, given the parallelism's parts
        return strategy_class(cfg)(cfg, model, loss_fn, device, clock, parts)
    return strategy_class(cfg)(cfg, model, loss_fn, device, clock)


def _load(where: str) -> Any:
    module, _, name = where.partition(":")
    return getattr(importlib.import_module(f"kit.experiments.strategies.{module}"), name)
