"""Soak (short): 40 cells that raise, are interrupted or mismatch, alternating with healthy ones, leave
no extra processes, file descriptors, threads or kernel memory behind (bench/soak.py runs 200)."""
from __future__ import annotations

import os
import sys


sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "bench"))
import soak  # noqa: E402

from conftest import assert_pids_gone  # noqa: E402


WALL_CLOCK_S = 60  # conftest's autouse wall_clock fixture enforces it


def test_forty_faulty_and_healthy_cells_leak_nothing():
    before, after, problems = soak.soak(40)
    assert not problems, problems
    assert after["children"] == before["children"] and after["workers"] == before["workers"]
    assert len(before["workers"]) == 2 and set(before["workers"]) <= set(before["children"])
    assert_pids_gone(before["workers"])  # shut down at the end of the soak
