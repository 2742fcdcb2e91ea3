"""A tiny per-cluster watchdog process: when the kernel dies, every worker and all it started go.

Why a separate process: a worker's lifeline thread cannot run while its rank holds the GIL in
C, and PR_SET_PDEATHSIG kills only the worker itself (its children are orphaned), and only when
the kernel spawned it from its main thread (the signal follows the spawning *thread*). This
watchdog is plain Python (no torch, no kit imports: it runs as a script), leads its own session
(Jupyter's interrupt signals the kernel's process group and must not reach it), and reads lines
from the kernel on its stdin: one JSON object per worker. End of file (the kernel died, or shut
the cluster down) or a new parent means: SIGKILL each worker's process group, every process
that carries this session's marker in its environment (children that left the group), and their
descendants still linked to them (a child that dropped the marker, or one inside execve, whose
environment /proc cannot show yet; a scan that sees such a process looks again, for up to 1 s). Only
processes of this user are signalled, and a worker pid whose start time changed (recycled) is
never taken for a worker.

The rank template (kit/engine/template.py) gets a watchdog of its own, whose marker is
`KIT_TEMPLATE=<id>`: every rank forked from the template carries it in /proc/PID/environ (a fork
keeps the environment block it was exec'd with), so they all go when the kernel dies.

The pid checks live here and the kernel's launcher imports them, so both use one definition;
`Watchdog` is the kernel's end (stdlib only, like the script).
"""
from __future__ import annotations

import json
import os
import select
import signal
import subprocess
import sys
import threading
import time

__all__ = ["stat_fields", "start_time", "owner", "is_ours", "kill_session", "Watchdog", "end_of_file"]


