"""Worker side: the rank process's own plumbing: dying with the kernel, ending itself and its
children at once, and SIGINT that lands only inside user code."""
from __future__ import annotations

import ctypes
import os
import signal
import sys
import types
from typing import Any

__all__ = ["die_with_parent", "exit_now", "Interrupts", "trim_heap"]


def die_with_parent(kernel_pid: int, use_pdeathsig: bool) -> None:
    # PR_SET_PDEATHSIG fires when the spawning *thread* exits, so the kernel asks for it
    # only when it spawned us from its main thread; the lifeline pipe covers every case.
    if use_pdeathsig and sys.platform.startswith("linux"):
        try:
            ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
        except OSError:
            pass
    if os.getppid() != kernel_pid:  # the kernel died before we set the signal
        os._exit(70)


def trim_heap() -> bool:
    """Give the memory malloc holds free back to the OS (glibc's malloc_trim; False where there is none).
    Why: a rank lives across many cells and runs, and glibc keeps what a finished run freed (a model,
    its gradients, DDP's buckets) in its arenas, where the process's resident memory still counts it:
    100 MiB or more per rank after one `run` of the kit's MLP, which all ranks, the template and the
    kernel share a notebook's memory limit with (Binder's 1 GiB; tests/test_lessons.py). Only free
    pages are returned, so nothing a cell holds changes; the next allocation faults fresh pages in."""
    try:
        return bool(ctypes.CDLL(None).malloc_trim(0))
    except (OSError, AttributeError, TypeError):  # not glibc (macOS; musl has no malloc_trim)
        return False


def exit_now(*_: Any) -> None:
    try:
        os.killpg(os.getpid(), signal.SIGKILL)  # our own session: us and our cell's children
    finally:
        os._exit(70)


class Interrupts:
    """SIGINT raises KeyboardInterrupt only inside user code, never mid-frame on the socket.

    `shielded` holds the code objects of the kit's own request loop (serve, handle): a SIGINT
    that lands while one of them is the running frame (say, between a cell's exception and the
    disarm) is kept pending instead of raised, so it can never escape the loop and end the rank.
    """

    def __init__(self) -> None:
        self.armed = False
        self.deferred = 0
        self.pending = False
        self.handled = 0  # SIGINTs Python has run the kit's handler for, this request (0: none reached Python)
        self.shielded: set[types.CodeType] = set()
        signal.signal(signal.SIGINT, self._handler)

    def _handler(self, signum: int, frame: Any) -> None:
        self.handled += 1
        if self.armed and not self.deferred and (frame is None or frame.f_code not in self.shielded):
            raise KeyboardInterrupt
        self.pending = self.armed

    def restore(self) -> bool:
        """Put the kit's handler back after a request whose cell replaced it; True if it had to."""
        if signal.getsignal(signal.SIGINT) == self._handler:
            return False
        signal.signal(signal.SIGINT, self._handler)
        return True

    def describe(self) -> str:
        """Who handles SIGINT now: "kit", "ignored" (SIG_IGN), "default" (SIG_DFL) or "user" (a cell's own)."""
        current = signal.getsignal(signal.SIGINT)
        if current == self._handler:
            return "kit"
        return {signal.SIG_IGN: "ignored", signal.SIG_DFL: "default"}.get(current, "user")  # type: ignore[call-overload]

    def raise_pending(self) -> None:
        if self.pending and self.armed and not self.deferred:
            self.pending = False
            raise KeyboardInterrupt
