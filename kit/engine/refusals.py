"""Kernel side: what the attach listener tells the user about refused attachers, bounded. A flood of
wrong keys from one host (thousands of connections) prints one line in full, then one line per
REFUSAL_WINDOW_S counting the rest, and only the last REFUSED_KEPT reasons are kept in memory."""
from __future__ import annotations

import collections
import time
from dataclasses import dataclass
from typing import Callable

__all__ = ["Refusals", "REFUSAL_WINDOW_S", "REFUSED_KEPT"]

Emit = Callable[[int, str, str], None]
REFUSAL_WINDOW_S = 10.0
REFUSED_KEPT = 100  # reasons kept, and hosts counted apart (the rest are counted as "other hosts")


@dataclass
class _Window:
    """One host's refusals since its first was said in full."""

    start_s: float
    more: int  # refused since, not yet said
    last_reason: str


class Refusals:
    """Why attachers were refused: the first from a host in full, then one line per REFUSAL_WINDOW_S
    counting the rest; the last REFUSED_KEPT reasons kept for the user."""

    def __init__(self) -> None:
        self.kept: collections.deque[str] = collections.deque(maxlen=REFUSED_KEPT)
        self.total = 0
        self._windows: dict[str, _Window] = {}  # by host

    def add(self, peer: tuple[str, int], reason: str, emit: Emit) -> None:
        text = f"refused an attacher from {peer[0]}:{peer[1]}: {reason}"
        self.total += 1
        self.kept.append(text)
        host = peer[0] if peer[0] in self._windows or len(self._windows) < REFUSED_KEPT else "other hosts"
        window = self._windows.get(host)
        if window is None:
            self._windows[host] = _Window(time.monotonic(), 0, reason)
            emit(-1, "stderr", text)
        else:
            window.more += 1
            window.last_reason = reason

    def flush(self, emit: Emit, now: float | None = None) -> None:
        """Say how many more were refused from each host whose window ended (every window, when `now` is None)."""
        t = time.monotonic()
        for host, w in list(self._windows.items()):
            if now is None or now - w.start_s >= REFUSAL_WINDOW_S:
                if w.more:
                    emit(-1, "stderr", f"{w.more} more refused from {host} in the last {max(1.0, t - w.start_s):.0f} s "
                                       f"(the last: {w.last_reason})")
                del self._windows[host]
