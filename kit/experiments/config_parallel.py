"""Refusals for tensor, sequence, context and expert parallelism and meshes, before any rank starts.

Pure Python (no torch); `config_rules.check` calls `check_parallel`. Each message says the fix.
"""
from __future__ import annotations

import math
from typing import Any

from kit.experiments.choices import (
    DEFAULT_STRATEGY, GLOBAL_BATCH, GPT_HEADS_HIDDEN, GPT_SEQ, HAND_WRITTEN, KNOB_OWNERS, MESH_DIMS, SPLITS_SEQUENCE,
    SPLITS_WEIGHTS, STAGE_BLOCKS,
)

__all__ = ["check_parallel", "tp_size", "split_fits", "mesh_owner", "strategy_from_mesh"]


def tp_size(cfg: Any) -> int:
    """Ranks that split each layer: the mesh's tp dimension, else the world."""
    return int(cfg.mesh.get("tp", 1)) if cfg.mesh else int(cfg.world_size)


def split_fits(strategy: str, model_size: str, ranks: int) -> bool:
    """False when tp or sp over `ranks` ranks cannot split model_size's heads and hidden size evenly
    (the tiny gpt has 1 head); other strategies do not split them."""
    heads, hidden = GPT_HEADS_HIDDEN[model_size]
    return strategy not in SPLITS_WEIGHTS or (heads % ranks == 0 and hidden % ranks == 0)


def _divisors(n: int) -> list[int]:
    return [d for d in range(1, n + 1) if n % d == 0]


def mesh_owner(mesh: Any) -> str | None:
    """The strategy that takes a mesh with these dimensions (in any order), or None."""
    if not isinstance(mesh, dict) or not mesh:
        return None
    return next((s for s, shapes in MESH_DIMS.items() if any(set(d) == set(mesh) for d in shapes)), None)


def strategy_from_mesh(cfg: Any) -> None:
    """A mesh names its strategy: mesh={"dp": 2, "tp": 2} runs tp, mesh={"pp": 2, "dp": 2} the pipeline
    and mesh={"dp": 2, "fsdp": 2} fsdp (HSDP), with `strategy` left at its default ("ddp", which takes
    no mesh). Any other strategy stays as written, and `_check_mesh` says whether the mesh fits it."""
    owner = mesh_owner(cfg.mesh)
    if owner is not None and cfg.strategy == DEFAULT_STRATEGY:
        object.__setattr__(cfg, "strategy", owner)  # frozen dataclass, as config_rules normalises compression


