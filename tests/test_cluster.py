"""The engine through kit.Cluster: 2 gloo ranks on CPU, as a learner's cells would use them."""
from __future__ import annotations

import ctypes
import os
import threading
import _thread
import time

import pytest

from kit.errors import CellError, ConfigError
from conftest import quiet, wait_until


def test_all_reduce_and_state_persists(cluster):
    r = cluster.run("t = torch.ones(3) * (rank + 1)\ndist.all_reduce(t)\nt.tolist()", on_output=quiet)
    assert r.ok and r.values == {0: [3.0, 3.0, 3.0], 1: [3.0, 3.0, 3.0]}
    r = cluster.run("t.sum().item() + rank", on_output=quiet)  # `t` survived between cells
    assert r.values == {0: 9.0, 1: 10.0}


def test_predefined_names_and_torchrun_env(cluster):
    r = cluster.run("import os\n(rank, world_size, local_rank, str(device), os.environ['RANK'], "
                           "os.environ['WORLD_SIZE'], dist.get_backend(), torch.get_num_threads())", on_output=quiet)
    assert r.values[1][:6] == (1, 2, 1, "cpu", "1", "2") and r.values[1][6] == "gloo"
    assert r.values[0][7] >= 1


def test_output_is_labelled_and_ordered_per_rank(cluster):
    lines: list[tuple[int, str, str]] = []
    r = cluster.run("import sys\nfor i in range(50):\n    print(rank, i)\nprint('err', file=sys.stderr)",
                           on_output=lambda *a: lines.append(a))
    assert r.ok
    for rank in (0, 1):
        got = [text for (rk, stream, text) in lines if rk == rank and stream == "stdout"]
        assert got == [f"{rank} {i}" for i in range(50)]
        assert (rank, "stderr", "err") in lines


def test_c_level_output_is_captured(cluster):
    r = cluster.run("import ctypes\nctypes.CDLL(None).puts(b'hello from C')", on_output=quiet)
    assert r.stdout(0).splitlines()[-1] == "hello from C" and "hello from C" in r.stdout(1)


def test_carriage_return_progress_keeps_latest_state(cluster):
    r = cluster.run("for i in range(5):\n    print(f'\\rstep {i}', end='')\nprint()", on_output=quiet)
    assert r.stdout(0) == "step 4"


def test_error_shows_rank_traceback_with_cell_lines_and_state_survives(cluster):
    cluster.run("keep = 41", on_output=quiet)
    r = cluster.run("x = 1\nif rank == 1:\n    raise ValueError('bad value on one rank')", on_output=quiet)
    assert set(r.failures) == {1}
    f = r.failures[1]
    assert (f.ename, f.line) == ("ValueError", 3) and '<cell' in f.traceback and "line 3" in f.traceback
    with pytest.raises(CellError, match="rank 1 raised ValueError at line 3"):
        r.raise_for_error()
    assert cluster.run("keep + 1", on_output=quiet).values == {0: 42, 1: 42}


def test_syntax_error_is_reported_not_fatal(cluster):
    r = cluster.run("def broken(:\n  pass", on_output=quiet)
    assert r.failures[0].ename == "SyntaxError" and r.failures[0].line == 1
    assert cluster.run("2 + 2", on_output=quiet).values[0] == 4


def test_ranks_subset(cluster):
    r = cluster.run("only = rank", ranks=[1], on_output=quiet)
    assert r.ok and r.ranks == (1,)
    assert cluster.run("'only' in globals()", on_output=quiet).values == {0: False, 1: True}
    with pytest.raises(ConfigError, match="not in 0..1"):
        cluster.run("1", ranks=[2])


def test_push_pull_and_call(cluster):
    cluster.push({"lr": 0.1, "names": ["a", "b"]})
    assert cluster.run("(lr, names[rank])", on_output=quiet).values == {0: (0.1, "a"), 1: (0.1, "b")}
    assert cluster.pull("lr", ranks=[1]) == {1: {"lr": 0.1}}
    assert cluster.call("os:getpid") == cluster.pids
    with pytest.raises(CellError, match="NameError"):
        cluster.pull("no_such_name")


def test_unpicklable_and_huge_values_come_back_as_repr(cluster):
    r = cluster.run("lambda: 0", on_output=quiet)
    assert r.values[0].startswith("<function <lambda>") and "could not be sent" in r.replies[0]["value"]["note"]
    r = cluster.run("torch.zeros(20_000_000)", on_output=quiet)  # 80 MB > 64 MiB limit
    assert r.ok and "over the 64 MiB limit" in r.replies[0]["value"]["note"]


def test_figures_made_on_a_rank_come_back(cluster):
    r = cluster.run("import matplotlib.pyplot as plt\nplt.plot([0, rank])\nNone", on_output=quiet)
    assert r.ok and all(imgs[0].startswith(b"\x89PNG") for imgs in r.figures.values()) and len(r.figures) == 2


def _rss_mib(pid: int) -> int:
    status = open(f"/proc/{pid}/status").read()
    return int(status.split("VmRSS:")[1].split()[0]) >> 10


