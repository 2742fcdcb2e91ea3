"""Every refusal of an ExperimentConfig, each saying what to do instead (the choice lists and
strategy groupings it checks against are in choices.py).

Pure Python (no torch). `ExperimentConfig.__post_init__` calls `check`; `check_backend` runs where
the backend is known (api.run before any rank starts, and the rank). The error class is passed in:
config.py imports this module, not the other way round. Accelerate is looked for with
importlib.util.find_spec, which finds the package without importing it (that would import torch).
"""
from __future__ import annotations

import importlib.util
from typing import Any

from kit.experiments.choices import (
    COMPRESSIONS, DATASETS, KNOB_OWNERS, MODEL_SIZES, NEEDS_TWO_RANKS, PRECISIONS, PS_MODES, SCHEDULES,
    SHARDED, STAGE_BLOCKS, STAGED, STRATEGIES, WORKLOADS,
)
from kit.experiments.config_parallel import check_parallel, strategy_from_mesh
from kit.experiments.theory.links import LINKS

__all__ = ["INTERCONNECTS", "INSTALL_HINT", "check", "check_backend"]

# Preset links: (per-step latency alpha_us, peak per-direction GB/s), from links.LINKS, which
# also holds each link's fixed latency and message-size efficiency; sources in docs/hardware.md.
INTERCONNECTS: dict[str, tuple[float, float]] = {k: (v.hop_us, v.gbps) for k, v in LINKS.items()}

INSTALL_HINT = ('pip install "distributed-kit[accelerate]" (or: pip install accelerate -c <(echo torch==$(python -c '
                '"import torch; print(torch.__version__.split(\'+\')[0])")) so pip keeps your torch)')


def _choice(name: str, value: Any, allowed: tuple[str, ...], err: type[Exception]) -> None:
    if value not in allowed:
        raise err(f"{name}={value!r} is not supported; choose one of {', '.join(map(repr, allowed))}")


def _taken(knob: str, cfg: Any) -> bool:
    """Whether cfg's strategy takes `knob` (choices.KNOB_OWNERS)."""
    return cfg.strategy in KNOB_OWNERS[knob]


def _owners(knob: str) -> str:
    """The strategies that take `knob`, for a message: "'ddp'", "'ddp' or 'naive_dp'"."""
    return " or ".join(map(repr, KNOB_OWNERS[knob]))


def _at_least(name: str, value: Any, low: float, err: type[Exception], kind: type = int) -> None:
    ok = (int, float) if kind is float else (int,)
    if isinstance(value, bool) or not isinstance(value, ok):
        what = "a number" if kind is float else "an integer"
        raise err(f"{name}={value!r} must be {what} >= {low}")
    if value < low:
        raise err(f"{name}={value!r} is too small; it must be >= {low}")


def check(cfg: Any, err: type[Exception]) -> None:
    """Raise `err` (ExperimentConfigError) for a bad value or an impossible combination, in the
    order users meet them: choices, the sharding/compression knobs, counts, then combinations."""
    strategy_from_mesh(cfg)  # mesh={"dp": 2, "tp": 2} needs no strategy="tp"
    for name, allowed in (("strategy", STRATEGIES), ("workload", WORKLOADS), ("precision", PRECISIONS),
                          ("schedule", SCHEDULES), ("model_size", MODEL_SIZES), ("dataset", DATASETS)):
        _choice(name, getattr(cfg, name), allowed, err)
    _check_beyond(cfg, err)
    _check_counts(cfg, err)
    _check_strategy_fits(cfg, err)
    _check_link(cfg, err)
    check_parallel(cfg, err)
    _check_stages(cfg, err)


