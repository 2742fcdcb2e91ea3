"""Orphans: SIGKILL a kernel (a subprocess running a Cluster) while its ranks are busy, and count
the trials that leave any worker or any child a rank started behind after 3 s.

Modes: ranks started from the kernel's main thread or from a background thread (the lab bench);
each rank starts two `sleep 600` children (one in its group, one in a new session), then holds
the GIL in C (`ctypes.PyDLL(None).sleep`). Every pid this bench learns of is SIGKILLed at the end.

    python bench/orphans.py [trials]      # default 10 per mode
"""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests"))
from conftest import _alive  # noqa: E402  the tests' own liveness check (a zombie is dead)
from test_faults_kernel import CHILDREN, THREAD_KERNEL  # noqa: E402  the same fake kernel as the test


def trial(started_from: str) -> tuple[int, int]:
    cell = CHILDREN + "ctypes.PyDLL(None).sleep(600)"
    kernel = subprocess.Popen([sys.executable, "-c", THREAD_KERNEL, cell, started_from], stdout=subprocess.PIPE,
                              text=True)
    pids = json.loads(kernel.stdout.readline())
    os.kill(kernel.pid, signal.SIGKILL)
    kernel.wait()
    time.sleep(3)
    left = [p for p in pids if _alive(p)]
    for p in pids:
        try:
            os.kill(p, signal.SIGKILL)
        except ProcessLookupError:
            pass
    return len(left), len(pids)


def main() -> None:
    n = int(sys.argv[1]) if len(sys.argv) > 1 else 10
    for mode in ("main", "thread"):
        bad, survivors = 0, 0
        for _ in range(n):
            left, total = trial(mode)
            bad += left > 0
            survivors += left
        where = "the main thread" if mode == "main" else "a background thread"
        print(f"ranks started from {where}: {bad}/{n} trials left processes behind "
              f"({survivors} of {n * total} pids survived 3 s)", flush=True)


if __name__ == "__main__":
    main()
