"""Faults 5, 6 and 18: interrupt while ranks loop in Python, sleep, wait in pre-flight or block in gloo;
and a long cell that is not killed by any kit timeout."""
from __future__ import annotations

import _thread
import signal
import threading
import time

import pytest

from kit.engine.cluster import Cluster
from conftest import quiet

PG_TIMEOUT_S = 3.0
WALL_CLOCK_S = 30  # conftest's autouse wall_clock fixture enforces it


@pytest.fixture(scope="module")
def cluster(cluster: Cluster) -> Cluster:
    cluster.run("kept = rank + 1", on_output=quiet)
    return cluster


def _interrupted(c: Cluster, code: str, after_s: float = 1.0, **kw: object):
    notes: list[str] = []
    threading.Timer(after_s, _thread.interrupt_main).start()
    t0 = time.monotonic()
    r = c.run(code, on_output=lambda rank, s, text: notes.append(text) if rank < 0 else None, **kw)  # type: ignore
    return r, time.monotonic() - t0, "\n".join(notes)


@pytest.mark.parametrize("code", ["while True:\n    pass", "import time\ntime.sleep(60)",
                                  "import time\nif rank == 1:\n    time.sleep(60)\ndist.barrier()"],
                         ids=["python-loop", "sleep", "pre-flight-wait"])
def test_interrupt_lands_on_every_rank_quickly_and_keeps_state(cluster, code):
    pids = dict(cluster.pids)
    r, elapsed, said = _interrupted(cluster, code)
    assert elapsed < 2.5
    assert set(r.failures) == {0, 1} and {f.ename for f in r.failures.values()} == {"KeyboardInterrupt"}
    assert "interrupt sent to rank(s) 0, 1" in said
    assert any("every rank and its variables are kept" in n for n in r.notes)
    assert cluster.pids == pids and cluster.run("kept", on_output=quiet).values == {0: 1, 1: 2}


def test_interrupt_inside_a_gloo_collective_is_explained_then_recovered(cluster):
    code = "import time\nif rank == 1:\n    time.sleep(60)\nt = torch.ones(2)\ndist.all_reduce(t)"
    r, elapsed, said = _interrupted(cluster, code, after_s=0.8, check=False)
    assert elapsed < PG_TIMEOUT_S + 3
    assert "rank 0 is blocked inside all_reduce(float32[2]) at line 5" in said
    assert "gloo cannot be interrupted inside a collective" in said and f"({PG_TIMEOUT_S:g} s" in said
    assert any("re-created the process group" in n for n in r.notes)
    assert cluster.run("t = torch.ones(1) * kept\ndist.all_reduce(t)\nt.item()", on_output=quiet).values == {0: 3.0,
                                                                                                            1: 3.0}


def test_timeout_flag_interrupts_a_runaway_cell(cluster):
    t0 = time.monotonic()
    r = cluster.run("while True:\n    pass", timeout_s=0.5, on_output=quiet)
    assert time.monotonic() - t0 < 3 and any("--timeout of 0.5 s" in n for n in r.notes)
    assert cluster.run("kept", on_output=quiet).values == {0: 1, 1: 2}


def test_long_cell_is_not_killed_by_the_kit(cluster):
    r = cluster.run("import time\ntime.sleep(2.5)\n'done'", on_output=quiet)  # no wall-clock limit on user code
    assert r.ok and r.values == {0: "done", 1: "done"}


def test_interrupt_between_cells_is_harmless(cluster):
    import os

    for pid in cluster.pids.values():
        os.kill(pid, signal.SIGINT)  # a stray SIGINT while a rank is idle
    time.sleep(0.2)
    assert cluster.run("kept", on_output=quiet).values == {0: 1, 1: 2}
