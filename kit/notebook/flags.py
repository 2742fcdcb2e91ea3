"""Magic flags -> a validated LaunchConfig and rank lists (shared by `%%distributed` and `%dist`)."""
from __future__ import annotations

from typing import Any

from IPython.core.error import UsageError

from kit.config import LaunchConfig
from kit.errors import ConfigError

__all__ = ["parse_ranks", "config_from_flags"]


def parse_ranks(text: str | None) -> list[int] | None:
    if text is None:
        return None
    ranks: list[int] = []
    try:
        for part in text.split(","):
            lo, dash, hi = part.strip().partition("-")
            if dash and not hi:
                raise ValueError(part)
            ranks += list(range(int(lo), int(hi) + 1)) if dash else [int(lo)]
    except ValueError:
        raise UsageError(f"--ranks {text!r} is not a rank list; write it like --ranks 0,1 or --ranks 0-3") from None
    return ranks


def config_from_flags(args: Any, current: LaunchConfig | None) -> LaunchConfig | None:
    """The LaunchConfig the flags ask for, or None when they name no world (reuse the running one)."""
    if args.gpus is not None and args.cpus is not None:
        raise UsageError("use either --gpus N or --cpus N, not both")
    n, device = (args.gpus, "gpu") if args.gpus is not None else (args.cpus, "cpu")
    if n is None:
        if args.strict:
            raise UsageError("--strict goes with --gpus N (it forbids the CPU fallback)")
        return None
    base = current or LaunchConfig()
    changes: dict[str, Any] = {"world_size": n, "device": device, "strict": args.strict}
    if args.pg_timeout is not None:
        changes["pg_timeout_s"] = args.pg_timeout
    if args.threads is not None:
        changes["threads_per_rank"] = args.threads
    try:
        return base.replace(**changes)
    except ConfigError as e:
        raise UsageError(str(e)) from None
