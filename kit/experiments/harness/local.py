"""Run a worker-side function on N local gloo ranks without the kit's Cluster.

For tests and benches: ranks forked from a warm server (torch.multiprocessing's "forkserver" start
method, the server importing torch and the kit's rank-side modules once per process), a FileStore
rendezvous in a temp dir (no ports), one thread per rank so 2 ranks fit 2 cores. Results
come back through pickle files, keyed by rank, like `Cluster.call`.

Forked, not spawned: a spawned rank is a fresh interpreter that imports torch (7 to 11 s of wall
clock for two ranks on a loaded 2-core machine, where the forked pair takes 0.1 to 0.2 s after the
server's one import), so a test suite or a bench that calls this many times paid that start-up on
every call. Each call still gets new processes and a new process group (nothing is kept between
calls), seeded like fresh interpreters (`reseed_like_a_fresh_interpreter`, as the Cluster's
template does) and with the caller's environment of the moment (a fork would otherwise see the
server's, taken at its start). Only what torch reads at import comes from the server's start.

A rank leaves with `os._exit(0)` once its result is written, as the Cluster's ranks do
(kit/rank/worker.py), never through interpreter finalization: gloo's worker threads outlive
`destroy_process_group` (ProcessGroupGloo has no `shutdown()`; its threads stop only in its
destructor, and DDP's reducer keeps the group alive until exit), and one of them may still be
releasing a Python object of the last collective (a `.then()` callback such as the DDP comm
hook's, after DDP already waited on the hook's future). If the main thread is already
finalizing, that thread's GIL request ends it with `pthread_exit`, whose unwinding through a C++
destructor calls `std::terminate`: "terminate called without an active exception", SIGABRT.
On a busy machine that happened in about one full test run in five (docs/faults.md).
"""
from __future__ import annotations

import importlib
import os
import pickle
import sys
import tempfile
from typing import Any, Callable, Sequence

__all__ = ["run_local", "run_each", "each"]


# What every call's ranks import: loaded once, in the server the ranks are forked from (torch._dynamo: torch
# imports it at a process's first optimizer, 1.3 s of CPU each; kit/rank/template.py preloads it for the same reason).
_PRELOAD = ["torch", "torch.distributed", "torch._dynamo", "kit.rank.fork_child", "kit.experiments.runner"]


def _entry(rank: int, world_size: int, target: str, args: tuple[Any, ...], tmp: str, threads: int,
           env: dict[str, str]) -> None:
    os.environ.clear()
    os.environ.update(env)  # the caller's environment now, as a spawned interpreter would start with
    os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")
    import torch
    import torch.distributed as dist

    from kit.rank.fork_child import reseed_like_a_fresh_interpreter
    reseed_like_a_fresh_interpreter()  # the server's generators were copied by the fork
    torch.set_num_threads(threads)
    store = dist.FileStore(os.path.join(tmp, "store"), world_size)
    dist.init_process_group("gloo", store=store, rank=rank, world_size=world_size)
    try:
        out = _resolve(target)(*args)
        with open(os.path.join(tmp, f"out{rank}.pkl"), "wb") as f:
            pickle.dump(out, f)
    finally:
        dist.destroy_process_group()  # on an exception, spawn's wrapper records it and exits(1)
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)  # no interpreter finalization while gloo's threads may still take the GIL (module doc)


def run_local(target: str, world_size: int, *args: Any, threads_per_rank: int | None = None) -> dict[int, Any]:
    """Call `module:function(*args)` on every rank of a fresh local gloo group; {rank: result}."""
    import multiprocessing.forkserver

    import torch.multiprocessing as mp
    threads = threads_per_rank or max(1, (os.cpu_count() or 1) // world_size)
    multiprocessing.forkserver.set_forkserver_preload(_PRELOAD)  # read when the server starts (first call)
    with tempfile.TemporaryDirectory(prefix="kit-local-") as tmp:
        mp.start_processes(_entry, args=(world_size, target, args, tmp, threads, dict(os.environ)),
                           nprocs=world_size, join=True, start_method="forkserver")
        return {r: _load(os.path.join(tmp, f"out{r}.pkl")) for r in range(world_size)}


def _load(path: str) -> Any:
    with open(path, "rb") as f:
        return pickle.load(f)


def _resolve(target: str | Callable[..., Any]) -> Callable[..., Any]:
    if callable(target):
        return target
    mod, fn = target.split(":")
    return getattr(importlib.import_module(mod), fn)


def each(target: str | Callable[..., Any], items: Sequence[tuple[Any, ...]]) -> list[Any]:
    """`target(*item)` for every item, in order, in this process group, with a barrier between
    (the ranks start each item together). Runs on the ranks."""
    import torch.distributed as dist
    fn, out = _resolve(target), []
    for item in items:
        out.append(fn(*item))
        if dist.is_initialized():
            dist.barrier()
    return out


def run_each(target: str, world_size: int, items: Sequence[tuple[Any, ...]],
             threads_per_rank: int | None = None) -> dict[int, list[Any]]:
    """Many calls of `module:function`, one fresh local gloo group (one spawn): {rank: [results]}.
    E.g. run_each("kit.experiments.runner:run_rank", 2, [(cfg.to_dict(),) for cfg in configs])."""
    return run_local("kit.experiments.harness.local:each", world_size, target, list(items),
                     threads_per_rank=threads_per_rank)
