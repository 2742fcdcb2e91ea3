"""Kernel side: asking ranks what they are doing (`where`) and each rank's process status, without the
request lock: both must answer while a cell runs, which is exactly when they are needed."""
from __future__ import annotations

import os
import threading
import time
from typing import Any, Callable, Iterable

from kit.engine.deaths import rss_mib
from kit.engine.attach import AttachedRank
from kit.engine.launcher import WorkerProcess
from kit.engine.template_process import ForkedProc
from kit.engine.watchdog import stat_fields
from kit.messages import WHERE

__all__ = ["WhereBoard", "rank_status", "cpu_s"]

NO_ANSWER = "no answer within {timeout:.0f} s (C code may be holding the GIL)"


class WhereBoard:
    """Collects `where` answers by question id. A rank's answer is {"text", "sigint"}: its state and
    stack in words, and who handles SIGINT on it now ("kit", "ignored", "default", "user")."""

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._answers: dict[int, dict[int, dict[str, Any]]] = {}

    def deliver(self, rank: int, body: dict[str, Any]) -> None:
        """From the IO thread: one rank's answer."""
        with self._cond:
            if body.get("id") in self._answers:
                self._answers[body["id"]][rank] = dict(body, text=body.get("text", ""), sigint=body.get("sigint"))
                self._cond.notify_all()

    def ask(self, wid: int, ranks: Iterable[int], send: Callable[[int, str, Any], None],
            timeout_s: float, kind: str = WHERE) -> dict[int, dict[str, Any]]:
        """Each rank's answer to a question its control thread answers ("where", "release_group")."""
        chosen = list(ranks)
        with self._cond:
            self._answers[wid] = {}
        for r in chosen:
            try:
                send(r, kind, {"id": wid})
            except (OSError, KeyError):
                with self._cond:
                    self._answers[wid][r] = {"text": "gone (the process has exited)", "sigint": None}
        deadline = time.monotonic() + timeout_s
        with self._cond:
            while len(self._answers[wid]) < len(chosen) and time.monotonic() < deadline:
                self._cond.wait(deadline - time.monotonic())
            got = self._answers.pop(wid)
        return {r: got.get(r, {"text": NO_ANSWER.format(timeout=timeout_s), "sigint": None}) for r in chosen}


def rank_status(worker: WorkerProcess | AttachedRank, gone: bool = False) -> dict[str, Any]:
    """pid, liveness, RSS, exit code, and how the rank was started: "forked" from the rank template (with
    what the template saw just before the fork: its threads, whether CUDA was initialised), "fresh" (its
    own interpreter: --no-template, or the template's fallback) or "attached" (torchrun, on `node`)."""
    if worker.proc is None:  # attached: only its connection is known here (`gone`: it closed)
        return {"pid": worker.pid, "alive": not gone, "rss_mib": None, "exit_code": "disconnected" if gone else None,
                "node": worker.node, "started": "attached"}
    alive = worker.proc.poll() is None  # first: the exit code is known only after poll()
    out = {"pid": worker.pid, "alive": alive, "rss_mib": rss_mib(worker.pid) if alive else None,
           "exit_code": worker.proc.returncode, "started": "fresh"}
    if isinstance(worker.proc, ForkedProc):
        out.update(started="forked", template_saw=dict(worker.proc.seen))
    return out


_TICKS_S = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100


def cpu_s(pid: int) -> float | None:
    """CPU seconds a local process used so far, all its threads (utime + stime of /proc/PID/stat), read
    without asking the rank anything; None when it is gone or /proc is not there."""
    fields = stat_fields(pid)
    try:
        return None if fields is None else (int(fields[11]) + int(fields[12])) / _TICKS_S  # fields 14 and 15
    except (ValueError, IndexError):
        return None
