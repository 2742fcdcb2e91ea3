"""Worker side: what each request kind does on the main thread (exec a cell, call a function, push,
pull, re-create the group). The worker's loop around it owns interrupts, replies and markers."""
from __future__ import annotations

import importlib
import pickle
import sys
from typing import Any, Callable, NamedTuple, Protocol

from kit.errors import DecodeError
from kit.messages import CALL, EXEC, PULL, PUSH, PUSH_COMMIT, RESET_PG, not_defined, undecodable
from kit.rank import cell as _cell
from kit.rank.reply import safe_str

__all__ = ["dispatch", "HANDLERS", "Context", "unpack_push", "reset_process_group"]


class Rank(Protocol):
    """What a request needs from kit.rank.worker.Worker."""

    rank: int
    cells: int
    ns: dict[str, Any]
    init_group: Callable[[str], None] | None
    staged: tuple[int, dict[str, Any]] | None


def dispatch(worker: Rank, kind: str, body: dict[str, Any], filename: str) -> Any:
    problem = undecodable(body)
    if problem is not None:
        raise DecodeError(f"the kernel's {kind!r} request could not be unpickled on rank {worker.rank} ({problem}); "
                          f"the rank and its variables are unchanged")
    staged, worker.staged = worker.staged, None  # a push is kept only by the request right after it
    handler = HANDLERS.get(kind)
    if handler is None:
        raise ValueError(f"unknown request {kind!r}")
    return handler(worker, body, Context(filename, staged))


class Context(NamedTuple):
    """What a handler may need besides the worker and the body."""

    filename: str  # the cell's name in tracebacks ("In [7]")
    staged: tuple[int, dict[str, Any]] | None  # what the request just before pushed (PUSH_COMMIT reads it)


def _exec(worker: Rank, body: dict[str, Any], ctx: Context) -> Any:
    worker.cells += 1
    return _cell.execute(body["code"], worker.ns, ctx.filename)


def _call(worker: Rank, body: dict[str, Any], ctx: Context) -> Any:
    module, _, name = body["target"].partition(":")
    fn = getattr(importlib.import_module(module), name)
    return fn(*body.get("args", ()), **body.get("kwargs", {}))


def _push(worker: Rank, body: dict[str, Any], ctx: Context) -> Any:
    """Kept apart until the kernel knows every rank has it (then PUSH_COMMIT)."""
    worker.staged = (body["id"], unpack_push(body["values"], worker.rank))
    return _cell.NO_VALUE


def _push_commit(worker: Rank, body: dict[str, Any], ctx: Context) -> Any:
    if ctx.staged is None or ctx.staged[0] != body["push"]:
        raise LookupError(f"rank {worker.rank} no longer holds the pushed values (another request came first)")
    if body["keep"]:
        worker.ns.update(ctx.staged[1])
    return _cell.NO_VALUE


def _pull(worker: Rank, body: dict[str, Any], ctx: Context) -> Any:
    missing = [n for n in body["names"] if n not in worker.ns]
    if missing:
        raise NameError(not_defined(missing, worker.rank))
    # each value packed like a cell result: a lock, a cell-defined class or a 100 MB
    # tensor comes back as its repr with a note instead of failing the whole pull
    return {"repr": f"pulled {', '.join(body['names'])}", "pickle": None, "note": None,
            "items": {n: _cell.pack_value(worker.ns[n]) for n in body["names"]}}


def _reset_pg(worker: Rank, body: dict[str, Any], ctx: Context) -> Any:
    return reset_process_group(worker, body["prefix"])


# What each request kind does: the one place to add a request (its kind in kit.messages.REQUESTS, which the
# control thread queues for the main thread; tests/test_rank_requests.py holds the two together).
HANDLERS: dict[str, Callable[[Rank, dict[str, Any], Context], Any]] = {
    EXEC: _exec, CALL: _call, PUSH: _push, PUSH_COMMIT: _push_commit, PULL: _pull, RESET_PG: _reset_pg,
}


def reset_process_group(worker: Rank, prefix: str) -> str:
    """Destroy and re-create the default group on a fresh store prefix; Python state stays."""
    dist = sys.modules["torch.distributed"]
    if dist.is_initialized():
        dist.destroy_process_group()
    assert worker.init_group is not None  # set before the first request is served
    worker.init_group(prefix)
    return prefix


def unpack_push(values: dict[str, Any], rank: int) -> dict[str, Any]:
    """Rebuild pushed values (pickled one by one in the kernel) on the main thread, so a value
    that cannot be rebuilt here fails this request, naming it, and nothing else."""
    out = {}
    for name, data in values.items():
        try:
            out[name] = pickle.loads(data)
        except BaseException as e:  # noqa: B036 - unpickling runs arbitrary __reduce__ code
            raise ImportError(
                f"{name!r} could not be rebuilt on rank {rank} ({type(e).__name__}: {safe_str(e)[:300]}). "
                f"Define it in a %%distributed cell, or put it in a module the ranks can import; nothing was "
                f"pushed") from None
    return out