@pytest.mark.skipif(not os.path.exists("/proc/self/status") or not hasattr(ctypes.CDLL(None), "malloc_trim"),
                    reason="needs Linux's /proc and glibc's malloc_trim")
def test_memory_a_cell_freed_is_not_resident_once_the_cell_is_done(cluster):
    """Ranks live across cells and runs, and share a notebook's memory limit (lesson 07 in Binder's 1 GiB):
    what a finished cell freed must not stay resident. glibc keeps freed memory below its heap's top (here
    pinned by `keep`, allocated last); without the rank's malloc_trim each rank stays ~200 MiB larger."""
    before = {rank: _rss_mib(pid) for rank, pid in cluster.pids.items()}
    r = cluster.run("blobs = [bytearray(b'x' * (64 << 10)) for _ in range(3200)]  # 200 MiB, from the heap\n"
                    "keep = bytearray(b'x' * (64 << 10))\n"
                    "grown_mib = int(open('/proc/self/status').read().split('VmRSS:')[1].split()[0]) >> 10\n"
                    "del blobs", on_output=quiet)
    assert r.ok, r
    after = {rank: _rss_mib(pid) for rank, pid in cluster.pids.items()}
    grown = cluster.pull("grown_mib")
    for rank in after:
        assert grown[rank]["grown_mib"] - before[rank] > 150, (grown, before)  # the cell did hold the memory
        assert after[rank] - before[rank] < 50, (rank, before, after)


def test_interrupt_stops_every_rank_and_keeps_state(cluster):
    cluster.run("survivor = rank * 10", on_output=quiet)
    sent: list[float] = []

    def interrupt() -> None:  # once both ranks run the endless loop, not before it reached them
        wait_until(lambda: all(t.startswith("running") for t in cluster.where().values()), what="the ranks to run")
        sent.append(time.monotonic())
        _thread.interrupt_main()
    threading.Thread(target=interrupt, daemon=True).start()
    r = cluster.run("while True:\n    pass", on_output=quiet)
    assert time.monotonic() - sent[0] < 15  # the loop never ends by itself (15 s: CI's loaded cores)
    assert {f.ename for f in r.failures.values()} == {"KeyboardInterrupt"} and set(r.failures) == {0, 1}
    assert any("kept" in n for n in r.notes)
    assert cluster.run("survivor", on_output=quiet).values == {0: 0, 1: 10}


def test_cell_timeout_interrupts(cluster):
    t0 = time.monotonic()
    r = cluster.run("import time\ntime.sleep(30)", timeout_s=1.0, on_output=quiet)
    # the cell sleeps 30 s: a 1 s timeout ends it well before (15 s of slack for CI's loaded cores)
    assert time.monotonic() - t0 < 16 and not r.ok and any("--timeout" in n for n in r.notes)


def test_status_reports_live_ranks(cluster):
    s = cluster.status()
    assert s["state"] == "ready" and s["backend"] == "gloo" and len(s["ranks"]) == 2
    assert all(info["alive"] and info["rss_mib"] > 50 for info in s["ranks"].values())


def test_restart_gives_fresh_ranks(make_cluster):
    c = make_cluster()
    c.run("x = 1", on_output=quiet)
    old = set(c.pids.values())
    c.restart()
    assert not old & set(c.pids.values())
    assert c.run("'x' in globals()", on_output=quiet).values == {0: False, 1: False}


def test_call_reports_progress_from_the_ranks(cluster):
    seen: list[tuple[int, int, int]] = []
    code = "from kit.rank import hooks as _hooks\nimport time\nfor i in range(5):\n    _hooks.progress(i + 1, 5, force=True)\n"
    cluster.run(code, on_output=quiet)  # run() has no progress callback: nothing breaks
    cluster.call("kit.rank.hooks:progress", 3, 7, True, on_progress=lambda *a: seen.append(a))
    assert sorted(seen) == [(0, 3, 7), (1, 3, 7)]


def test_a_second_caller_is_told_the_ranks_are_busy(cluster, tmp_path):
    notes: list[str] = []
    release = tmp_path / "release"
    hold = f"import os, time\nwhile not os.path.exists({str(release)!r}):\n    time.sleep(0.02)"
    worker = threading.Thread(target=cluster.run, args=(hold,), kwargs={"on_output": quiet})
    worker.start()
    try:
        deadline = time.monotonic() + 60  # the first request runs on both ranks
        while not all(t.startswith("running") for t in cluster.where().values()):
            assert time.monotonic() < deadline, cluster.where()
            time.sleep(0.05)

        def on_output(rank: int, stream: str, text: str) -> None:
            if rank < 0:
                notes.append(text)
                release.touch()  # told: now let the first request end
        r = cluster.run("'after'", on_output=on_output)
    finally:
        release.touch()
        worker.join()
    assert r.values == {0: "after", 1: "after"} and any("busy with another request" in n for n in notes)


