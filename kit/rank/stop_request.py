"""Rank side: has the kernel asked the request this rank is serving to stop early? (the panels' Stop)

The one owner of that fact. The worker's main thread says which request it serves (`serving`); the
control thread records a STOP_REQUEST frame's request id as it arrives (`ask`), while the main thread
is busy; code on the rank asks `asked()` between steps (kit.experiments.runner) and ends at a step
boundary. The frame travels on the control channel every rank has, local or attached from another
host, so no file system is shared with the kernel.

A stop names its request: one that arrives after that request ended is stale and never stops a
later request (ids only grow); one that arrives before the main thread begins serving its request
(the request still queued) still counts. Outside a kit worker (plain torchrun, a test's spawn
harness) nothing calls `ask`, so `asked()` stays False and the same code runs to its end.
"""
from __future__ import annotations

import threading

__all__ = ["serving", "ask", "asked"]

_lock = threading.Lock()  # written by two threads: the main thread (serving) and the control thread (ask)
_serving: int | None = None  # the request the main thread serves now
_asked: int | None = None  # the request the kernel last asked to stop


def serving(request_id: int | None) -> None:
    """The main thread begins serving `request_id` (None: it finished and is idle)."""
    global _serving
    with _lock:
        _serving = request_id


def ask(request_id: int) -> None:
    """The kernel asked request `request_id` to stop (the control thread, on a STOP_REQUEST frame)."""
    global _asked
    with _lock:
        _asked = request_id


def asked() -> bool:
    """True once the kernel asked the request being served now to stop."""
    with _lock:
        return _serving is not None and _asked == _serving
