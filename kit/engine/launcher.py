"""Spawning and stopping worker processes (their run directories and the registry that lets a new kernel
reap old ones: engine/run_dirs.py).

Workers are forks of the rank template (kit/engine/template.py: a warm interpreter that imported
torch once) or, when forking is off or unsafe, fresh `sys.executable -m kit.rank.worker`
interpreters; either way each in its own session (so Jupyter's interrupt, which signals the
kernel's process group, does not hit them raw, and so we can stop a worker together with its
children), with the torchrun environment set, the key on stdin and a socketpair of its own.
Only pids this module started (or our template forked for us) are ever signalled.
"""
from __future__ import annotations

import os
import secrets
import signal
import socket
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from typing import Callable

from kit.config import LaunchConfig
from kit.payload import LIMIT_ENV
from kit.engine.template import template_for
from kit.engine.template_process import ForkedProc, Template, TemplateLost
from kit.engine.template import prewarm as _prewarm
from kit.engine.watchdog import Watchdog
from kit.engine.devices import Placement

__all__ = ["WorkerProcess", "Watchdog", "spawn", "stop", "fallback_note", "inherited_env", "prewarm", "new_key"]


@dataclass
class WorkerProcess:
    rank: int
    proc: subprocess.Popen[bytes] | ForkedProc  # a fresh interpreter, or a fork of the rank template
    sock: socket.socket  # the kernel's end of the control socketpair
    started_s: float = field(default_factory=time.monotonic)

    @property
    def pid(self) -> int:
        return self.proc.pid


def _free_port() -> int:
    # Only advertised as MASTER_PORT for scripts that read it; the kit's own rendezvous
    # uses a FileStore, so nothing listens on it.
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


_PASSED_ON = ("KIT_FAKE_GPU_COUNT", LIMIT_ENV)  # the kit's variables the ranks read too


