"""Kernel side: what the attach listener tells the user about refused attachers, bounded. A flood of
wrong keys from one host (thousands of connections) prints one line in full, then one line per
REFUSAL_WINDOW_S counting the rest; beyond HOSTS_SHOWN hosts in a window, refusals from every other host
are counted on one line together; only the last REFUSED_KEPT reasons are kept in memory."""
from __future__ import annotations

import collections
import time
from dataclasses import dataclass
from typing import Callable

__all__ = ["Refusals", "REFUSAL_WINDOW_S", "REFUSED_KEPT", "HOSTS_SHOWN"]

Emit = Callable[[int, str, str], None]
REFUSAL_WINDOW_S = 10.0
REFUSED_KEPT = 100  # reasons kept, and other hosts named in a count
HOSTS_SHOWN = 3  # hosts whose first refusal is printed in full in one window; the rest are counted together
OTHERS = "other hosts"


@dataclass
class _Window:
    """One host's refusals since its first one was printed in full."""
    start_s: float  # time.monotonic() of that first refusal
    more: int  # refused since, not yet said
    last_reason: str


class Refusals:
    """Why attachers were refused: the first from a host in full, then one line per REFUSAL_WINDOW_S
    counting the rest; the last REFUSED_KEPT reasons kept for the user."""

    def __init__(self) -> None:
        self.kept: collections.deque[str] = collections.deque(maxlen=REFUSED_KEPT)
        self.total = 0
        self._windows: dict[str, _Window] = {}  # host (or OTHERS) -> its open window
        self._others: set[str] = set()  # hosts counted in the OTHERS window (at most REFUSED_KEPT named)

    def add(self, peer: tuple[str, int], reason: str, emit: Emit) -> None:
        text = f"refused an attacher from {peer[0]}:{peer[1]}: {reason}"
        self.total += 1
        self.kept.append(text)
        host = peer[0]
        if host not in self._windows and len(self._windows) - (OTHERS in self._windows) >= HOSTS_SHOWN:
            host = OTHERS  # many source addresses (one attacker or many): counted together, not a line each
            if len(self._others) < REFUSED_KEPT:
                self._others.add(peer[0])
        window = self._windows.get(host)
        if window is None:
            self._windows[host] = _Window(time.monotonic(), 0 if host != OTHERS else 1, reason)
            if host != OTHERS:
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
                    source = (f"{len(self._others)}{'+' if len(self._others) >= REFUSED_KEPT else ''} other host(s)"
                              if host == OTHERS else host)
                    seconds = max(1.0, t - w.start_s)
                    emit(-1, "stderr", f"{w.more} more refused from {source} in the last {seconds:.0f} s "
                                       f"(the last: {w.last_reason})")
                del self._windows[host]
                if host == OTHERS:
                    self._others = set()
