"""Kernel side: what the attach listener tells the user about refused attachers, bounded. A flood of
wrong keys from one host (thousands of connections) prints one line in full, then one line per
REFUSAL_WINDOW_S counting the rest; beyond HOSTS_SHOWN hosts in a window, refusals from every other host
are counted on one line together; only the last REFUSED_KEPT reasons are kept in memory."""
from __future__ import annotations

import collections
import time
from typing import Any, Callable

__all__ = ["Refusals", "REFUSAL_WINDOW_S", "REFUSED_KEPT", "HOSTS_SHOWN"]

Emit = Callable[[int, str, str], None]
REFUSAL_WINDOW_S = 10.0
REFUSED_KEPT = 100  # reasons kept, and other hosts named in a count
HOSTS_SHOWN = 3  # hosts whose first refusal is printed in full in one window; the rest are counted together
OTHERS = "other hosts"


class Refusals:
    """Why attachers were refused: the first from a host in full, then one line per REFUSAL_WINDOW_S
    counting the rest; the last REFUSED_KEPT reasons kept for the user."""

    def __init__(self) -> None:
        self.kept: collections.deque[str] = collections.deque(maxlen=REFUSED_KEPT)
        self.total = 0
        self._windows: dict[str, list[Any]] = {}  # host -> [window start, refused since, last reason]
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
            self._windows[host] = [time.monotonic(), 0 if host != OTHERS else 1, reason]
            if host != OTHERS:
                emit(-1, "stderr", text)
        else:
            window[1] += 1
            window[2] = reason

    def flush(self, emit: Emit, now: float | None = None) -> None:
        """Say how many more were refused from each host whose window ended (every window, when `now` is None)."""
        t = time.monotonic()
        for host, (start, more, reason) in list(self._windows.items()):
            if now is None or now - start >= REFUSAL_WINDOW_S:
                if more:
                    source = (f"{len(self._others)}{'+' if len(self._others) >= REFUSED_KEPT else ''} other host(s)"
                              if host == OTHERS else host)
                    emit(-1, "stderr", f"{more} more refused from {source} in the last {max(1.0, t - start):.0f} s "
                                       f"(the last: {reason})")
                del self._windows[host]
                if host == OTHERS:
                    self._others = set()