def inherited_env(config: LaunchConfig) -> dict[str, str]:
    """The environment every rank starts from: the kernel's (less the kit's own variables), the settings
    read at interpreter start-up, and the user's `env`. It also picks the rank template (a fork keeps it)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("KIT_") or k in _PASSED_ON}
    env.update(MPLBACKEND="Agg", PYTHONUNBUFFERED="1")
    env.update(dict(config.env))
    return env


def prewarm(config: LaunchConfig) -> None:
    """Start the rank template these ranks would be forked from, without waiting for it."""
    if config.template and config.launcher == "local":
        _prewarm(inherited_env(config))


_SAID: set[str] = set()  # fallback reasons already told to the user in this kernel


def _template(config: LaunchConfig, emit: Callable[[int, str, str], None] | None) -> Template | None:
    """The warm template to fork ranks from, or None (fresh interpreters) with the reason told once."""
    if not config.template:
        return None  # --no-template: the user's choice needs no note (and a start that lost its template)
    try:
        got = template_for(inherited_env(config), config.start_timeout_s)
    except OSError as e:  # could not even start it (out of processes, file descriptors)
        got = f"the rank template could not start ({e})"
    if isinstance(got, Template):
        return got
    fallback_note(got, emit)
    return None


def fallback_note(why: str, emit: Callable[[int, str, str], None] | None) -> None:
    if emit is not None and why not in _SAID:
        _SAID.add(why)
        emit(-1, "stderr", f"starting ranks as fresh interpreters (each imports torch, so start-up is slower): "
                           f"{why}. `--no-template` (LaunchConfig(template=False)) chooses this without the note.")


def spawn(config: LaunchConfig, placement: Placement, run_dir: str, key: bytes, marker: str,
          watchdog: Watchdog | None = None, emit: Callable[[int, str, str], None] | None = None) -> list[WorkerProcess]:
    n = config.world_size
    base = inherited_env(config)
    base.update({
        "WORLD_SIZE": str(n), "LOCAL_WORLD_SIZE": str(n), "GROUP_RANK": "0", "ROLE_WORLD_SIZE": str(n),
        "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(_free_port()), "TORCHELASTIC_RUN_ID": os.path.basename(run_dir),
        "OMP_NUM_THREADS": str(config.threads), "MKL_NUM_THREADS": str(config.threads),
        "GLOO_SOCKET_IFNAME": "lo", "NCCL_SOCKET_IFNAME": "lo",
        "KIT_RUN_DIR": run_dir, "KIT_KERNEL_PID": str(os.getpid()), "KIT_BACKEND": placement.backend,
        "KIT_PG_TIMEOUT_S": str(config.pg_timeout_s), "KIT_THREADS": str(config.threads), "KIT_MARKER": marker,
        "KIT_PDEATHSIG": "1" if threading.current_thread() is threading.main_thread() else "0",
        "KIT_SESSION": os.path.basename(run_dir),
    })
    base.update(dict(config.env))
    template = _template(config, emit)
    workers: list[WorkerProcess] = []
    try:
        for rank in range(n):
            ours, theirs = socket.socketpair()
            env = dict(base, RANK=str(rank), LOCAL_RANK=str(rank), ROLE_RANK=str(rank),
                       KIT_GPU_ID=str(placement.gpu_ids[rank] or 0))
            proc: subprocess.Popen[bytes] | ForkedProc | str = "" if template is None else \
                template.fork(env, env["KIT_SESSION"], theirs.fileno())
            if isinstance(proc, str):
                if proc and template is not None and any(isinstance(w.proc, ForkedProc) for w in workers) \
                        and template.death(within_s=1.0) is not None:
                    ours.close()
                    theirs.close()
                    # the ranks forked so far died with it: the caller starts over with fresh interpreters
                    raise TemplateLost(template.exit_reason(" while the ranks started"))
                if proc:  # the template refused (or died): this rank and the rest start fresh
                    fallback_note(proc, emit)
                    template = None
                proc = subprocess.Popen(
                    [sys.executable, "-m", "kit.rank.worker"], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                    stderr=subprocess.PIPE, pass_fds=(theirs.fileno(),), env=dict(env, KIT_CTRL_FD=str(theirs.fileno())),
                    start_new_session=True,
                )
            theirs.close()
            if watchdog is not None:
                watchdog.watch(proc.pid)
            assert proc.stdin is not None
            workers.append(WorkerProcess(rank, proc, ours))  # before the key: stop() reaps it whatever happens next
            try:
                proc.stdin.write(key)  # the key travels on the private pipe; stdin stays open as the lifeline
                proc.stdin.flush()
            except BrokenPipeError:
                # it died before it read its key: a forked rank dies with its template (a rank that
                # died on its own is reported by start-up like any rank that fails to start)
                if isinstance(proc, ForkedProc) and template is not None and template.death(within_s=1.0) is not None:
                    raise TemplateLost(template.exit_reason(" while the ranks started")) from None
    except BaseException:
        stop(workers, grace_s=0)
        raise
    return workers


def stop(workers: list[WorkerProcess], grace_s: float = 2.0) -> None:
    """Ask politely (close the lifeline, SIGTERM), then SIGKILL whatever is left. Our pids only."""
    for w in workers:
        if w.proc.poll() is None:
            try:
                os.killpg(w.pid, signal.SIGTERM)  # the worker leads its own session: pgid == pid
            except (ProcessLookupError, PermissionError):
                pass
    deadline = time.monotonic() + grace_s
    for w in workers:
        try:
            w.proc.wait(timeout=max(0.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            pass
    for w in workers:
        if w.proc.poll() is None:
            try:
                os.killpg(w.pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass
            w.proc.wait()
        for f in (w.proc.stdin, w.proc.stdout, w.proc.stderr, w.sock):
            try:
                if f is not None:
                    f.close()
            except OSError:
                pass


def new_key() -> bytes:
    return secrets.token_bytes(32)
