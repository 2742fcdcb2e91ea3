"""Fault 8: a rank dies (SIGKILL, segfault, os._exit) mid-cell or while idle. Detected within 2 s with the
signal and likely cause; the other rank is released at once; the cluster says how to restart, and restart works."""
from __future__ import annotations

import os
import signal
import time

import pytest

from kit.errors import CellError, ClusterStateError
from conftest import quiet


WALL_CLOCK_S = 40  # conftest's autouse wall_clock fixture enforces it


CASES = {
    "sigkill-preflight": ("import os\nif rank == 1:\n    os.kill(os.getpid(), 9)\nt = torch.ones(2)\ndist.all_reduce(t)",
                          True, "SIGKILL (signal 9)", "ran out of memory"),
    "sigkill-in-gloo": ("import os, time\nif rank == 1:\n    time.sleep(0.5)\n    os.kill(os.getpid(), 9)\n"
                        "t = torch.ones(2)\ndist.all_reduce(t)", False, "SIGKILL (signal 9)", "ran out of memory"),
    "segfault": ("import ctypes\nif rank == 1:\n    ctypes.string_at(0)\nt = torch.ones(2)\ndist.all_reduce(t)",
                 False, "SIGSEGV (signal 11)", "native code"),
    "os-exit": ("import os\nif rank == 1:\n    os._exit(3)\nt = torch.ones(2)\ndist.all_reduce(t)",
                True, "exited with code 3", ""),
}


@pytest.mark.parametrize("case", list(CASES))
def test_dead_rank_is_reported_and_the_other_released(make_cluster, case):
    code, check, how, cause = CASES[case]
    c = make_cluster(pg_timeout_s=30.0)  # the release must come from the kit, not from a gloo timeout
    c.run("kept = 1", on_output=quiet)
    said: list[str] = []
    t0 = time.monotonic()
    r = c.run(code, check=check, on_output=lambda rank, s, text: said.append(text) if rank < 0 else None)
    assert time.monotonic() - t0 < 2.0
    dead = r.failures[1]
    assert dead.died and how in dead.evalue and cause in dead.evalue and "`%dist restart`" in dead.evalue
    note = next(text for text in said if text.startswith("rank 1 died: the process"))
    # said as it happens in one sentence; the cause and the fix once, in the cell's error (they were said twice)
    assert how in note and note.endswith("; the error below says what to do") and "%dist restart" not in note, note
    assert 0 in r.failures  # rank 0 was released, not left hanging
    err = CellError(r.failures, r.notes)
    assert err.root.rank == 1, str(err)  # the death is the root cause, rank 0's error its echo
    if case == "segfault":
        assert dead.line == 3 and 'File "<cell 2>", line 3' in dead.traceback  # faulthandler's stack
    assert c.state == "broken"
    with pytest.raises(ClusterStateError, match=r"rank 1 .*Run `%dist restart`"):
        c.run("kept", on_output=quiet)
    old = set(c.pids.values())
    c.restart()
    assert not old & set(c.pids.values())
    assert c.run("t = torch.ones(1)\ndist.all_reduce(t)\nt.item()", on_output=quiet).values == {0: 2.0, 1: 2.0}


def test_rank_killed_while_idle_is_reported_by_the_next_cell(make_cluster):
    c = make_cluster()
    os.kill(c.pids[1], signal.SIGKILL)
    deadline = time.monotonic() + 30  # the kernel notices the death between cells, without a request
    while c.state != "broken" and time.monotonic() < deadline:
        time.sleep(0.05)
    assert c.state == "broken" and "rank 1 was killed by SIGKILL" in c.status()["broken_reason"]
    with pytest.raises(ClusterStateError, match=r"rank 1 was killed by SIGKILL \(signal 9\)\. Run `%dist restart`"):
        c.run("rank", on_output=quiet)
    c.restart()
    assert c.run("rank", on_output=quiet).values == {0: 0, 1: 1}


def test_sys_exit_in_a_cell_is_an_error_not_a_death(make_cluster):
    c = make_cluster()
    r = c.run("import sys\nkept = 5\nif rank == 1:\n    sys.exit(3)\ndist.barrier()", on_output=quiet)
    assert r.failures[1].ename == "SystemExit" and not r.failures[1].died and c.state == "ready"
    assert c.run("kept", on_output=quiet).values == {0: 5, 1: 5}


# A rank killed while the others compute, sleep or ignore SIGINT ends the cell within 2 s.
SURVIVORS = {
    "sleep": "time.sleep(30)",
    "compute": "x = 0\nwhile True:\n    x += 1",
    "ignores-sigint": "import signal\nsignal.signal(signal.SIGINT, signal.SIG_IGN)\nwhile True:\n    pass",
}


@pytest.mark.parametrize("survivor", list(SURVIVORS))
def test_death_ends_the_cell_and_interrupts_the_survivors(make_cluster, survivor):
    c = make_cluster(pg_timeout_s=30.0)
    said: list[str] = []
    code = ("import os, time\nif rank == 1:\n    time.sleep(0.5)\n    os.kill(os.getpid(), 9)\n"
            + SURVIVORS[survivor])
    t0 = time.monotonic()
    r = c.run(code, check=False, on_output=lambda rank, s, text: said.append(text) if rank < 0 else None)
    assert time.monotonic() - t0 < 0.5 + 2.0, "the cell ran on after the death"
    assert r.failures[1].died and "SIGKILL" in r.failures[1].evalue
    survivor_failure = r.failures[0]
    assert "because rank 1 died" in survivor_failure.evalue and "%dist restart" in survivor_failure.evalue
    if survivor == "ignores-sigint":
        assert survivor_failure.ename == "StillRunning" and "ignored the interrupt" in survivor_failure.evalue
    else:
        assert survivor_failure.ename == "KeyboardInterrupt"
    err = CellError(r.failures, r.notes)
    assert err.root.rank == 1 and str(err).startswith("CellError: rank 1 died: the process was killed by SIGKILL"), str(err)
    assert any("interrupting rank(s) 0 because rank 1 died" in text for text in said)
    with pytest.raises(ClusterStateError, match="Run `%dist restart`"):
        c.run("1", on_output=quiet)
    c.restart()
    assert c.run("rank", on_output=quiet).values == {0: 0, 1: 1}