def stat_fields(pid: int) -> list[str] | None:
    """/proc/PID/stat's fields after the command name (field 3 on: the state is [0]); None when it is gone."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()  # the name may contain spaces and ')'
    except (OSError, IndexError):
        return None


def start_time(pid: int) -> str | None:
    """Start time in clock ticks since boot (field 22 of /proc/PID/stat); None when gone or a zombie."""
    fields = stat_fields(pid)
    return None if fields is None or fields[0] in ("Z", "X") else fields[19]


def owner(pid: int) -> int | None:
    """The uid that owns the process (the owner of /proc/PID), or None when it is gone."""
    try:
        return os.stat(f"/proc/{pid}").st_uid
    except OSError:
        return None


def is_ours(pid: int, start: str | None) -> bool:
    """The process we recorded: alive, started at the recorded time, owned by this user."""
    return start is not None and start_time(pid) == start and owner(pid) == os.getuid()


def _has_marker(pid: int, marker: bytes) -> bool:
    try:
        with open(f"/proc/{pid}/environ", "rb") as f:
            return marker in f.read().split(b"\0")
    except OSError:
        return False


_PF_KTHREAD = 0x00200000  # /proc/PID/stat flags: a kernel thread (no environment, ever)
_EXEC_WAIT_S = 1.0  # inside end_of_file's 2 s grace, so a clean shutdown never has to kill us


def _mid_exec(fields: list[str]) -> bool:
    """Inside execve, after the old image is gone and before the new one has its environment: stat's
    env_end (field 51) is still 0, so /proc/PID/environ reads empty and a marker cannot be seen yet.
    Under load this lasts long enough for a scan to miss a child a cell had just started.
    Not a process whose stat we may not read in full: the kernel then shows start_code and end_code
    (fields 26-27) as 1 and env_end as 0 (fs/proc/array.c). A container's init is one, for good, and
    taken for "inside execve" it kept every scan looking again for the whole second (0.2-1 s of CPU
    at every cluster's end)."""
    masked = len(fields) > 24 and fields[23] == fields[24] == "1"
    return len(fields) > 48 and fields[48] == "0" and not int(fields[6]) & _PF_KTHREAD and not masked


def kill_session(workers: list[dict[str, object]], session: str) -> list[int]:
    """SIGKILL the workers' process groups, every process of ours marked with this session
    (`KIT_SESSION=<session>`, or `session` itself when it is a whole `NAME=value` marker), and every
    descendant of those still linked to its parent."""
    killed: list[int] = []
    uid, me = os.getuid(), os.getpid()
    # A group id cannot be recycled while any member lives, so a group whose leader is gone is still the
    # worker's; a leader alive with another start time is a recycled pid: leave that group alone.
    groups = {int(str(w["pid"])) for w in workers
              if w.get("start") is not None and start_time(int(str(w["pid"]))) in (None, w["start"])}
    marker = (session if "=" in session else f"KIT_SESSION={session}").encode()  # a session, or NAME=value
    deadline = time.monotonic() + _EXEC_WAIT_S
    for _ in range(50):  # a process may fork or exec while we look: look again until nothing is left
        found, parent_of, unsure = set(), {}, False
        for name in os.listdir("/proc"):
            if not name.isdigit() or int(name) == me or owner(int(name)) != uid:
                continue
            pid, fields = int(name), stat_fields(int(name))
            if fields is None or fields[0] in ("Z", "X"):
                continue
            parent_of[pid] = int(fields[1])
            if int(fields[2]) in groups or _has_marker(pid, marker):
                found.add(pid)
            elif _mid_exec(fields):
                unsure = True  # its marker is not readable yet: look again in a moment
        grown = True
        while grown:  # children of what we found, even those that left its group or dropped the marker
            more = {p for p, pp in parent_of.items() if pp in found and p not in found}
            found |= more
            grown = bool(more)
        for pid in found:
            try:
                os.kill(pid, signal.SIGKILL)
                killed.append(pid)
            except OSError:
                pass
        if not found and not (unsure and time.monotonic() < deadline):
            break
        time.sleep(0.01)  # let the killed become zombies, and an exec finish
    return killed


class Watchdog:
    """The kernel's end: a watchdog process that outlives a SIGKILLed kernel just long enough to SIGKILL
    the workers' process groups and everything marked with their session (or with `NAME=value`)."""

    def __init__(self, session: str):
        self.proc = subprocess.Popen(
            [sys.executable, "-I", "-S", __file__, str(os.getpid()), session], stdin=subprocess.PIPE,
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
        self._lock = threading.Lock()  # the template's reader thread and a starting cluster may both write

    def watch(self, pid: int) -> None:
        assert self.proc.stdin is not None
        try:
            with self._lock:
                self.proc.stdin.write(json.dumps({"pid": pid, "start": start_time(pid)}).encode() + b"\n")
                self.proc.stdin.flush()
        except OSError:
            pass  # it is gone (killed by hand): the workers' own lifelines still hold

    def close(self) -> None:
        """End of file: the watchdog kills what is left of the session (normally nothing) and exits."""
        end_of_file(self.proc)


def end_of_file(proc: "subprocess.Popen[bytes]", grace_s: float = 2.0) -> None:
    """Close the stdin of our own child (its signal to finish), wait for it, SIGKILL it by pid if it lingers."""
    try:
        if proc.stdin is not None:
            proc.stdin.close()
    except OSError:
        pass
    try:
        proc.wait(timeout=grace_s)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


def main(argv: list[str]) -> None:
    kernel_pid, session = int(argv[1]), argv[2]
    for sig in (signal.SIGINT, signal.SIGHUP, signal.SIGTERM):
        signal.signal(sig, signal.SIG_IGN)  # only the kernel's end of file ends the watch
    workers: list[dict[str, object]] = []
    buf = b""
    while os.getppid() == kernel_pid:  # a new parent: the kernel died even if a forked child holds the pipe
        ready, _, _ = select.select([0], [], [], 0.5)
        if not ready:
            continue
        data = os.read(0, 65536)
        if not data:
            break
        buf += data
        *lines, buf = buf.split(b"\n")
        workers += [json.loads(line) for line in lines if line.strip()]
    kill_session(workers, session)


if __name__ == "__main__":
    main(sys.argv)
