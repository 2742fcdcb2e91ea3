"""Kernel side: copying objects into the ranks' namespaces (push, all ranks or none) and out of them (pull).

`Cluster.push` and `Cluster.pull` are these functions; they use only the Cluster's one-request path,
handed to them as `request`.
"""
from __future__ import annotations

from typing import Any, Callable, Iterable

from kit.engine.output import CellResult, print_line
from kit.engine.requests import unpack_pull
from kit.engine.stuck import names as rank_names
from kit.protocol import PULL, PUSH, PUSH_COMMIT, pickle_for_ranks

__all__ = ["push", "pull"]

Emit = Callable[[int, str, str], None]
# Cluster._request: (kind, body, ranks, on_output, timeout_s, check) -> the request's CellResult
Request = Callable[[str, dict[str, Any], Iterable[int] | None, Emit | None, float | None, bool | None], CellResult]


def push(request: Request, values: dict[str, Any], ranks: Iterable[int] | None = None) -> None:
    """See Cluster.push: stage on every chosen rank, then commit everywhere or drop everywhere."""
    names = ", ".join(values)
    packed: dict[str, bytes] | None = None
    try:
        packed = {name: pickle_for_ranks(name, value) for name, value in dict(values).items()}
    except KeyboardInterrupt:
        pass  # raised below, outside this block: the new error must not hold the half-built pickles
    if packed is None:
        raise KeyboardInterrupt(f"push of {names} interrupted while pickling it in the kernel; no rank has it")
    staged: CellResult | None = None
    try:
        staged = request(PUSH, {"values": packed}, ranks, None, None, False)
    except KeyboardInterrupt:  # landed outside the request's own handling: a rank keeps nothing it holds
        pass                   # apart (the next request drops it), so nobody has the values
    packed = None  # the kernel's copies go now, whatever happens next (a traceback keeps this frame)
    if staged is None:
        raise KeyboardInterrupt(f"push of {names} interrupted; no rank has {names}")
    got = sorted(r for r, rep in staged.replies.items() if rep.get("ok"))
    everywhere = staged.ok and not staged.interrupted
    kept = request(PUSH_COMMIT, {"push": staged.request_id, "keep": everywhere}, got, None, None,
                   False) if got else None
    if not everywhere:
        received = [r for r in staged.ranks if r not in staged.unsent]
        said = f"rank(s) {rank_names(received)} had received it and dropped it" if received else \
            "no rank had received it"
        if staged.interrupted:
            raise KeyboardInterrupt(f"push of {names} interrupted; no rank has {names} ({said})")
        staged.raise_for_error()
    if kept is not None and kept.failures:
        have = [r for r in got if r not in kept.failures]
        raise KeyboardInterrupt(f"push of {names} interrupted while the ranks kept it: rank(s) "
                                f"{rank_names(have) or 'none'} have {names}, rank(s) {rank_names(kept.failures)} "
                                f"do not")


def pull(request: Request, names: str | Iterable[str], ranks: Iterable[int] | None = None,
         on_output: Emit | None = None) -> dict[int, dict[str, Any]]:
    """See Cluster.pull: {rank: {name: value}}, a value that cannot travel as its repr (said on `on_output`)."""
    names = [names] if isinstance(names, str) else list(names)
    result = request(PULL, {"names": names}, ranks, on_output, None, False).raise_for_error()
    return unpack_pull(result, names, on_output or print_line)
