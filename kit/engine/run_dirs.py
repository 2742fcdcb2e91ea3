"""The kernel's private run directories and the stale-worker registry.

Each start gets a run directory (the ranks' FileStore and logs) inside a per-user directory that only
this user controls (0700, ours, no symlink; otherwise a fresh private one). Each run directory holds
`workers.json`: which kernel started which workers, so a later kernel can reap the workers of a kernel
that died. A pid named there is never enough on its own: owner, start time, process group and the
session marker in the process's environment must all match before it is signalled.
"""
from __future__ import annotations

import json
import os
import signal
import stat
import tempfile

from kit.engine import watchdog as _watchdog

__all__ = ["runtime_dir", "runtime_notes", "make_run_dir", "register", "unregister", "reap_stale"]

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
    """A private (0700) directory for this session's FileStore and logs, registered at once with no
    workers yet: a kernel killed before its workers were registered, or one whose ranks torchrun started
    (never registered: not our children), leaves a directory that the next start removes as stale instead
    of one that nothing ever removes."""
    path = tempfile.mkdtemp(prefix="run-", dir=runtime_dir())
    register(path, [])
    return path


# -- registry: which kernel started which workers, so a later kernel can reap orphans ------


_start_time = _watchdog.start_time  # one definition of "the same process" for the kernel and the watchdog


def register(run_dir: str, pids: list[int]) -> None:
    """Write which workers this kernel started, so that a later kernel reaps them if this one dies."""
    record = {"kernel_pid": os.getpid(), "kernel_start": _start_time(os.getpid()),
              "workers": [{"pid": pid, "start": _start_time(pid)} for pid in pids]}
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
