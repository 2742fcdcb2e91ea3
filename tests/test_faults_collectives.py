"""Faults 3, 4 and 7: mismatched or skipped collectives are named on every rank within a second, and the
hang doctor (`Cluster.where`, a second interrupt) shows each rank's line, stack and recent collectives."""
from __future__ import annotations

import _thread
import threading
import time

import pytest

from conftest import quiet, wait_until

PG_TIMEOUT_S = 3.0


WALL_CLOCK_S = 30  # conftest's autouse wall_clock fixture enforces it




@pytest.mark.parametrize("code, rank0, rank1", [
    ("t = torch.ones(4)\nif rank == 0:\n    dist.all_reduce(t)\nelse:\n    dist.broadcast(t, 0)",
     "rank 0 called all_reduce(float32[4]) at line 3", "rank 1 called broadcast(float32[4], src=0) at line 5"),
    ("t = torch.ones(4 + rank)\ndist.all_reduce(t)",
     "rank 0 called all_reduce(float32[4]) at line 2", "rank 1 called all_reduce(float32[5]) at line 2"),
    ("t = torch.ones(4, dtype=torch.float32 if rank == 0 else torch.float64)\ndist.all_reduce(t)",
     "rank 0 called all_reduce(float32[4])", "rank 1 called all_reduce(float64[4])"),
], ids=["op", "shape", "dtype"])
def test_mismatch_is_named_on_every_rank_and_the_group_survives(cluster, code, rank0, rank1):
    pids = dict(cluster.pids)
    cluster.run("kept = rank", on_output=quiet)
    t0 = time.monotonic()
    r = cluster.run(code, on_output=quiet)
    assert time.monotonic() - t0 < 1.0
    assert set(r.failures) == {0, 1}
    for f in r.failures.values():
        assert f.ename == "CollectiveMismatchError" and rank0 in f.evalue and rank1 in f.evalue
        assert "still usable" in f.evalue
    assert cluster.pids == pids and cluster.state == "ready"  # no worker died
    r = cluster.run("t = torch.ones(3) * (rank + 1)\ndist.all_reduce(t)\n(kept, t.tolist())", on_output=quiet)
    assert r.values == {0: (0, [3.0] * 3), 1: (1, [3.0] * 3)}


def test_collective_only_one_rank_calls_is_named_at_once(cluster):
    t0 = time.monotonic()
    r = cluster.run("if rank == 0:\n    dist.barrier()", on_output=quiet)
    assert time.monotonic() - t0 < 1.0
    assert set(r.failures) == {0}
    assert "barrier() at line 2" in r.failures[0].evalue and "rank 1 finished the cell" in r.failures[0].evalue
    assert cluster.run("dist.barrier()\n'ok'", on_output=quiet).values == {0: "ok", 1: "ok"}


def test_skipped_collective_without_the_check_is_explained_before_the_timeout(cluster):
    notes: list[tuple[float, str]] = []
    t0 = time.monotonic()
    r = cluster.run("if rank == 0:\n    dist.barrier()", check=False,
                    on_output=lambda rank, s, text: notes.append((time.monotonic() - t0, text)) if rank < 0 else None)
    said = [(t, text) for t, text in notes if "finished the cell" in text]
    assert said and said[0][0] < PG_TIMEOUT_S, notes
    assert "rank 0 is blocked inside barrier() at line 2" in said[0][1]
    assert "Timed out" in r.failures[0].evalue and any("re-created the process group" in n for n in r.notes)
    assert cluster.run("dist.barrier()\n'ok'", on_output=quiet).values == {0: "ok", 1: "ok"}


def test_collective_on_a_subset_of_ranks_is_refused_with_the_fix(cluster):
    r = cluster.run("dist.all_reduce(torch.ones(1))", ranks=[1], on_output=quiet)
    assert "needs all 2 ranks" in r.failures[1].evalue and "drop --ranks" in r.failures[1].evalue


def test_where_shows_each_rank_line_stack_and_ledger(cluster, tmp_path):
    cluster.run("warm = torch.ones(2)\ndist.all_reduce(warm)", on_output=quiet)
    release = tmp_path / "release"
    code = (f"import os, time\nif rank == 1:\n    while not os.path.exists({str(release)!r}): time.sleep(0.02)\n"
            "t = torch.ones(2)\ndist.all_reduce(t)")  # rank 1 holds at line 3 until the test has looked
    result: dict = {}
    cell = threading.Thread(target=lambda: result.update(r=cluster.run(code, check=False, on_output=quiet)))
    cell.start()
    try:
        # one snapshot with rank 0 in the all_reduce and rank 1 at its loop (rank 1 may not have reached it yet)
        seen = wait_until(lambda: (w := cluster.where()) and w[0].startswith("blocked inside")
                          and "line 3: while not os.path.exists(" in w[1] and w,
                          what="rank 0 inside the all_reduce, rank 1 at line 3")
    finally:
        release.touch()
        cell.join()
    assert result["r"].ok, result["r"].failures
    assert seen[0].startswith("blocked inside all_reduce(float32[2]) at line 5")
    assert "stack (innermost last):" in seen[0] and "line 5, in <module>: dist.all_reduce(t)" in seen[0]
    assert "recent collectives (oldest first):" in seen[0] and "all_reduce(float32[2]): ok" in seen[0]
    assert seen[1].startswith("running <cell") and "line 3: while not os.path.exists(" in seen[1]
    idle = cluster.where()
    assert all(text.startswith("idle") for text in idle.values())