def _check_stages(cfg: Any, err: type[Exception]) -> None:
    """The pipeline's schedule knobs, and enough blocks for world_size x virtual_stages stages."""
    _at_least("virtual_stages", cfg.virtual_stages, 1, err)
    if cfg.virtual_stages > 1 and (not _taken("virtual_stages", cfg) or cfg.schedule != "interleaved_1f1b"):
        raise err(f"virtual_stages={cfg.virtual_stages} (chunks per rank) needs strategy={_owners('virtual_stages')} "
                  f"with schedule='interleaved_1f1b' (got {cfg.strategy!r}, {cfg.schedule!r}); set those or "
                  "virtual_stages=1")
    stages = cfg.mesh["pp"] if cfg.mesh and "pp" in cfg.mesh else cfg.world_size  # a mesh's pp dimension
    if cfg.virtual_stages > 1 and cfg.mesh:
        raise err(f"virtual_stages={cfg.virtual_stages} on mesh={cfg.mesh} is not implemented (the mesh's pipeline "
                  "holds one stage per pp rank); drop the mesh or set virtual_stages=1")
    if _taken("schedule", cfg) and cfg.schedule == "interleaved_1f1b" and cfg.micro_batches % stages:
        m, p = cfg.micro_batches, stages
        raise err(f"interleaved 1F1B sends micro-batches through the chunks in groups of {p} (the stages), so "
                  f"micro_batches={m} must be a multiple of {p} (as Megatron-LM requires); "
                  f"try micro_batches=" + " or ".join(map(str, sorted({max(p, m - m % p), m - m % p + p}))))
    if cfg.strategy in STAGED:
        blocks = STAGE_BLOCKS[cfg.workload][cfg.model_size]
        v = cfg.virtual_stages
        if stages * v > blocks and not cfg.mesh:  # a mesh's pp: config_parallel checks it
            fixes = ([f"world_size <= {blocks // v}"] if blocks // v >= 2 else []) \
                + ([f"virtual_stages <= {blocks // cfg.world_size}"] if v > 1 else [])
            deeper = [k for k, n in STAGE_BLOCKS[cfg.workload].items() if n >= cfg.world_size * v]
            fix = "use " + " or ".join(fixes) if fixes else ""
            fix += (", or " if fix else "use ") + f"model_size={deeper[0]!r}" if deeper else ""
            raise err(f"the {cfg.model_size} {cfg.workload} has {blocks} blocks to cut into stages; world_size="
                      f"{cfg.world_size}" + (f" x virtual_stages={v}" if v > 1 else "")
                      + f" = {cfg.world_size * v} stages is too many; {fix}")


def _check_counts(cfg: Any, err: type[Exception]) -> None:
    for name in ("world_size", "batch_size", "grad_accum_steps", "micro_batches", "steps"):
        _at_least(name, getattr(cfg, name), 1, err)
    _at_least("warmup_steps", cfg.warmup_steps, 0, err)
    _at_least("seed", cfg.seed, 0, err)
    _at_least("bucket_cap_mb", cfg.bucket_cap_mb, 0.0, err, float)
    if cfg.bucket_cap_mb <= 0:
        raise err(f"bucket_cap_mb={cfg.bucket_cap_mb} must be > 0 (torch's default is 25; try 1, 5 or 25)")


def _check_strategy_fits(cfg: Any, err: type[Exception]) -> None:
    """World size, batch and the knobs only some strategies implement."""
    if not _taken("world_size", cfg) and cfg.world_size != 1:
        raise err(f"strategy={cfg.strategy!r} runs one process but world_size={cfg.world_size}; set world_size=1")
    if cfg.strategy in NEEDS_TWO_RANKS and cfg.world_size < 2:
        raise err(f"strategy={cfg.strategy!r} needs world_size >= 2 (got {cfg.world_size}); "
                  "use strategy='single' for one process")
    if _taken("micro_batches", cfg) and cfg.batch_size % cfg.micro_batches:
        divs = [d for d in range(1, cfg.batch_size + 1) if cfg.batch_size % d == 0 and d > 1]
        if not divs:  # batch_size=1 has no divisor above 1 (the hint below indexed an empty list)
            raise err(f"micro_batches={cfg.micro_batches} does not divide batch_size=1; use micro_batches=1 "
                      f"(no pipelining) or a batch_size that is a multiple of {cfg.micro_batches}")
        some = divs[:2] + divs[-1:] if len(divs) > 2 else divs
        hint = ", ".join(map(str, some[:-1])) + (" or " if len(some) > 1 else "") + str(some[-1])
        raise err(f"micro_batches={cfg.micro_batches} does not divide batch_size={cfg.batch_size}; "
                  f"choose a divisor such as {hint}")
    if cfg.strategy == "dp" and cfg.batch_size < cfg.world_size:
        raise err(f"dp scatters batch_size={cfg.batch_size} over {cfg.world_size} replicas; "
                  f"use batch_size >= {cfg.world_size}")
    if cfg.grad_accum_steps > 1 and not _taken("grad_accum_steps", cfg):
        *most, last = KNOB_OWNERS["grad_accum_steps"]
        raise err(f"grad_accum_steps={cfg.grad_accum_steps} is implemented for {', '.join(most)} and "
                  f"{last}, not {cfg.strategy!r}; set grad_accum_steps=1 (pipeline: use micro_batches)")
    if cfg.find_unused_parameters and not _taken("find_unused_parameters", cfg):
        raise err("find_unused_parameters is a DDP knob; set it only with "
                  f"strategy={_owners('find_unused_parameters')} (got {cfg.strategy!r})")


def _check_link(cfg: Any, err: type[Exception]) -> None:
    """The virtual interconnect: a preset, or 'custom' with both numbers."""
    if cfg.interconnect is not None:
        _choice("interconnect", cfg.interconnect, tuple(INTERCONNECTS) + ("custom",), err)
        if not _taken("interconnect", cfg):
            raise err(f"interconnect={cfg.interconnect!r} delays DDP gradient buckets; it applies to "
                      f"strategy {_owners('interconnect')}, not {cfg.strategy!r}")
        if cfg.interconnect == "custom" and (cfg.link_alpha_us is None or cfg.link_gbps is None):
            raise err("interconnect='custom' needs link_alpha_us and link_gbps, e.g. link_alpha_us=20, link_gbps=12.5")
    if cfg.link_alpha_us is not None:
        _at_least("link_alpha_us", cfg.link_alpha_us, 0.0, err, float)
    if cfg.link_gbps is not None:
        _at_least("link_gbps", cfg.link_gbps, 0.0, err, float)
        if cfg.link_gbps <= 0:
            raise err(f"link_gbps={cfg.link_gbps} must be > 0 (GB/s, e.g. 12.5)")
    given = cfg.link_alpha_us is not None or cfg.link_gbps is not None
    if given and cfg.interconnect not in (None, "custom"):
        raise err(f"link_alpha_us/link_gbps only apply with interconnect='custom' "
                  f"(got interconnect={cfg.interconnect!r}); drop them or set interconnect='custom'")
    if given and cfg.interconnect is None:
        raise err("link_alpha_us/link_gbps given without interconnect; set interconnect='custom'")


def _check_beyond(cfg: Any, error: type[Exception]) -> None:
    """The sharding, compression and parameter-server knobs."""
    _err = error
    if cfg.compression is None:
        # The lab bench's dropdowns turn the option "none" into None (its "no value"); the
        # config's spelling is "none". The dataclass is frozen, hence object.__setattr__.
        object.__setattr__(cfg, "compression", "none")
    if cfg.compression not in COMPRESSIONS:
        raise _err(f"compression={cfg.compression!r} is not supported; choose one of "
                   f"{', '.join(map(repr, COMPRESSIONS))}")
    if cfg.compression != "none" and not _taken("compression", cfg):
        raise _err(f"compression={cfg.compression!r} is a DDP comm hook; use strategy={_owners('compression')} "
                   f"(got {cfg.strategy!r}) or compression='none'")
    for name, low in (("powersgd_rank", 1), ("start_powerSGD_iter", 2)):
        v = getattr(cfg, name)
        if isinstance(v, bool) or not isinstance(v, int) or v < low:
            # torch's PowerSGDState refuses start_powerSGD_iter <= 1 with error feedback on.
            raise _err(f"{name}={v!r} must be an integer >= {low}")
    if not isinstance(cfg.reshard_after_forward, bool):
        raise _err(f"reshard_after_forward={cfg.reshard_after_forward!r} must be True (ZeRO-3) or "
                   "False (ZeRO-2-like)")
    _check_param_server(cfg, _err)
    if cfg.strategy in SHARDED:
        if cfg.world_size < 2:
            raise _err(f"strategy={cfg.strategy!r} shards over ranks and needs world_size >= 2 "
                       f"(got {cfg.world_size}); with one rank there is nothing to shard: use "
                       "strategy='single'")
        if cfg.precision == "fp16":
            # GradScaler unscales through optimizer.param_groups; ZeRO's local optimizer and
            # FSDP's DTensor grads need torch's ShardedGradScaler, which the kit does not wire up.
            raise _err(f"precision='fp16' needs a sharded grad scaler, not wired up for "
                       f"{cfg.strategy!r}; use precision='bf16' (no loss scaling) or 'fp32'")
    if not _taken("reshard_after_forward", cfg) and cfg.reshard_after_forward is not True:
        raise _err("reshard_after_forward is an FSDP knob; set it only with "
                   f"strategy={_owners('reshard_after_forward')}")


def _check_param_server(cfg: Any, _err: type[Exception]) -> None:
    if cfg.ps_mode not in PS_MODES:
        raise _err(f"ps_mode={cfg.ps_mode!r} is not supported; choose 'sync' or 'async'")
    if isinstance(cfg.straggler_ms, bool) or not isinstance(cfg.straggler_ms, (int, float)) \
            or cfg.straggler_ms < 0:
        raise _err(f"straggler_ms={cfg.straggler_ms!r} must be a number of milliseconds >= 0")
    if not _taken("ps_mode", cfg):
        if cfg.ps_mode != "sync" or cfg.straggler_ms:
            raise _err("ps_mode and straggler_ms are parameter-server knobs; set them only with "
                       f"strategy={_owners('ps_mode')} (got {cfg.strategy!r})")
        return
    if cfg.world_size < 2:
        raise _err(f"strategy='param_server' needs world_size >= 2 (rank 0 serves, the others "
                   f"compute; got {cfg.world_size}); use strategy='single' for one process")
    if cfg.precision == "fp16":
        raise _err("param_server has no loss scaling; use precision='bf16' or 'fp32'")


def check_backend(cfg: Any, backend: str, error: type[Exception] = ValueError) -> None:
    """Refuse what this backend cannot do (called where the backend is known: run(), the rank)."""
    _err = error
    if cfg.strategy == "accelerate":
        _check_accelerate(cfg, backend, _err)
    # "nccl", or torch's other spellings of it ("cuda:nccl", "cpu:gloo,cuda:nccl"): GPU tensors go over NCCL
    if cfg.compression == "bf16" and "nccl" not in backend:
        raise _err(f"bf16 compression is not supported on {backend}/CPU: DDP's bf16_compress_hook "
                   "requires CUDA 11+ and NCCL 2.10+ (torch refuses it at register_comm_hook); use "
                   "compression='fp16' (same bytes) or run on GPU ranks")


def _check_accelerate(cfg: Any, backend: str, error: type[Exception]) -> None:
    if cfg.precision == "fp16" and "nccl" not in backend:
        # Accelerate itself refuses: "fp16 mixed precision requires a device in (xpu, cuda, ...)".
        raise error("Accelerate refuses mixed_precision='fp16' on CPU ranks (it needs a GPU for fp16's "
                    "GradScaler); use precision='bf16' (Accelerate's CPU autocast) or 'fp32'")
    if importlib.util.find_spec("accelerate") is None:
        raise error(f"strategy='accelerate' needs Hugging Face Accelerate, which is not installed; {INSTALL_HINT}")
