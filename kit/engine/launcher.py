"""Spawning and stopping worker processes; the registry that lets a new kernel reap old ones.

Workers are forks of the rank template (kit/engine/template.py: a warm interpreter that imported
torch once) or, when forking is off or unsafe, fresh `sys.executable -m kit.rank.worker`
interpreters; either way each in its own session (so Jupyter's interrupt, which signals the
kernel's process group, does not hit them raw, and so we can stop a worker together with its
children), with the torchrun environment set, the key on stdin and a socketpair of its own.
Only pids this module started (or our template forked for us) are ever signalled.
"""
from __future__ import annotations

import json
import os
import secrets
import signal
import socket
import stat
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from typing import Callable

from kit.config import LaunchConfig
from kit.payload import LIMIT_ENV
from kit.engine import watchdog as _watchdog
from kit.engine.template import template_for
from kit.engine.template_process import ForkedProc, Template, TemplateLost
from kit.engine.template import prewarm as _prewarm
from kit.engine.watchdog import Watchdog
from kit.engine.devices import Placement

__all__ = ["WorkerProcess", "Watchdog", "spawn", "stop", "fallback_note", "make_run_dir", "reap_stale", "register", "unregister",
           "runtime_dir", "runtime_notes", "inherited_env", "prewarm"]


@dataclass
class WorkerProcess:
    rank: int
    proc: subprocess.Popen[bytes] | ForkedProc  # a fresh interpreter, or a fork of the rank template
    sock: socket.socket  # the kernel's end of the control socketpair
    started_s: float = field(default_factory=time.monotonic)

    @property
    def pid(self) -> int:
        return self.proc.pid


_FALLBACK: dict[str, str] = {}  # shared path -> this kernel's private replacement
_NOTES: list[str] = []  # said once per kernel by the next Cluster.start


def _private(path: str) -> str | None:
    """Why `path` is not a directory only this user controls, or None when it is."""
    try:
        st = os.lstat(path)  # lstat: a symlink planted by someone else is refused, never followed
    except OSError as e:
        return f"it cannot be read ({e.strerror})"
    if stat.S_ISLNK(st.st_mode):
        return "it is a symbolic link"
    if not stat.S_ISDIR(st.st_mode):
        return "it is not a directory"
    if st.st_uid != os.getuid():
        return f"it belongs to uid {st.st_uid}, not to you (uid {os.getuid()})"
    if st.st_mode & 0o077:
        return f"its mode is {stat.S_IMODE(st.st_mode):o}, not 700 (others could read or plant files)"
    return None


def runtime_dir() -> str:
    """The per-user directory for run dirs and the stale-worker registry: ours and 0700, or a fresh one.

    Another local user can create `/tmp/distributed-kit-<uid>` first; trusting it would let them
    plant a registry that makes this kernel signal a pid of their choosing. So a directory that is
    not ours, not 0700 or a symlink is refused, and this kernel uses a fresh private one instead.
    """
    base = os.environ.get("XDG_RUNTIME_DIR") or tempfile.gettempdir()
    path = os.path.join(base, f"distributed-kit-{os.getuid()}")
    try:
        os.mkdir(path, 0o700)
    except FileExistsError:
        pass
    except OSError:
        pass  # reported below as unreadable
    why = _private(path)
    if why is None:
        return path
    if path not in _FALLBACK:
        _FALLBACK[path] = tempfile.mkdtemp(prefix=f"distributed-kit-{os.getuid()}-", dir=base)
        _NOTES.append(f"refusing the run directory {path}: {why}. Using the private directory {_FALLBACK[path]} "
                      f"for this kernel instead (workers left by earlier kernels cannot be reaped from there). "
                      f"To fix it for good, remove {path} (or ask whoever owns it to), then restart the kernel.")
    return _FALLBACK[path]


def runtime_notes() -> list[str]:
    """Notes about the run directory not yet shown to the user (emptied by the call)."""
    notes, _NOTES[:] = list(_NOTES), []
    return notes


def make_run_dir() -> str:
    """A private (0700) directory for this session's FileStore and logs."""
    return tempfile.mkdtemp(prefix="run-", dir=runtime_dir())


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
            worker = WorkerProcess(rank, proc, ours)
            workers.append(worker)  # before the key: stop() reaps it whatever happens next
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


# -- registry: which kernel started which workers, so a later kernel can reap orphans ------


_start_time = _watchdog.start_time  # one definition of "the same process" for the kernel and the watchdog


def register(run_dir: str, workers: list[WorkerProcess]) -> None:
    record = {"kernel_pid": os.getpid(), "kernel_start": _start_time(os.getpid()),
              "workers": [{"pid": w.pid, "start": _start_time(w.pid)} for w in workers]}
    with open(os.path.join(run_dir, "workers.json"), "w") as f:
        json.dump(record, f)


def unregister(run_dir: str) -> None:
    import shutil

    shutil.rmtree(run_dir, ignore_errors=True)


def _is_stale_worker(pid: object, start: object, session: str) -> bool:
    """A worker an earlier kernel of ours started: same owner, same start time, leads its own group,
    and carries that session's marker in its environment (so a pid named in a registry file is
    never enough on its own)."""
    if not isinstance(pid, int) or isinstance(pid, bool) or pid <= 1 or not isinstance(start, str):
        return False
    if not _watchdog.is_ours(pid, start) or os.getpgid(pid) != pid:
        return False
    try:
        with open(f"/proc/{pid}/environ", "rb") as f:
            return f"KIT_SESSION={session}".encode() in f.read().split(b"\0")
    except OSError:
        return False


def reap_stale() -> list[int]:
    """Kill workers whose kernel is gone (same user; owner, start time and session marker must match)."""
    reaped: list[int] = []
    root = runtime_dir()
    for name in os.listdir(root):
        if _private(os.path.join(root, name)) is not None:
            continue  # not a run dir this user made privately: never trust what it says
        path = os.path.join(root, name, "workers.json")
        try:
            with open(path) as f:
                record = json.load(f)
            kernel_pid, kernel_start, workers = record["kernel_pid"], record["kernel_start"], list(record["workers"])
        except (OSError, ValueError, KeyError, TypeError):
            continue
        if isinstance(kernel_pid, int) and kernel_start is not None and _start_time(kernel_pid) == kernel_start:
            continue  # that kernel is alive: its workers are its business
        for w in workers:
            pid, start = (w.get("pid"), w.get("start")) if isinstance(w, dict) else (None, None)
            try:
                if _is_stale_worker(pid, start, name):
                    os.killpg(pid, signal.SIGKILL)  # type: ignore[arg-type]
                    reaped.append(pid)  # type: ignore[arg-type]
            except (ProcessLookupError, PermissionError):
                pass
        unregister(os.path.join(root, name))
    return reaped


def new_key() -> bytes:
    return secrets.token_bytes(32)
