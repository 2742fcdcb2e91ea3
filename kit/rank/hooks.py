"""Worker side: tell the kernel how far a long call has got (e.g. "step 12 of 40").

The worker installs `_send` at start-up; outside a kit worker (torchrun, tests) `progress`
does nothing, so library code can call it unconditionally. Messages are throttled to about
ten a second, so a tight training loop pays almost nothing.
"""
from __future__ import annotations

import time
from typing import Any, Callable

from kit.messages import PROGRESS

__all__ = ["progress"]

_send: Callable[[str, Any], None] | None = None
_last_s = 0.0


def progress(step: int, total: int, force: bool = False) -> None:
    global _last_s
    now = time.monotonic()
    if _send is None or (not force and now - _last_s < 0.1 and step < total):
        return
    _last_s = now
    try:
        _send(PROGRESS, {"step": int(step), "total": int(total)})
    except OSError:
        pass
