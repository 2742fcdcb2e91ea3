"""Refusals for tensor, sequence, context and expert parallelism and meshes, before any rank starts.

Pure Python (no torch); `config_rules.check` calls `check_parallel`. Each message says the fix.
"""
from __future__ import annotations

import math
from typing import Any

from kit.experiments.choices import GPT_HEADS_HIDDEN, GPT_SEQ, MESH_DIMS, MODEL_SPLIT

__all__ = ["check_parallel", "tp_size"]


def tp_size(cfg: Any) -> int:
    """Ranks that split each layer: the mesh's tp dimension, else the world."""
    return int(cfg.mesh["tp"]) if cfg.mesh else int(cfg.world_size)


def _divisors(n: int) -> list[int]:
    return [d for d in range(1, n + 1) if n % d == 0]


def _check_mesh(cfg: Any, err: type[Exception]) -> None:
    if cfg.mesh is None:
        return
    if cfg.strategy != "tp":
        raise err(f"mesh={cfg.mesh} composes data and tensor parallelism with strategy='tp'; "
                  "set strategy='tp' (fsdp x tp and pp x dp: kit.experiments.check_mesh on 4 ranks)")
    if not isinstance(cfg.mesh, dict) or set(cfg.mesh) != set(MESH_DIMS) or list(cfg.mesh) != list(MESH_DIMS):
        raise err(f"mesh={cfg.mesh!r} must name the dimensions {list(MESH_DIMS)} in that order, "
                  "e.g. mesh={'dp': 2, 'tp': 2}")
    for k, v in cfg.mesh.items():
        if isinstance(v, bool) or not isinstance(v, int) or v < 1:
            raise err(f"mesh[{k!r}]={v!r} must be an integer >= 1")
    if math.prod(cfg.mesh.values()) != cfg.world_size:
        raise err(f"mesh={cfg.mesh} needs {math.prod(cfg.mesh.values())} ranks but world_size={cfg.world_size}; "
                  f"set world_size={math.prod(cfg.mesh.values())} or sizes that multiply to {cfg.world_size}")
    if cfg.batch_size % cfg.mesh["dp"]:
        raise err(f"batch_size={cfg.batch_size} does not split over mesh dp={cfg.mesh['dp']} replicas; "
                  f"use a multiple of {cfg.mesh['dp']}")


def _check_split(cfg: Any, err: type[Exception]) -> None:
    heads, hidden = GPT_HEADS_HIDDEN[cfg.model_size]
    t = tp_size(cfg)
    if cfg.strategy in ("tp", "sp") and (heads % t or hidden % t):
        fits = [s for s, (h, d) in GPT_HEADS_HIDDEN.items() if h % t == 0 and d % t == 0]
        raise err(f"{cfg.strategy} over {t} ranks must divide the heads ({heads}) and hidden size ({hidden}) of "
                  f"model_size={cfg.model_size!r}; split over a number of ranks in {_divisors(heads)}"
                  + (f" or model_size in {fits}" if fits else ""))
    chunks = 2 * t if cfg.strategy == "cp" and cfg.zigzag else t
    if cfg.strategy in ("sp", "cp") and GPT_SEQ % chunks:
        raise err(f"{cfg.strategy} splits the {GPT_SEQ}-token sequence into {chunks} equal chunks; "
                  f"use world_size in {[d for d in _divisors(GPT_SEQ) if d > 1 and GPT_SEQ % (2 * d if cfg.zigzag else d) == 0]}")


def _check_experts(cfg: Any, err: type[Exception]) -> None:
    for name in ("experts", "top_k"):
        v = getattr(cfg, name)
        if isinstance(v, bool) or not isinstance(v, int) or v < 1:
            raise err(f"{name}={v!r} must be an integer >= 1")
    if cfg.strategy == "ep" and cfg.experts % cfg.world_size:
        raise err(f"experts={cfg.experts} do not split over world_size={cfg.world_size} ranks; "
                  f"use experts in {[cfg.world_size * k for k in (1, 2, 4)]}")
    if cfg.top_k > cfg.experts:
        raise err(f"top_k={cfg.top_k} is more than experts={cfg.experts}; use top_k <= {cfg.experts} (Switch: 1, GShard: 2)")
    cf = cfg.capacity_factor
    if cf is not None and (isinstance(cf, bool) or not isinstance(cf, (int, float)) or cf <= 0):
        raise err(f"capacity_factor={cf!r} must be None (no token dropped) or a number > 0, e.g. 1.25")


def check_parallel(cfg: Any, err: type[Exception]) -> None:
    """Mesh shape, the tp/sp/cp/ep splits against the model, and what these strategies support."""
    _check_mesh(cfg, err)
    _check_experts(cfg, err)
    if cfg.strategy not in MODEL_SPLIT + ("ep",):
        return
    if cfg.workload != "gpt":
        raise err(f"strategy={cfg.strategy!r} splits the transformer's heads, MLP, sequence or experts; "
                  "set workload='gpt'")
    if cfg.precision != "fp32" or cfg.activation_checkpointing:
        raise err(f"strategy={cfg.strategy!r} is hand-written for fp32 without checkpointing; "
                  "set precision='fp32' and activation_checkpointing=False")
    _check_split(cfg, err)
