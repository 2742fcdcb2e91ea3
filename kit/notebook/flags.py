"""Magic flags -> a validated LaunchConfig and rank lists (shared by `%%distributed` and `%dist`)."""
from __future__ import annotations

import math
from typing import Any

from IPython.core.error import UsageError

from kit.config import LaunchConfig
from kit.errors import ConfigError

__all__ = ["parse_ranks", "config_from_flags", "check_timeout", "live_changes"]


def parse_ranks(text: str | None) -> list[int] | None:
    if text is None:
        return None
    ranks: list[int] = []
    try:
        for part in text.split(","):
            lo, dash, hi = part.strip().partition("-")
            if dash and not hi:
                raise ValueError(part)
            if dash and int(hi) < int(lo):
                raise UsageError(f"--ranks {text} is backwards ({lo} > {hi}); write --ranks {hi}-{lo}")
            ranks += list(range(int(lo), int(hi) + 1)) if dash else [int(lo)]
    except ValueError:
        raise UsageError(f"--ranks {text!r} is not a rank list; write it like --ranks 0,1 or --ranks 0-3") from None
    return sorted(set(ranks))  # a rank named twice is one rank (--ranks 1,1 pulls rank 1's value, not a dict)


def check_timeout(timeout: float | None) -> None:
    if timeout is not None and not 0 < timeout < math.inf:  # also refuses nan, which compares False to all
        raise UsageError(f"--timeout {timeout:g} must be a positive number of seconds, e.g. --timeout 30")


def live_changes(args: Any, running: LaunchConfig) -> LaunchConfig:
    """--pg-timeout / --threads given while ranks run: the config to apply live, or UsageError saying a
    restart is needed. torch fixes a process group's timeout when the group is created; threads can change."""
    pg = args.pg_timeout
    if pg is not None and pg != running.pg_timeout_s:
        try:
            running.replace(pg_timeout_s=pg)
        except ConfigError as e:
            raise UsageError(str(e)) from None
        raise UsageError(f"--pg-timeout {pg:g} needs fresh ranks: the running ranks created their process group "
                         f"with a {running.pg_timeout_s:g} s timeout, and torch fixes it then. Run "
                         f"`%dist restart --pg-timeout {pg:g}` (variables are lost), or drop the flag to keep them.")
    if args.threads is not None and args.threads != running.threads:
        try:
            return running.replace(threads_per_rank=args.threads)
        except ConfigError as e:
            raise UsageError(str(e)) from None
    return running


def config_from_flags(args: Any, current: LaunchConfig | None) -> LaunchConfig | None:
    """The LaunchConfig the flags ask for; None when ranks run and the flags name no world (reuse them)."""
    if args.gpus is not None and args.cpus is not None:
        raise UsageError("use either --gpus N or --cpus N, not both")
    n, device = (args.gpus, "gpu") if args.gpus is not None else (args.cpus, "cpu")
    if n is None:
        if args.strict:
            raise UsageError("--strict goes with --gpus N (it forbids the CPU fallback)")
        if current is not None:
            return None
        n, device = 2, "gpu"  # nothing runs yet: the default world, with any --pg-timeout / --threads
    base = current or LaunchConfig()
    changes: dict[str, Any] = {"world_size": n, "device": device, "strict": args.strict}
    if args.pg_timeout is not None:
        changes["pg_timeout_s"] = args.pg_timeout
    if args.threads is not None:
        changes["threads_per_rank"] = args.threads
    if getattr(args, "no_template", False):
        changes["template"] = False  # fresh interpreters for these ranks (and their restarts)
    try:
        return base.replace(**changes)
    except ConfigError as e:
        raise UsageError(str(e)) from None
