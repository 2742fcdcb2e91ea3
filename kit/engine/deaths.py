"""Kernel side: a dead worker in plain words (the signal, its likely cause, the cell line of a native crash)."""
from __future__ import annotations

import pathlib
import re
import signal
import time

from kit.errors import RankFailure, cell_label
from kit.units import MIB

__all__ = ["describe_exit", "death_failure", "template_death", "memory_cgroup_state", "memory_cgroups", "rss_mib"]

_CAUSES = {
    "SIGKILL": "Most often the machine ran out of memory and the OS killed the biggest process (unless the code "
               "killed it itself); try a smaller batch or model, fewer ranks, or bf16",
    "SIGSEGV": "A crash in native code (torch, gloo, CUDA or ctypes); the stderr tail below shows the Python line "
               "that was running",
    "SIGABRT": "An abort in native code: a gloo collective mismatch ('EnforceNotMet'), an NCCL watchdog "
               "timeout, or an uncaught C++ exception",
    "SIGTERM": "Something outside the kit terminated it",
    "SIGBUS": "Often /dev/shm is too small for the tensors being shared",
}
# Any cell label: `<cell 5>` (the kit's counter), `<cell In [7]>` (the notebook's), `<cell In [7] #2>` (a re-run).
_FAULT_LINE = re.compile(r'File "(<cell [^"]*>)", line (\d+)')


def memory_cgroups(cgroup_file: str = "/proc/self/cgroup") -> list[tuple[pathlib.Path, bool]]:
    """This process's memory cgroup directories: (path, is_v2), v1's first; [] where none can be read."""
    try:
        lines = pathlib.Path(cgroup_file).read_text().splitlines()
    except OSError:
        return []
    v1 = [ln.split(":", 2)[2] for ln in lines if ln.split(":")[1:2] == ["memory"]]
    v2 = [ln.split(":", 2)[2] for ln in lines if ln.startswith("0::")]
    places = ([(pathlib.Path("/sys/fs/cgroup/memory") / v1[0].lstrip("/"), False)] if v1 else []) + \
             ([(pathlib.Path("/sys/fs/cgroup") / v2[0].lstrip("/"), True)] if v2 else [])
    # a real cgroup directory, not the tmpfs that holds v1's hierarchies at /sys/fs/cgroup
    return [(p, v2) for p, v2 in places if (p / ("cgroup.controllers" if v2 else "memory.limit_in_bytes")).exists()]


def memory_cgroup_state(cgroup_file: str = "/proc/self/cgroup") -> tuple[int, int | None]:
    """(OOM kills so far, memory limit in bytes or None) of this process's memory cgroup, v2 or v1.

    The ranks are this kernel's children and share its cgroup (Binder's limit is the container's);
    (0, None) where no cgroup can be read."""
    for path, v2 in memory_cgroups(cgroup_file):
        try:
            events = (path / ("memory.events" if v2 else "memory.oom_control")).read_text().split()
            limit_text = (path / ("memory.max" if v2 else "memory.limit_in_bytes")).read_text().strip()
        except OSError:
            continue
        kills = int(events[events.index("oom_kill") + 1]) if "oom_kill" in events else 0
        limit = int(limit_text) if limit_text.isdigit() and int(limit_text) < 1 << 60 else None  # "max": none
        return kills, limit
    return 0, None


_oom_kills_seen = memory_cgroup_state()[0]  # before any rank of this kernel started


def _oom_cause() -> str:
    """The cause of a SIGKILL when this kernel's memory cgroup counted a new OOM kill, else ''."""
    global _oom_kills_seen
    kills, limit = memory_cgroup_state()
    if kills <= _oom_kills_seen:
        return ""
    _oom_kills_seen = kills
    where = f"its memory limit of {limit / MIB:.0f} MiB" if limit else "the memory available"
    return (f"It ran out of memory: Linux's OOM killer ended it when the notebook's processes (kernel, "
            f"ranks and what they started) reached {where}; try a smaller batch or model, fewer ranks, bf16, "
            f"or stop processes you no longer need")


def describe_exit(code: int | str | None) -> str:
    if code is None:
        return "exited"
    if isinstance(code, str):  # an attached rank: its control connection closed
        return ("lost its control connection (its process ended, its node went down or the network dropped; "
                "torchrun's output on that node says which)")
    if code < 0:
        try:
            name = signal.Signals(-code).name
        except ValueError:
            name = f"signal {-code}"
        return f"was killed by {name} (signal {-code})"
    return f"exited with code {code}"


_template_causes: dict[tuple[int, int], str] = {}


def template_death(pid: int, code: int | None) -> str:
    """The root cause of a forked rank's death when its rank template went first (its parent: a rank
    forked from it gets a parent-death SIGKILL), in one sentence."""
    if code is None:
        return (f"the kit lost its channel to the rank template (pid {pid}) the ranks were forked from, so how "
                f"this rank ended is unknown")
    if (pid, code) not in _template_causes:  # every rank of it (and the broken reason) tells the same cause
        _template_causes[(pid, code)] = _oom_cause() if code == -signal.SIGKILL else ""
    why = _template_causes[(pid, code)] or ("something outside the kit ended it (`kill`, a process manager) or a cell's code did" if code < 0
                    else "see the kernel's log for its last words")
    return (f"the rank template (pid {pid}) the ranks were forked from {describe_exit(code)}, and a forked rank "
            f"dies with it (a parent-death SIGKILL): {why[0].lower() + why[1:]}")


def death_failure(rank: int, code: int | str | None, tail: str, stopping: bool,
                  lost_template: tuple[int, int | None] | None = None) -> RankFailure:
    """Why the rank died, root cause first: its rank template's death when it went with it (`lost_template`,
    the template's pid and exit code), else its own signal's likely cause."""
    if stopping:
        return RankFailure(rank, "Shutdown", "the ranks were shut down while this ran", died=True, time_s=time.monotonic())
    if lost_template is not None:
        text = f"{template_death(*lost_template)}. Its variables are lost; run `%dist restart` (or Cluster.restart()) " \
               f"for fresh ranks, forked from a new template (`--no-template` starts fresh interpreters instead)."
        return RankFailure(rank, "WorkerDied", text, traceback=("----- stderr tail -----\n" + tail) if tail else "",
                           died=True, time_s=time.monotonic())
    name = signal.Signals(-code).name if isinstance(code, int) and code < 0 and -code in signal.valid_signals() else ""
    cause = (_oom_cause() if name == "SIGKILL" else "") or _CAUSES.get(name, "")
    text = f"{'it' if isinstance(code, str) else 'the process'} {describe_exit(code)}. {cause + '. ' if cause else ''}Its variables are lost; " \
           f"run `%dist restart` (or Cluster.restart()) for fresh ranks."
    # faulthandler's dump (innermost frame first) names the cell line of a native crash: the innermost
    # cell frame, as for a raised error (a function defined in In [8] crashes in In [8]).
    frames = _FAULT_LINE.findall(tail)
    return RankFailure(rank, "WorkerDied", text, traceback=("----- stderr tail -----\n" + tail) if tail else "",
                       line=int(frames[0][1]) if frames else None, died=True, time_s=time.monotonic(),
                       cell=cell_label(frames[0][0]) if frames else None)


def rss_mib(pid: int) -> float | None:
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) / 1024
    except OSError:
        return None
    return None
