"""Kernel side: waiting for every rank to join the process group, or saying why one did not."""
from __future__ import annotations

import queue
import time
from typing import Callable

from kit.engine.deaths import describe_exit
from kit.engine.io import OUT, Event
from kit.errors import WorkerStartError
from kit.messages import DIED, PROTOCOL_ERROR, READY, START_FAILED

__all__ = ["wait_ready"]


PROGRESS_EVERY_S = 2.0  # a slow start (64 ranks on 2 cores takes over a minute) says how far it got


def wait_ready(events: "queue.Queue[Event]", world_size: int, timeout_s: float,
               emit: Callable[[int, str, str], None] | None = None) -> None:
    t0 = time.monotonic()
    deadline, said_s = t0 + timeout_s, t0
    ready: set[int] = set()
    tails: dict[int, list[str]] = {}
    while len(ready) < world_size:
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            late = sorted(set(range(world_size)) - ready)
            raise WorkerStartError(
                f"rank(s) {late} did not join the process group within {timeout_s:g} s. The machine may be "
                f"overloaded (a fresh rank imports torch first: a few seconds each), or a rank is stuck in rendezvous. "
                f"Raise start_timeout_s, or use fewer ranks. Nothing was left running.\n" + _tails(tails))
        if emit is not None and time.monotonic() - said_s >= PROGRESS_EVERY_S:
            said_s = time.monotonic()
            emit(-1, "stderr", f"{len(ready)}/{world_size} ranks joined the process group "
                               f"({said_s - t0:.0f} s; a fresh rank imports torch first, a forked one joins at once)...")
        try:
            ev = events.get(timeout=min(0.2, remaining))
        except queue.Empty:
            continue
        if ev.kind == OUT:
            tails.setdefault(ev.rank, []).extend(ev.body.decode("utf-8", "replace").splitlines()[-40:])
        elif ev.kind == READY:
            ready.add(ev.rank)
        elif ev.kind in (START_FAILED, DIED, PROTOCOL_ERROR):
            time.sleep(0.2)  # let the last stderr lines arrive
            while not events.empty():
                extra = events.get_nowait()
                if extra.kind == OUT:
                    tails.setdefault(extra.rank, []).extend(extra.body.decode("utf-8", "replace").splitlines()[-40:])
            detail = ev.body["traceback"] if ev.kind == START_FAILED else f"the process {describe_exit(ev.body)}"
            last = detail.strip().splitlines()[-1] if detail.strip() else "unknown error"
            hint = " Is torch installed in this Python? (pip install torch)" if "No module named 'torch'" in detail else ""
            raise WorkerStartError(f"rank {ev.rank} failed to start: {last}.{hint} Nothing was left running.\n"
                                   f"{detail}\n" + _tails(tails))


def _tails(tails: dict[int, list[str]]) -> str:
    return "\n".join(f"----- rank {r} output (last lines) -----\n" + "\n".join(lines[-20:])
                     for r, lines in sorted(tails.items()) if lines)
