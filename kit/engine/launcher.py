"""Spawning and stopping worker processes; the registry that lets a new kernel reap old ones.

Workers are `sys.executable -m kit.rank.worker`, each in its own session (so Jupyter's
interrupt, which signals the kernel's process group, does not hit them raw, and so we
can stop a worker together with its children), with the torchrun environment set.
Only pids this module started are ever signalled.
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

from kit.config import LaunchConfig
from kit.engine import watchdog as _watchdog
from kit.engine.devices import Placement

__all__ = ["WorkerProcess", "Watchdog", "spawn", "stop", "make_run_dir", "reap_stale", "register", "unregister",
           "runtime_dir", "runtime_notes"]


@dataclass
class WorkerProcess:
    rank: int
    proc: subprocess.Popen[bytes]
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


class Watchdog:
    """The kernel's end of kit/engine/watchdog.py: a process that outlives a SIGKILLed kernel just long
    enough to SIGKILL the workers' process groups and everything marked with their session."""

    def __init__(self, session: str):
        self.proc = subprocess.Popen(
            [sys.executable, "-I", "-S", _watchdog.__file__, str(os.getpid()), session], stdin=subprocess.PIPE,
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)

    def watch(self, pid: int) -> None:
        assert self.proc.stdin is not None
        try:
            self.proc.stdin.write(json.dumps({"pid": pid, "start": _start_time(pid)}).encode() + b"\n")
            self.proc.stdin.flush()
        except OSError:
            pass  # it is gone (killed by hand): the workers' own lifelines still hold

    def close(self) -> None:
        """End of file: the watchdog kills what is left of the session (normally nothing) and exits."""
        try:
            if self.proc.stdin is not None:
                self.proc.stdin.close()
        except OSError:
            pass
        try:
            self.proc.wait(timeout=2)
        except subprocess.TimeoutExpired:
            self.proc.kill()  # our own child, by pid
            self.proc.wait()


def spawn(config: LaunchConfig, placement: Placement, run_dir: str, key: bytes, marker: str,
          watchdog: Watchdog | None = None) -> list[WorkerProcess]:
    n = config.world_size
    base = dict(os.environ)
    for name in list(base):
        if name.startswith("KIT_") and name != "KIT_FAKE_GPU_COUNT":
            del base[name]
    base.update({
        "WORLD_SIZE": str(n), "LOCAL_WORLD_SIZE": str(n), "GROUP_RANK": "0", "ROLE_WORLD_SIZE": str(n),
        "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(_free_port()), "TORCHELASTIC_RUN_ID": os.path.basename(run_dir),
        "OMP_NUM_THREADS": str(config.threads), "MKL_NUM_THREADS": str(config.threads),
        "GLOO_SOCKET_IFNAME": "lo", "NCCL_SOCKET_IFNAME": "lo", "MPLBACKEND": "Agg", "PYTHONUNBUFFERED": "1",
        "KIT_RUN_DIR": run_dir, "KIT_KERNEL_PID": str(os.getpid()), "KIT_BACKEND": placement.backend,
        "KIT_PG_TIMEOUT_S": str(config.pg_timeout_s), "KIT_THREADS": str(config.threads), "KIT_MARKER": marker,
        "KIT_PDEATHSIG": "1" if threading.current_thread() is threading.main_thread() else "0",
        "KIT_SESSION": os.path.basename(run_dir),
    })
    base.update(dict(config.env))
    workers: list[WorkerProcess] = []
    try:
        for rank in range(n):
            ours, theirs = socket.socketpair()
            env = dict(base, RANK=str(rank), LOCAL_RANK=str(rank), ROLE_RANK=str(rank),
                       KIT_CTRL_FD=str(theirs.fileno()), KIT_GPU_ID=str(placement.gpu_ids[rank] or 0))
            proc = subprocess.Popen(
                [sys.executable, "-m", "kit.rank.worker"], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                stderr=subprocess.PIPE, pass_fds=(theirs.fileno(),), env=env, start_new_session=True,
            )
            theirs.close()
            if watchdog is not None:
                watchdog.watch(proc.pid)
            assert proc.stdin is not None
            proc.stdin.write(key)  # the key travels on the private pipe; stdin stays open as the lifeline
            proc.stdin.flush()
            workers.append(WorkerProcess(rank, proc, ours))
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