def test_second_interrupt_shows_every_stack_and_the_third_stops_waiting(cluster):
    cluster.run("kept = rank + 10", on_output=quiet)
    notes: list[str] = []
    code = "import time\nif rank == 1:\n    time.sleep(30)\nt = torch.ones(2)\ndist.all_reduce(t)"

    def interrupts() -> None:  # each once the kit is where the test means: rank 0 in the collective, then explained
        wait_until(lambda: cluster.where([0])[0].startswith("blocked inside"), what="rank 0 inside the all_reduce")
        _thread.interrupt_main()
        wait_until(lambda: any("rank 0 is blocked inside" in n for n in notes), what="the first interrupt explained")
        _thread.interrupt_main()
    threading.Thread(target=interrupts, daemon=True).start()
    r = cluster.run(code, check=False, on_output=lambda rank, s, text: notes.append(text) if rank < 0 else None)
    joined = "\n".join(notes)
    assert "interrupt sent to rank(s) 0, 1" in joined
    assert "rank 0 is blocked inside all_reduce(float32[2]) at line 5" in joined  # explained after the first
    assert "--- rank 0 ---" in joined and "dist.all_reduce(t)" in joined  # stacks after the second
    assert r.failures[0].ename == "KeyboardInterrupt" and r.failures[1].ename == "KeyboardInterrupt"
    assert any("re-created the process group" in n for n in r.notes)
    # a third interrupt: stop waiting; the ranks finish in the background, the next cell drains them
    notes.clear()

    def three() -> None:
        wait_until(lambda: cluster.where([0])[0].startswith("blocked inside"), what="rank 0 inside the all_reduce")
        for said in ("rank 0 is blocked inside", "--- rank 0 ---", None):
            _thread.interrupt_main()
            if said:
                wait_until(lambda: any(said in n for n in notes), what=f"the kit to say {said!r}")
    threading.Thread(target=three, daemon=True).start()
    with pytest.raises(KeyboardInterrupt):
        cluster.run(code, check=False, on_output=lambda rank, s, text: notes.append(text) if rank < 0 else None)
    assert cluster.where([0])[0].startswith("blocked inside all_reduce")
    assert cluster.run("kept", on_output=quiet).values == {0: 10, 1: 11}
    assert cluster.run("t = torch.ones(1)\ndist.all_reduce(t)\nt.item()", on_output=quiet).values == {0: 2.0, 1: 2.0}


def test_uneven_sends_before_a_collective_do_not_hang_the_pre_flight(cluster):
    """Ranks make different numbers of send/recv calls (rank 0 sends twice, rank 1 receives twice,
    as in a hand-written ring), then meet at a barrier: the pre-flight pairs world collectives only."""
    t0 = time.monotonic()
    r = cluster.run("t = torch.ones(2)\n"
                    "for _ in range(2):\n"
                    "    dist.send(t, 1) if rank == 0 else dist.recv(t, 0)\n"
                    "dist.barrier()\n"
                    "t.tolist()", on_output=quiet, timeout_s=10)
    assert r.ok, r.failures
    assert time.monotonic() - t0 < 5.0 and r.values == {0: [1.0, 1.0], 1: [1.0, 1.0]}
    tail = cluster.where([0])[0]
    assert "#1 barrier()" in tail and "#1 send" not in tail  # sends are listed without a number


def test_uneven_all_to_all_splits_pass_the_pre_flight(cluster):
    """all_to_all_single with different split sizes per rank (a mixture of experts' dispatch) is legal:
    the pre-flight compares dtypes only, and the tokens arrive."""
    r = cluster.run("send = [1, 2] if rank == 0 else [3, 1]\n"
                    "recv = [1, 3] if rank == 0 else [2, 1]\n"
                    "out = torch.empty(sum(recv))\n"
                    "dist.all_to_all_single(out, torch.arange(sum(send)).float() + 10 * rank, recv, send)\n"
                    "out.tolist()", on_output=quiet, timeout_s=10)
    assert r.ok, r.failures
    assert r.values == {0: [0.0, 10.0, 11.0, 12.0], 1: [1.0, 2.0, 13.0]}
    r = cluster.run("dist.all_to_all_single(torch.empty(2, dtype=torch.float32 if rank == 0 else torch.float64),\n"
                    "                       torch.zeros(2, dtype=torch.float32 if rank == 0 else torch.float64))",
                    on_output=quiet, timeout_s=10)
    assert {f.ename for f in r.failures.values()} == {"CollectiveMismatchError"}


