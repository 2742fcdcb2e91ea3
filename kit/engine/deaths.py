"""Kernel side: a dead worker in plain words (the signal, its likely cause, the cell line of a native crash)."""
from __future__ import annotations

import re
import signal
import time

from kit.errors import RankFailure, cell_label

__all__ = ["describe_exit", "death_failure", "rss_mib"]

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


def death_failure(rank: int, code: int | str | None, tail: str, stopping: bool) -> RankFailure:
    if stopping:
        return RankFailure(rank, "Shutdown", "the ranks were shut down while this ran", died=True, time_s=time.monotonic())
    name = signal.Signals(-code).name if isinstance(code, int) and code < 0 and -code in signal.valid_signals() else ""
    cause = _CAUSES.get(name, "")
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
