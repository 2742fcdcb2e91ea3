"""Kernel side: a frame on a rank's control channel goes whole or not at all, whatever Ctrl-C does.

The user's Ctrl-C raises KeyboardInterrupt on the kernel's main thread, between any two bytecodes and
inside `sendall` (which checks signals when a write is cut short). Half a frame desynchronizes the
rank's channel, and the rank, with every variable, is lost. So a send from the main thread holds
SIGINT for the few microseconds the frame takes, then raises it again with the handler the kernel had:
the interrupt lands just after the frame, as if it had come a moment later. Other threads never see
SIGINT (Python runs signal handlers on the main thread only), so their sends go as they are.
"""
from __future__ import annotations

import signal
import threading
from contextlib import contextmanager
from typing import Any, Iterator

__all__ = ["sigint_held"]


@contextmanager
def sigint_held() -> Iterator[None]:
    """Within the block, a SIGINT is noted, not raised; on leaving, it is raised again (once) with the
    kernel's own handler, so an ignored or default SIGINT keeps doing what it did."""
    if threading.current_thread() is not threading.main_thread() or signal.getsignal(signal.SIGINT) is None:
        yield  # off the main thread no SIGINT lands; None: a handler set outside Python, which we could not put back
        return
    noted: list[Any] = []
    kernels = signal.signal(signal.SIGINT, lambda *_: noted.append(True))
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, kernels)
    if noted:
        signal.raise_signal(signal.SIGINT)
