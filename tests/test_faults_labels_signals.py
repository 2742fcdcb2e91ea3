"""Labelled cells in native crashes, pre-flight texts and replies; the rank's SIGINT
handler (restored after a cell replaced it, reported by `where`), and interrupt storms while a cell raises."""
from __future__ import annotations

import _thread
import os
import signal
import threading
import time

import pytest

from conftest import quiet, wait_until

WALL_CLOCK_S = 60  # conftest's autouse wall_clock fixture enforces it


def test_a_native_crash_in_a_labelled_cell_names_the_line_and_the_cell(make_cluster):
    c = make_cluster(pg_timeout_s=30.0)
    r = c.run("import ctypes\nif rank == 1:\n    ctypes.string_at(0)\nt = torch.ones(2)\ndist.all_reduce(t)",
              check=False, on_output=quiet, label="In [7]")
    dead = r.failures[1]
    assert dead.died and "SIGSEGV" in dead.evalue
    assert dead.line == 3 and dead.cell == "In [7]", (dead.line, dead.cell, dead.traceback)
    assert "died at line 3 of In [7]: " in dead.summary()


def test_the_reply_names_the_cell_and_the_preflight_text_too(cluster):
    cluster.run("def fails():\n    raise ValueError('bad')", on_output=quiet, label="In [3]")
    r = cluster.run("if rank == 1:\n    fails()\nt = torch.ones(2)\ndist.all_reduce(t)", on_output=quiet,
                    label="In [4]")
    assert r.failures[1].cell == "In [3]" and r.failures[1].line == 2
    waiter = r.failures[0]  # released from its pre-flight wait, told which cell raised
    assert "rank 1 raised ValueError at line 2 of In [3]" in waiter.evalue, waiter.evalue


def test_a_reply_note_reaches_the_cell_result(cluster):
    r = cluster.run("import os\nsaved = os.dup(1)\nnull = os.open(os.devnull, os.O_WRONLY)\nos.dup2(null, 1)",
                    on_output=quiet)
    assert any("fd 1 (stdout)" in n and "redirected" in n for n in r.notes), r.notes
    r = cluster.run("os.dup2(saved, 1)\nprint('back')", on_output=quiet)
    assert r.ok and r.stdout(0) == "back"


def test_a_cells_sigint_handler_does_not_outlive_the_cell(cluster):
    r = cluster.run("import signal\nsignal.signal(signal.SIGINT, signal.SIG_IGN)\n1", on_output=quiet)
    assert r.ok and any("replaced the SIGINT handler" in n for n in r.notes), r.notes
    assert {a["sigint"] for a in cluster.where_reports().values()} == {"kit"}
    threading.Timer(0.8, _thread.interrupt_main).start()
    t0 = time.monotonic()
    r = cluster.run("while True:\n    pass", on_output=quiet)  # interruptible again
    assert time.monotonic() - t0 < 5
    assert {f.ename for f in r.failures.values()} == {"KeyboardInterrupt"}


def test_where_reports_the_ranks_sigint_handler(cluster, tmp_path):
    release = tmp_path / "release"
    code = "import os, signal, time\nif rank == 0:\n    signal.signal(signal.SIGINT, signal.SIG_IGN)\nelse:\n" \
           "    signal.signal(signal.SIGINT, lambda *a: None)\nprint('set', flush=True)\n" \
           f"while not os.path.exists({str(release)!r}):\n    pass"
    printed: set[int] = set()
    result: dict = {}

    def look() -> None:  # once both ranks set their handlers (they print after), ask who handles SIGINT
        try:
            wait_until(lambda: printed == {0, 1}, what="both ranks to set their SIGINT handlers")
            result.update(cluster.where_reports(timeout_s=5.0))
        finally:
            release.touch()
    looking = threading.Thread(target=look)
    looking.start()
    r = cluster.run(code, on_output=lambda rank, s, text: printed.add(rank) if text.strip() == "set" else None)
    looking.join()
    assert r.ok, r.failures
    assert result[0]["sigint"] == "ignored" and result[1]["sigint"] == "user", result


def test_interrupt_storms_while_cells_raise_never_end_a_rank(make_cluster):
    c = make_cluster()
    pids = list(c.pids.values())
    stop = threading.Event()

    def storm() -> None:
        while not stop.is_set():
            for pid in pids:
                try:
                    os.kill(pid, signal.SIGINT)
                except ProcessLookupError:
                    return
            time.sleep(0.0005)

    code = ("class Slow(Exception):\n    def __str__(self):\n        return 'slow ' * 2000\n"
            "for i in range(200):\n    try:\n        raise Slow()\n    except Slow:\n        pass\nraise Slow()")
    storming = threading.Thread(target=storm, daemon=True)
    storming.start()
    try:
        for _ in range(25):
            r = c.run(code, on_output=quiet, check=False)
            assert set(r.failures) == {0, 1}
            assert {f.ename for f in r.failures.values()} <= {"Slow", "KeyboardInterrupt"}, r.failures
            assert not any(f.died for f in r.failures.values())
    finally:
        stop.set()
        storming.join()  # no SIGINT is sent after this: the last ones land on idle ranks
    assert c.state == "ready" and c.run("rank", on_output=quiet).values == {0: 0, 1: 1}


def test_the_request_loop_is_shielded_from_sigint():
    from kit.rank.process import Interrupts

    old = signal.getsignal(signal.SIGINT)
    try:
        guard = Interrupts()

        def kit_frame() -> None:
            import sys
            guard._handler(signal.SIGINT, sys._getframe())

        guard.shielded.add(kit_frame.__code__)
        guard.armed = True
        kit_frame()  # no KeyboardInterrupt: the kit's own frame is running
        assert guard.pending
        with pytest.raises(KeyboardInterrupt):
            guard._handler(signal.SIGINT, None)  # user code: it lands
        assert guard.describe() == "kit"
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        assert guard.describe() == "ignored" and guard.restore() and guard.describe() == "kit"
    finally:
        signal.signal(signal.SIGINT, old)
