"""Faults 11-13 beyond tests/test_lifecycle.py: the kernel is SIGKILLed while a cell runs (ranks busy in
Python, or one blocked inside a gloo collective); every worker must be gone within 3 s."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap

import pytest

from conftest import assert_pids_gone

FAKE_KERNEL = textwrap.dedent("""
    import json, sys, threading
    from kit.engine.cluster import Cluster
    from kit.config import LaunchConfig
    c = Cluster(LaunchConfig(world_size=2, pg_timeout_s=600)).start()
    threading.Timer(1.0, lambda: print(json.dumps(list(c.pids.values())), flush=True)).start()
    c.run(sys.argv[1], check=False, on_output=lambda *a: None)
""")


WALL_CLOCK_S = 30  # conftest's autouse wall_clock fixture enforces it


@pytest.mark.parametrize("cell", [
    "while True:\n    pass",
    "import time\nif rank == 1:\n    time.sleep(600)\nt = torch.ones(2)\ndist.all_reduce(t)",
], ids=["busy-python", "blocked-in-gloo"])
def test_kernel_killed_mid_cell_leaves_no_worker(cell):
    kernel = subprocess.Popen([sys.executable, "-c", FAKE_KERNEL, cell], stdout=subprocess.PIPE, text=True)
    try:
        pids = json.loads(kernel.stdout.readline())  # printed while the cell runs
        assert len(pids) == 2 and all(os.path.exists(f"/proc/{p}") for p in pids)
        os.kill(kernel.pid, signal.SIGKILL)
        kernel.wait(timeout=5)
        assert_pids_gone(pids, within_s=3)
    finally:
        kernel.kill()