def test_one_rank_skips_the_preflight_round_trip(tmp_path, monkeypatch):
    """With checks on, each collective waits for the kernel's verdict; one rank has nobody to disagree
    with, so it goes straight to torch (the round trip cost 0.3 ms a call on a GPU host, docs/gpu.md)."""
    import torch
    import torch.distributed as dist
    from kit.rank.ledger import Ledger

    dist.init_process_group("gloo", store=dist.FileStore(str(tmp_path / "store"), 1), rank=0, world_size=1)
    try:
        ledger = Ledger(0)
        sent = []

        def send(kind, body):  # the kernel's answer, at once
            sent.append(kind)
            ledger.deliver({"id": body["id"], "seq": body["seq"], "ok": True})

        all_reduce = ledger.wrap("all_reduce", dist.all_reduce, send)
        ledger.begin_request(1, check=True)
        t = torch.ones(2)
        all_reduce(t)
        assert sent == [] and ledger.entries[-1].op == "all_reduce" and t.tolist() == [1.0, 1.0]
        monkeypatch.setattr(dist, "get_world_size", lambda *a, **k: 2)  # as if a peer were there
        all_reduce(t)
        assert sent == ["preflight"] and ledger.entries[-1].seq == 2
    finally:
        dist.destroy_process_group()


def test_where_names_collectives_a_run_issued_outside_the_cells():
    """`%dist where` after a lab bench run: collectives issued outside any cell (a function the kernel
    called) are listed under "not from a cell", each with its number, call and time and no "line ?";
    a cell's collectives keep their cell and line."""
    from kit.rank.ledger import Entry, Ledger

    ledger = Ledger(0)
    ledger.entries.append(Entry(149, "all_reduce", "all_reduce(float32[3422218])", None, started_s=1.0, ended_s=1.001,
                                cell="<call>"))
    ledger.entries.append(Entry(1, "all_reduce", "all_reduce(float32[4])", 2, started_s=1.0, ended_s=1.002,
                                cell="In [3]"))
    first, second = ledger.tail()
    assert first.startswith("not from a cell: a function the kernel called (kit.experiments, the lab bench") \
        and "line ?" not in first and "#149 all_reduce(float32[3422218]): ok, 1.0 ms" in first, first
    assert second == "In [3] line 2: #1 all_reduce(float32[4]): ok, 2.0 ms", second


def test_the_ledger_reads_a_collectives_arguments_as_inspect_binds_them():
    """The ledger's fast argument binding (positional arguments zipped onto the names) gives what
    `inspect.signature(fn).bind_partial` gives for every wrapped torch.distributed function, and raises
    TypeError where it does (torch then gives its own message): the signature a rank sends to the
    pre-flight and shows in `%dist where` is unchanged."""
    import inspect
    import torch.distributed as dist
    from kit.rank.ledger import COLLECTIVES, P2P, argument_binder
    checked = 0
    for name in COLLECTIVES + P2P:
        fn = getattr(dist, name, None)
        if fn is None:
            continue
        names = [n for n, p in inspect.signature(fn).parameters.items() if p.kind != p.KEYWORD_ONLY]
        calls = [((), {})] + [(tuple(range(k)), {}) for k in range(1, len(names) + 2)]
        calls += [((0,), {n: 1}) for n in names[:3]] + [((), {n: 1 for n in names[:2]}), ((), {"no_such_arg": 1})]
        for args, kwargs in calls:
            try:
                want: object = inspect.signature(fn).bind_partial(*args, **kwargs).arguments
            except TypeError:
                want = TypeError
            try:
                got: object = argument_binder(fn)(args, kwargs)
            except TypeError:
                got = TypeError
            assert got == want, (name, args, kwargs, got, want)
            checked += 1
    assert checked > 100

    def every_kind(a, /, b, c=1, *, d=2):  # torch's have none of these kinds: the fallbacks still agree
        return a
    calls = [((1,), {}), ((1, 2), {"d": 3}), ((1,), {"a": 1}), ((1, 2, 3, 4), {}), ((), {"b": 1, "c": 2}),
             ((1, 2), {"b": 2}), ((1,), {"e": 5}), ((1,), {"d": 1, "c": 2})]
    for args, kwargs in calls:
        try:
            want = inspect.signature(every_kind).bind_partial(*args, **kwargs).arguments
        except TypeError:
            want = TypeError
        try:
            got = argument_binder(every_kind)(args, kwargs)
        except TypeError:
            got = TypeError
        assert got == want, (args, kwargs, got, want)
