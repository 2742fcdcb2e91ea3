"""Kernel side of the rank template: ranks forked from a warm interpreter instead of started fresh.

A fresh rank imports torch (about 0.7 s of CPU each, so 8 ranks take seconds); the template
(`python -m kit.rank.template`, kit/rank/template.py) imports it once and forks ranks on request.
It is started exactly like a worker (own session, key on stdin, a private socket, never a fork of
the kernel), has its own watchdog (marker `KIT_TEMPLATE=<id>`, which every rank forked from it
carries) and dies with the kernel however it dies. One template per interpreter and startup
environment (what a fork cannot change later: PYTHONPATH, LD_* and the like), kept for the
kernel's life. This module says which template serves which environment; one template process and
the ranks it forked are kit/engine/template_process.py's (`Template`, `ForkedProc`).

A template is closed (end of file on its stdin: it SIGKILLs the ranks it forked; then its watchdog
sweeps its marker) only when no rank it forked still runs: one whose channel broke while its ranks
serve a live cluster is retired, and closed after they ended.
"""
from __future__ import annotations

import atexit
import os
import socket
import sys
import threading
import time

from kit.engine.template_process import FORK_TIMEOUT_S, ForkedProc, Template, TemplateLost

__all__ = ["ForkedProc", "Template", "TemplateLost", "template_for", "prewarm", "close_all", "close_idle",
           "live_templates", "FORK_TIMEOUT_S"]

_TEMPLATES: dict[tuple[str, ...], Template] = {}
_RETIRED: list[Template] = []  # gone, but ranks it forked still run: closed once they ended, never before
_REFUSED: dict[tuple[str, ...], str] = {}  # an environment whose template refused: do not retry every start
_LOCK = threading.Lock()


_READ_LATER = ("GLOO_", "NCCL_", "MASTER_")  # read when a rank creates its group, after the fork: no new template


def _key(env: dict[str, str]) -> tuple[str, ...]:
    return (sys.executable, *sorted(f"{k}={v}" for k, v in env.items() if not k.startswith(_READ_LATER)))


def _unsupported() -> str | None:
    if not sys.platform.startswith("linux") or not hasattr(os, "fork") or not hasattr(socket, "send_fds") \
            or not hasattr(os, "memfd_create"):
        return "forking ranks needs Linux and Python 3.9 or newer"
    return None


def prewarm(env: dict[str, str]) -> None:
    """Start the template for this environment now (it imports torch while the user reads)."""
    with _LOCK:
        if _unsupported() is None and _key(env) not in _TEMPLATES and _key(env) not in _REFUSED:
            _TEMPLATES[_key(env)] = Template(env)


def template_for(env: dict[str, str], timeout_s: float) -> Template | str:
    """The ready template for ranks started from this environment, or why ranks must start fresh."""
    why = _unsupported()
    if why is not None:
        return why
    key = _key(env)
    with _LOCK:
        if key in _REFUSED:
            return _REFUSED[key]
        template = _TEMPLATES.get(key)
        if template is not None and template.gone:
            _RETIRED.append(_TEMPLATES.pop(key))
            template = None
        _close_retired()
        if template is None:
            idle = [k for k, t in _TEMPLATES.items() if not t.busy()]
            for other in idle[:max(0, len(_TEMPLATES) - 1)]:  # keep one other environment's template warm
                _TEMPLATES.pop(other).close()
            template = _TEMPLATES[key] = Template(env)
    why = template.wait_ready(timeout_s)
    if why is not None:
        with _LOCK:
            if template.info.get("unsafe"):  # it will say the same next time; a crash or a timeout may not
                _REFUSED[key] = why
            if _TEMPLATES.get(key) is template:
                del _TEMPLATES[key]
        template.close()
        return why
    return template


def _close_retired() -> int:
    """Close the gone templates whose ranks all ended (under _LOCK). Closing one with ranks alive would end
    them: the template SIGKILLs its children at end of file, its watchdog everything carrying its marker."""
    done = [t for t in _RETIRED if not t.busy()]
    for template in done:
        _RETIRED.remove(template)
        template.close()
    return len(done)


def live_templates() -> list[Template]:
    """The templates this kernel holds now, one per environment (a check that a rank is a template's fork
    compares its parent pid with theirs)."""
    with _LOCK:
        return list(_TEMPLATES.values())


def close_idle(within_s: float = 3.0) -> int:
    """Close every template that holds no live rank (`%dist shutdown`: the user frees the memory, about
    150 MiB per template with torch imported; the next start imports torch again); how many closed.

    A template hears of its ranks' exits from its own reports, a moment after they died: one whose ranks
    were just stopped is given up to `within_s` to report them (a template with ranks alive stays)."""
    deadline = time.monotonic() + within_s
    with _LOCK:
        candidates = list(_TEMPLATES.items())
    while any(t.busy() for _, t in candidates) and time.monotonic() < deadline:
        time.sleep(0.05)
    with _LOCK:
        idle = [k for k, t in candidates if not t.busy() and _TEMPLATES.get(k) is t]
        templates = [_TEMPLATES.pop(k) for k in idle]
        retired = _close_retired()
    for template in templates:
        template.close()
    return len(templates) + retired


@atexit.register
def close_all() -> None:
    """Registered before the clusters' own atexit hook (the launcher imports this module first), so it
    runs after it: the ranks are stopped, then their templates."""
    with _LOCK:
        templates = list(_TEMPLATES.values()) + _RETIRED
        _TEMPLATES.clear()
        _RETIRED.clear()
    for template in templates:
        template.close()