def _check_mesh(cfg: Any, err: type[Exception]) -> None:
    if cfg.mesh is None:
        return
    known = "; ".join(f"strategy={s!r} with mesh {' x '.join(d)}" for s, shapes in MESH_DIMS.items() for d in shapes)
    if not isinstance(cfg.mesh, dict) or not cfg.mesh:
        raise err(f"mesh={cfg.mesh!r} must be a dict of dimension sizes, e.g. mesh={{'dp': 2, 'tp': 2}} ({known})")
    dims = tuple(cfg.mesh)
    for k, v in cfg.mesh.items():
        if isinstance(v, bool) or not isinstance(v, int) or v < 1:
            raise err(f"mesh[{k!r}]={v!r} must be an integer >= 1")
    owner = mesh_owner(cfg.mesh)
    if owner is None:
        raise err(f"mesh={cfg.mesh} names dimensions {list(dims)} the kit does not compose; use one of: {known}")
    if cfg.strategy != owner:
        raise err(f"mesh={cfg.mesh} runs with strategy={owner!r} (got {cfg.strategy!r}); set strategy={owner!r}")
    order = next(d for d in MESH_DIMS[owner] if set(d) == set(dims))
    if dims != order:
        raise err(f"mesh={cfg.mesh} must name the dimensions {list(order)} in that order (outermost first, as "
                  f"torchtitan), e.g. mesh={ {k: cfg.mesh[k] for k in order} }")
    # Both said at once: a learner who copied `ExperimentConfig(mesh=...)` alone met one refusal, then the next
    ranks, fixes = math.prod(cfg.mesh.values()), []
    if ranks != cfg.world_size:
        fixes.append(f"it needs {ranks} ranks but world_size={cfg.world_size}: set world_size={ranks} or sizes "
                     f"that multiply to {cfg.world_size}")
    if cfg.workload != "gpt":
        fixes.append(f"it is built for the transformer but workload={cfg.workload!r}: set workload='gpt'")
    if fixes:
        raise err(f"mesh={cfg.mesh}: " + "; and ".join(fixes))
    data = next(k for k in dims if k in ("dp", "fsdp"))
    micro = owner in KNOB_OWNERS["micro_batches"]
    parts = cfg.mesh[data] * (cfg.micro_batches if micro else 1)
    if cfg.batch_size % parts and owner in GLOBAL_BATCH:  # HSDP: batch_size is each rank's, as for fsdp
        what = f"{cfg.mesh[data]} replicas x {cfg.micro_batches} micro-batches" if micro \
            else f"mesh {data}={cfg.mesh[data]} replicas"
        raise err(f"batch_size={cfg.batch_size} (the global batch) does not split over {what}; "
                  f"use a multiple of {parts}")
    if owner == "fsdp" and cfg.reshard_after_forward is not True:
        raise err(f"mesh={cfg.mesh} (HSDP) reshards after forward, as ZeRO-3 and its byte formula do; drop "
                  f"reshard_after_forward=False or the mesh")
    blocks = STAGE_BLOCKS["gpt"][cfg.model_size]  # embedding, the transformer blocks, the head
    if cfg.mesh.get("pp", 1) > blocks:
        raise err(f"mesh pp={cfg.mesh['pp']} cuts model_size={cfg.model_size!r} ({blocks} blocks: embedding, "
                  f"{blocks - 2} layers, head) into more stages than blocks; use pp <= {blocks}")


def _check_split(cfg: Any, err: type[Exception]) -> None:
    heads, hidden = GPT_HEADS_HIDDEN[cfg.model_size]
    t = tp_size(cfg)
    if not split_fits(cfg.strategy, cfg.model_size, t):
        fits = [s for s in GPT_HEADS_HIDDEN if split_fits(cfg.strategy, s, t)]
        raise err(f"{cfg.strategy} over {t} ranks must divide the heads ({heads}) and hidden size ({hidden}) of "
                  f"model_size={cfg.model_size!r}; split over a number of ranks in {_divisors(heads)}"
                  + (f" or model_size in {fits}" if fits else ""))
    chunks = 2 * t if cfg.strategy in KNOB_OWNERS["zigzag"] and cfg.zigzag else t
    if cfg.strategy in SPLITS_SEQUENCE and GPT_SEQ % chunks:
        raise err(f"{cfg.strategy} splits the {GPT_SEQ}-token sequence into {chunks} equal chunks; "
                  f"use world_size in {[d for d in _divisors(GPT_SEQ) if d > 1 and GPT_SEQ % (2 * d if cfg.zigzag else d) == 0]}")


def _check_experts(cfg: Any, err: type[Exception]) -> None:
    for name in ("experts", "top_k"):
        v = getattr(cfg, name)
        if isinstance(v, bool) or not isinstance(v, int) or v < 1:
            raise err(f"{name}={v!r} must be an integer >= 1")
    if cfg.strategy in KNOB_OWNERS["experts"] and cfg.experts % cfg.world_size:
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
    if cfg.strategy not in HAND_WRITTEN:
        return
    if cfg.workload != "gpt":
        raise err(f"strategy={cfg.strategy!r} splits the transformer's heads, MLP, sequence or experts; "
                  "set workload='gpt'")
    if cfg.precision != "fp32" or cfg.activation_checkpointing:
        raise err(f"strategy={cfg.strategy!r} is hand-written for fp32 without checkpointing; "
                  "set precision='fp32' and activation_checkpointing=False")
    _check_split(cfg, err)