def test_tutorial_code_that_inits_and_destroys_the_group_just_works(cluster):
    """Scripts pasted from tutorials call init_process_group first and destroy_process_group last."""
    r = cluster.run("import torch.distributed as dist\ndist.init_process_group('nccl')\n"
                           "t = torch.ones(1)\ndist.all_reduce(t)\nt.item()", on_output=quiet)
    assert r.ok and r.values == {0: 2.0, 1: 2.0}
    assert "init_process_group() skipped" in r.stderr(0) and "you asked for 'nccl'" in r.stderr(0)
    r = cluster.run("dist.destroy_process_group()", on_output=quiet)
    assert r.ok and any("re-created the default group" in n for n in r.notes)
    r = cluster.run("t = torch.ones(1) * (rank + 1)\ndist.all_reduce(t)\nt.item()", on_output=quiet)
    assert r.values == {0: 3.0, 1: 3.0}
    r = cluster.run("dist.destroy_process_group()\ndist.init_process_group('gloo')\n"
                           "t = torch.ones(1)\ndist.all_reduce(t)\nt.item()", on_output=quiet)
    assert r.ok and r.values == {0: 2.0, 1: 2.0} and not r.notes  # their own re-init is honoured


def test_display_on_a_rank_sends_rich_output_live(cluster):
    shown: list[tuple[int, dict]] = []
    code = ("import matplotlib.pyplot as plt\nfig = plt.figure()\nplt.plot([0, rank])\ndisplay(fig)\n"
            "display({'rank': rank})\nNone")
    r = cluster.run(code, on_output=quiet, on_display=lambda rank, b: shown.append((rank, b)))
    assert r.ok and not r.figures  # the displayed figure is not sent twice
    pngs = [b for _, b in shown if "image/png" in b]
    assert len(pngs) == 2 and all(b["image/png"][:4] == b"\x89PNG" for b in pngs)
    assert sorted(b["text/plain"] for _, b in shown if "image/png" not in b) == ["{'rank': 0}", "{'rank': 1}"]
    r = cluster.run("display('kept for later')", on_output=quiet)  # no callback: kept in the result
    assert sorted(b["text/plain"] for _, b in r.displays) == ["'kept for later'", "'kept for later'"]


def test_shutdown_from_another_thread_ends_a_running_cell(make_cluster):
    c = make_cluster()
    threading.Timer(1.0, c.shutdown).start()
    t0 = time.monotonic()
    r = c.run("import time\ntime.sleep(60)", on_output=quiet)
    assert time.monotonic() - t0 < 10 and not r.ok
    assert {f.ename for f in r.failures.values()} == {"Shutdown"}


def test_plain_python_output_labels_ranks_and_kit_notes(cluster, capsys):
    cluster.run("import time\nprint('hi')\ntime.sleep(30)", timeout_s=1.0)
    out = capsys.readouterr()
    assert "[rank 0] hi" in out.out and "[kit] timeout: 1 s passed" in out.err and "[rank -1]" not in out.err


def _cgroup(tmp_path, lines: str, files: dict[str, str]) -> tuple[str, str]:
    (tmp_path / "cgroup").write_text(lines)
    for name, text in files.items():
        (tmp_path / "fs" / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / "fs" / name).write_text(text)
    return str(tmp_path / "cgroup"), str(tmp_path / "fs")


@pytest.mark.parametrize("lines,files,quota_cpus", [
    ("0::/user.slice/job\n", {"user.slice/job/cpu.max": "50000 100000\n", "cpu.max": "max 100000\n"}, 1),
    ("0::/a/b\n", {"a/cpu.max": "150000 100000\n", "a/b/cpu.max": "max 100000\n"}, 2),  # a parent's quota binds
    ("0::/\n", {"cpu.max": "max 100000\n"}, None),
    ("2:cpu,cpuacct:/docker/x\n", {"cpu,cpuacct/docker/x/cpu.cfs_quota_us": "100000\n",
                                   "cpu,cpuacct/docker/x/cpu.cfs_period_us": "100000\n"}, 1),
    ("2:cpu,cpuacct:/\n", {"cpu,cpuacct/cpu.cfs_quota_us": "-1\n", "cpu,cpuacct/cpu.cfs_period_us": "100000\n"}, None),
], ids=["v2-half", "v2-parent", "v2-none", "v1-one", "v1-none"])
def test_usable_cpus_honour_the_cgroup_quota(tmp_path, lines, files, quota_cpus):
    from kit.cpus import usable_cpus

    affinity = len(os.sched_getaffinity(0))
    expected = affinity if quota_cpus is None else min(affinity, quota_cpus)
    assert usable_cpus(*_cgroup(tmp_path, lines, files)) == expected


def test_threads_per_rank_respect_an_explicit_omp_num_threads():
    from kit.cpus import threads_per_rank, usable_cpus

    assert threads_per_rank(2, {"OMP_NUM_THREADS": "3"}) == 3
    assert threads_per_rank(2, {"OMP_NUM_THREADS": "0"}) == threads_per_rank(2, {}) == max(1, usable_cpus() // 2)
