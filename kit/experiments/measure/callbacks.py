"""Python callbacks the kit hands to torch futures, waited out before a run returns.

The kit times collectives with `fut.then(done)` (the DDP comm hooks, FSDP's and the mesh's
collectives, the virtual link). On gloo, one of its worker threads runs `done` and then releases
it, which takes the GIL. That release can come after the caller already has the value (DDP waits
on the chained future, which `done` completes). If the rank's script then returns and Python
starts finalizing, a late worker thread asking for the GIL is ended by `pthread_exit`, whose
unwinding through a C++ destructor calls `std::terminate`: "terminate called without an active
exception" and SIGABRT, a failed exit code under torchrun (docs/faults.md). The same happens
when a gloo thread destroys a finished collective's work whose tensor Python has already
dropped (torch then frees the tensor's Python object on that thread). gloo's threads outlive
`destroy_process_group`, so the kit cannot join them; `settle`, called at the end of each run,
waits until every callback it handed out has been released and, on Linux, until gloo's worker
threads are all asleep (not runnable: nothing left to finish).
"""
from __future__ import annotations

import os
import time
import weakref
from typing import Any, Callable

__all__ = ["then", "settle"]

_handed_out: "weakref.WeakSet[Callable[..., Any]]" = weakref.WeakSet()


def then(fut: Any, fn: Callable[..., Any]) -> Any:
    """`fut.then(fn)`, remembering `fn` (weakly: only the future's holder keeps it alive)."""
    _handed_out.add(fn)
    return fut.then(fn)


def _gloo_threads_busy() -> bool:
    """Is any of this process's gloo worker threads runnable (Linux; False where unknown)?"""
    try:
        tids = os.listdir("/proc/self/task")
    except OSError:
        return False
    for tid in tids:
        try:
            with open(f"/proc/self/task/{tid}/stat") as f:
                stat = f.read()
        except OSError:  # the thread ended meanwhile
            continue
        name, state = stat[stat.index("(") + 1:stat.rindex(")")], stat[stat.rindex(")") + 2]
        if name.startswith("pt_gloo") and state == "R":
            return True
    return False


def settle(timeout_s: float = 5.0) -> int:
    """Wait until every callback given to `then` has been released by the thread that ran it,
    and gloo's threads have been seen asleep three polls in a row. Returns how many callbacks are
    still held after `timeout_s` (a collective that never completed)."""
    deadline, quiet = time.monotonic() + timeout_s, 0
    while time.monotonic() < deadline and (len(_handed_out) or quiet < 3):
        time.sleep(0.001)  # sleeping releases the GIL the worker thread needs to let go
        quiet = 0 if len(_handed_out) or _gloo_threads_busy() else quiet + 1
    return len(_handed_out)
