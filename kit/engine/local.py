"""Kernel side: ranks started by this kernel on this machine (`kit.rank.worker`, forked by the rank
template or a fresh interpreter): spawned with the key on stdin and a socketpair each, watched by the cluster's watchdog, registered for
a later kernel to reap, interrupted with SIGINT and stopped by pid. `RemoteRanks` (engine/remote.py)
is the same shape for ranks that torchrun starts, so `Cluster` does not care which it has."""
from __future__ import annotations

import os
import signal
from typing import Callable, Iterable

from kit.config import LaunchConfig
from kit.engine.devices import Placement
from kit.engine.launcher import Watchdog, WorkerProcess, new_key, spawn, stop
from kit.engine.run_dirs import register
from kit.engine.template_process import ForkedProc
from kit.engine.watchdog import is_ours
from kit.protocol import Channel

__all__ = ["LocalRanks"]

Emit = Callable[[int, str, str], None]


class LocalRanks:
    def __init__(self, config: LaunchConfig, placement: Placement, run_dir: str):
        self.config, self.placement, self.run_dir = config, placement, run_dir
        self.workers: list[WorkerProcess] = []
        self.watchdog: Watchdog | None = None

    def open(self, marker: str, emit: Emit) -> tuple[list[WorkerProcess], dict[int, Channel]]:
        key = new_key()
        self.watchdog = Watchdog(os.path.basename(self.run_dir))
        self.workers = spawn(self.config, self.placement, self.run_dir, key, marker, self.watchdog, emit)
        register(self.run_dir, [w.pid for w in self.workers])
        return self.workers, {w.rank: Channel(w.sock, key, is_kernel=True) for w in self.workers}

    def welcome(self, marker: str) -> None:
        """Nothing to say: a local rank got its marker in its environment."""

    def interrupt(self, ranks: Iterable[int]) -> None:
        """SIGINT to these ranks' processes (our own children, by pid), for a cell to stop."""
        chosen = set(ranks)
        for w in self.workers:
            if w.rank in chosen and w.proc.poll() is None:
                try:
                    os.kill(w.pid, signal.SIGINT)
                except ProcessLookupError:
                    pass

    def exit_code(self, rank: int) -> int | None:
        return self.workers[rank].proc.poll()

    def lost_template(self, rank: int) -> tuple[int, int | None] | None:
        """(template pid, its exit code or None) when this ended rank went with the rank template that
        forked it (the root cause of its death), else None."""
        proc = self.workers[rank].proc
        return proc.lost if isinstance(proc, ForkedProc) else None

    def template_death(self) -> str | None:
        """Why a start failed when the template its ranks were forked from died under them (their
        parent-death SIGKILL), else None."""
        for w in self.workers:
            proc = w.proc
            if not isinstance(proc, ForkedProc) or proc.template is None:
                continue
            # dead by its parent-death SIGKILL, or gone before the template's channel reported it
            if proc.returncode == -signal.SIGKILL or (proc.returncode is None and not is_ours(proc.pid, proc.start)):
                if proc.template.death(within_s=1.0) is not None:
                    return proc.template.exit_reason(" while the ranks started")
        return None

    def close(self) -> None:
        stop(self.workers)  # SIGTERM, then SIGKILL after 2 s
        if self.watchdog is not None:
            self.watchdog.close()  # after the workers: it sweeps up their children, then exits
