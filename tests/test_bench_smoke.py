"""Smoke test for the engine benches: the quick in-process warm-cell bench still runs.

Checks that the script works (starts 2 ranks, times Cluster.run, prints its summary line and
leaves nothing running), never its numbers: timings on a shared CI box are not asserted.
"""
from __future__ import annotations

import os
import subprocess
import sys

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def test_warm_cell_bench_quick_inproc() -> None:
    p = subprocess.run([sys.executable, os.path.join(REPO, "bench", "bench_warm_cell.py"), "--quick",
                        "--only", "kit-inproc"], capture_output=True, text=True, timeout=120, cwd=REPO)
    assert p.returncode == 0, p.stdout[-2000:] + p.stderr[-2000:]
    assert "kit-inproc: Cluster.run('None')" in p.stdout
    assert "warm cell (engine): kit Cluster.run('None')" in p.stdout
