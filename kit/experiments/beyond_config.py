"""Validation of the sharding and compression knobs (zero1, fsdp, compression, PowerSGD).

Pure Python (no torch), called from `ExperimentConfig.__post_init__`; kept apart so config.py
changes by a few lines only. Every error says what to do instead.
"""
from __future__ import annotations

from typing import Any

__all__ = ["COMPRESSIONS", "SHARDED", "check_beyond", "check_backend"]

COMPRESSIONS = ("none", "fp16", "bf16", "powersgd")
SHARDED = ("zero1", "fsdp")


def check_beyond(cfg: Any, error: type[Exception]) -> None:
    """Raise `error` (ExperimentConfigError, passed in: config.py imports this module, not
    the other way round) for a bad value or an impossible combination."""
    _err = error
    if cfg.compression is None:
        # The lab bench's dropdowns turn the option "none" into None (its "no value"); the
        # config's spelling is "none". The dataclass is frozen, hence object.__setattr__.
        object.__setattr__(cfg, "compression", "none")
    if cfg.compression not in COMPRESSIONS:
        raise _err(f"compression={cfg.compression!r} is not supported; choose one of "
                   f"{', '.join(map(repr, COMPRESSIONS))}")
    if cfg.compression != "none" and cfg.strategy != "ddp":
        raise _err(f"compression={cfg.compression!r} is a DDP comm hook; use strategy='ddp' "
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
    if cfg.strategy != "fsdp" and cfg.reshard_after_forward is not True:
        raise _err("reshard_after_forward is an FSDP knob; set it only with strategy='fsdp'")


def _check_param_server(cfg: Any, _err: type[Exception]) -> None:
    if cfg.ps_mode not in ("sync", "async"):
        raise _err(f"ps_mode={cfg.ps_mode!r} is not supported; choose 'sync' or 'async'")
    if isinstance(cfg.straggler_ms, bool) or not isinstance(cfg.straggler_ms, (int, float)) \
            or cfg.straggler_ms < 0:
        raise _err(f"straggler_ms={cfg.straggler_ms!r} must be a number of milliseconds >= 0")
    if cfg.strategy != "param_server":
        if cfg.ps_mode != "sync" or cfg.straggler_ms:
            raise _err("ps_mode and straggler_ms are parameter-server knobs; set them only with "
                       f"strategy='param_server' (got {cfg.strategy!r})")
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
        from kit.experiments.accelerate_config import check_accelerate  # no torch, no accelerate import
        check_accelerate(cfg, backend, _err)
    if cfg.compression == "bf16" and backend != "nccl":
        raise _err(f"bf16 compression is not supported on {backend}/CPU: DDP's bf16_compress_hook "
                   "requires CUDA 11+ and NCCL 2.10+ (torch refuses it at register_comm_hook); use "
                   "compression='fp16' (same bytes) or run on GPU ranks")
