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
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field

from kit.config import LaunchConfig
from kit.engine.devices import Placement

__all__ = ["WorkerProcess", "spawn", "stop", "make_run_dir", "reap_stale", "register", "unregister", "runtime_dir"]


@dataclass
class WorkerProcess:
    rank: int
    proc: subprocess.Popen[bytes]
    sock: socket.socket  # the kernel's end of the control socketpair
    started_s: float = field(default_factory=time.monotonic)

    @property
    def pid(self) -> int:
        return self.proc.pid


def runtime_dir() -> str:
    base = os.environ.get("XDG_RUNTIME_DIR") or tempfile.gettempdir()
    path = os.path.join(base, f"distributed-kit-{os.getuid()}")
    os.makedirs(path, mode=0o700, exist_ok=True)
    os.chmod(path, 0o700)
    return path


def make_run_dir() -> str:
    """A private (0700) directory for this session's FileStore and logs."""
    return tempfile.mkdtemp(prefix="run-", dir=runtime_dir())


def _free_port() -> int:
    # Only advertised as MASTER_PORT for scripts that read it; the kit's own rendezvous
    # uses a FileStore, so nothing listens on it.
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def spawn(config: LaunchConfig, placement: Placement, run_dir: str, key: bytes, marker: str) -> list[WorkerProcess]:
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


def _start_time(pid: int) -> str | None:
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
    except OSError:
        return None
    return None if fields[0] in ("Z", "X") else fields[19]  # a zombie is already dead


def register(run_dir: str, workers: list[WorkerProcess]) -> None:
    record = {"kernel_pid": os.getpid(), "kernel_start": _start_time(os.getpid()),
              "workers": [{"pid": w.pid, "start": _start_time(w.pid)} for w in workers]}
    with open(os.path.join(run_dir, "workers.json"), "w") as f:
        json.dump(record, f)


def unregister(run_dir: str) -> None:
    import shutil

    shutil.rmtree(run_dir, ignore_errors=True)


def reap_stale() -> list[int]:
    """Kill workers whose kernel is gone (same user; pid and start time must both match)."""
    reaped: list[int] = []
    root = runtime_dir()
    for name in os.listdir(root):
        path = os.path.join(root, name, "workers.json")
        try:
            with open(path) as f:
                record = json.load(f)
        except (OSError, ValueError):
            continue
        if _start_time(record["kernel_pid"]) == record["kernel_start"] and record["kernel_start"] is not None:
            continue  # that kernel is alive: its workers are its business
        for w in record["workers"]:
            if w["start"] is not None and _start_time(w["pid"]) == w["start"]:
                try:
                    os.killpg(w["pid"], signal.SIGKILL)
                    reaped.append(w["pid"])
                except (ProcessLookupError, PermissionError):
                    pass
        unregister(os.path.join(root, name))
    return reaped


def new_key() -> bytes:
    return secrets.token_bytes(32)
