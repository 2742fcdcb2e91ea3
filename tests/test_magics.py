"""The magics through IPython's test shell, as a notebook user types them."""
from __future__ import annotations

import os

import pytest
from IPython.core.error import UsageError
from IPython.testing.globalipapp import start_ipython

from conftest import assert_pids_gone


@pytest.fixture(scope="module")
def ip():
    shell = start_ipython() or __import__("IPython").get_ipython()  # IPython 7.34 returns None on a 2nd call
    shell.run_line_magic("load_ext", "kit")
    yield shell
    from kit.notebook.magics import get_cluster

    cluster = get_cluster()
    pids = list(cluster.pids.values()) if cluster else []
    shell.run_line_magic("unload_ext", "kit")
    assert_pids_gone(pids)


@pytest.fixture
def ranks(ip):
    """Two running ranks holding `t`, as after the module's first cell: each test also runs alone (`-k`)."""
    from kit.notebook.magics import get_cluster

    cluster = get_cluster()
    if cluster is None or cluster.state != "ready" or cluster.world_size != 2:  # also after a shutdown test
        ip.run_cell_magic("distributed", "--cpus 2", "t = torch.ones(3) * (rank + 1)\ndist.all_reduce(t)")
    return ip


def _children() -> set[int]:
    import psutil

    return {p.pid for p in psutil.Process().children(recursive=True)}


def test_help_lists_every_flag(ip, capsys):
    doc = ip.find_cell_magic("distributed").__doc__
    for flag in ("--gpus", "--cpus", "--ranks", "--fresh", "--timeout", "--strict", "--no-check"):
        assert flag in doc
    ip.run_cell("%%distributed?")
    assert "--gpus" in capsys.readouterr().out


@pytest.mark.parametrize("line, message", [
    ("--gpsu 2", "unrecognized arguments"),
    ("--gpus 2 --cpus 2", "not both"),
    ("--cpus 0", "world_size=0 is out of range"),
    ("--cpus 2 --timeout -1", "positive number"),
    ("--cpus 2 --ranks a,b", "--ranks 0,1"),
    ("--strict", "--strict goes with --gpus"),
    ("--cpus 2 --pg-timeout 0", "pg_timeout_s"),
    # no raw ConfigError tracebacks
    ("--cpus 2 --ranks 1-0", r"--ranks 1-0 .*backwards.*--ranks 0-1"),
    ("--cpus 2 --timeout nan", "--timeout nan must be a positive number"),
    ("--cpus 2 --timeout inf", "--timeout inf must be a positive number"),
    ("--cpus 2 --pg-timeout nan", "pg_timeout_s"),
    ("--cpus 2 --threads 0", "threads_per_rank"),
    ("--cpus 2 --ranks 5", r"--ranks \[5\] out of range: this group has ranks 0..1"),
    ("--cpus 2 --fresh --ranks 2", r"--ranks \[2\] out of range"),
])
def test_bad_flags_raise_usage_error_before_spawning(ip, line, message):
    before = _children()
    with pytest.raises(UsageError, match=message):
        ip.run_cell_magic("distributed", line, "1")
    assert _children() <= before


def test_first_cell_then_state_persists(ip, capsys):
    ip.run_cell_magic("distributed", "--cpus 2", "t = torch.ones(3) * (rank + 1)\ndist.all_reduce(t)\nprint(t)")
    out = capsys.readouterr().out
    assert "[rank 0] tensor([3., 3., 3.])" in out and "[rank 1] tensor([3., 3., 3.])" in out
    ip.run_cell_magic("distributed", "", "t.sum().item()")
    assert "[ranks 0,1] Out: 9.0" in capsys.readouterr().out  # identical values shown once


def test_different_values_shown_per_rank(ranks, ip, capsys):
    ip.run_cell_magic("distributed", "", "rank * 100")
    out = capsys.readouterr().out
    assert "[rank 0] Out: 0" in out and "[rank 1] Out: 100" in out


def test_failing_cell_fails_the_run(ranks, ip, capsys):
    res = ip.run_cell("%%distributed\nif rank == 1:\n    raise ValueError('only on rank 1')")
    assert not res.success and "rank 1 raised ValueError at line 2" in str(res.error_in_exec)
    assert "only on rank 1" in capsys.readouterr().out  # the rank's traceback is rendered


def test_expect_error_shows_the_error_without_failing_the_run(ranks, ip, capsys):
    res = ip.run_cell("%%distributed --expect-error\nif rank == 0:\n    raise KeyError('on purpose')")
    assert res.success
    assert "rank 0 raised KeyError at line 2" in capsys.readouterr().out
    res = ip.run_cell("%%distributed --expect-error\n1 + 1")
    assert not res.success and "succeeded everywhere" in str(res.error_in_exec)


def test_changing_world_size_is_refused_with_the_fix(ranks, ip):
    with pytest.raises(UsageError, match="%dist restart --cpus 3"):
        ip.run_cell_magic("distributed", "--cpus 3", "1")


def test_ranks_flag_and_push_pull(ranks, ip, capsys):
    ip.user_ns["lr"] = 0.5
    ip.run_line_magic("dist", "push lr")
    ip.run_cell_magic("distributed", "--ranks 1", "picked = lr * rank")
    ip.run_line_magic("dist", "pull picked --ranks 1")
    assert ip.user_ns["picked"] == 0.5
    ip.run_line_magic("dist", "pull picked --ranks 1,1")  # a rank named twice is one rank: its value, not a dict
    assert ip.user_ns["picked"] == 0.5
    with pytest.raises(UsageError, match="out of range"):
        ip.run_cell_magic("distributed", "--ranks 5", "1")
    with pytest.raises(UsageError, match="not defined in the kernel"):
        ip.run_line_magic("dist", "push nope_not_here")


def test_pulling_a_name_the_ranks_lack_says_so_in_one_line(ranks, ip):
    """One line, not the rank's NameError with a traceback through the kit's own frames."""
    ip.user_ns["only_one"] = "kernel's"
    ip.run_cell_magic("distributed", "--ranks 1", "only_one = rank")
    with pytest.raises(UsageError) as err:
        ip.run_line_magic("dist", "pull only_one nowhere_x")
    assert str(err.value) == (
        "pull of only_one, nowhere_x refused: rank 0 has no variable only_one; ranks 0, 1 have no variable "
        "nowhere_x; only_one, nowhere_x in the kernel are unchanged. Assign them in a %%distributed cell first "
        "(variables of the kernel's own cells are not on the ranks: %dist push copies one there), then pull again")
    assert ip.user_ns["only_one"] == "kernel's" and "nowhere_x" not in ip.user_ns
    ip.run_line_magic("dist", "pull only_one --ranks 1")  # the rank that has it
    assert ip.user_ns["only_one"] == 1


def test_status_where_and_unknown_action(ranks, ip, capsys):
    ip.run_line_magic("dist", "status")
    out = capsys.readouterr().out
    assert "ready: 2 rank(s), backend gloo" in out and "rank 1: pid" in out
    ip.run_line_magic("dist", "where")
    assert "--- rank 0 ---" in capsys.readouterr().out
    with pytest.raises(UsageError, match="unknown action"):
        ip.run_line_magic("dist", "explode")
    with pytest.raises(UsageError, match="out of range"):
        ip.run_line_magic("dist", "where --ranks 9")
    with pytest.raises(UsageError, match="--ranks 0,1"):
        ip.run_cell_magic("distributed", "--ranks 1-", "1")
    with pytest.raises(UsageError, match="not a number of ranks"):
        ip.run_line_magic("dist", "restart --cpus x")


def test_fresh_runs_in_new_processes_and_leaves_the_persistent_ranks(ranks, ip, capsys, tmp_path):
    """--fresh: new ranks for one cell, stopped after it; the persistent ranks and their variables untouched;
    `%dist export` leaves the cell out (it did not run on the ranks the script stands for)."""
    import re

    from kit.notebook.magics import get_cluster

    before = dict(get_cluster().pids)
    ip.run_cell_magic("distributed", "--fresh --cpus 2", "import os\nos.getpid()  # fresh-cell")
    fresh = [int(pid) for pid in re.findall(r"\[rank \d\] Out: (\d+)", capsys.readouterr().out)]
    assert len(fresh) == 2 and not set(fresh) & set(before.values()), (fresh, before)
    assert_pids_gone(fresh)
    assert get_cluster().pids == before and get_cluster().run("t.sum().item()", on_output=lambda *a: None).ok
    ip.run_line_magic("dist", f"export {tmp_path / 'script.py'}")
    script = (tmp_path / "script.py").read_text()
    assert "left out, it ran with --fresh in separate processes" in script
    assert "# os.getpid()  # fresh-cell" in script and "\nos.getpid()  # fresh-cell" not in script


def test_export_leaves_out_the_cells_whose_ranks_a_restart_replaced(ranks, ip, capsys, tmp_path):
    """After `%dist restart` the ranks hold none of the earlier cells' variables; the export ran those cells
    again before the later ones (a script whose state differs from the notebook's: `'w' in dir()` was True
    under torchrun, False in the notebook). They are now commented out with the reason."""
    ip.run_cell_magic("distributed", "", "w = 1  # before-restart")
    ip.run_line_magic("dist", "restart")
    ip.run_cell_magic("distributed", "", "print('w' in dir())  # after-restart")
    assert "[rank 0] False" in capsys.readouterr().out
    ip.run_line_magic("dist", f"export {tmp_path / 'script.py'} --force")
    script = (tmp_path / "script.py").read_text()
    assert "left out, it ran on ranks that a later `%dist restart` or `shutdown` replaced" in script
    assert "# w = 1  # before-restart" in script and "\nw = 1  # before-restart" not in script
    assert "\nprint('w' in dir())  # after-restart" in script
    ip.run_cell_magic("distributed", "", "t = torch.ones(3) * (rank + 1)\ndist.all_reduce(t)")  # as `ranks` left it


def test_reload_is_idempotent_and_keeps_ranks(ranks, ip, capsys):
    from kit.notebook.magics import get_cluster

    pids = dict(get_cluster().pids)
    ip.run_line_magic("load_ext", "kit")  # a second %load_ext is a no-op: same ranks, same variables
    ip.run_line_magic("load_ext", "kit")
    assert get_cluster().pids == pids
    assert ip.run_cell("%reload_ext kit").success  # as a user types it: the ranks and their variables are kept
    assert "%reload_ext kept the 2 running rank(s)" in capsys.readouterr().err
    assert get_cluster() is not None and get_cluster().pids == pids
    assert get_cluster().run("t.sum().item()", on_output=lambda *a: None).values == {0: 9.0, 1: 9.0}
    ip.run_cell_magic("distributed", "--cpus 2", "t = torch.ones(3) * 3")


def test_fallback_banner_and_strict(monkeypatch, capsys):
    shell = start_ipython() or __import__("IPython").get_ipython()  # IPython 7.34 returns None on a 2nd call
    monkeypatch.setenv("KIT_FAKE_GPU_COUNT", "1")  # Colab: one GPU visible
    from kit.notebook.magics import DistributedMagics

    m = DistributedMagics(shell)
    before = _children()
    with pytest.raises(UsageError, match="1 is visible, and --strict forbids"):
        m.distributed("--gpus 2 --strict", "1")
    assert _children() <= before
    m.distributed("--gpus 2", "dist.get_backend()")
    out = capsys.readouterr()
    assert "FALLBACK" in out.out and "Duplicate GPU" in out.out and "'gloo'" in out.out
    assert "!!!" not in out.out + out.err  # calm: the expected path on Colab, not an alarm
    pids = list(m.cluster.pids.values())
    m.cluster.shutdown()
    assert_pids_gone(pids)


def test_shutdown_says_whether_ranks_were_running(ip, capsys):
    ip.run_cell_magic("distributed", "--cpus 2", "rank")
    pids = list(ip.find_line_magic("dist").__self__.cluster.pids.values())
    capsys.readouterr()
    ip.run_line_magic("dist", "shutdown")
    assert capsys.readouterr().out.startswith("ranks stopped")
    assert_pids_gone(pids)
    ip.run_line_magic("dist", "shutdown")  # again: nothing was running, and saying "stopped" would mislead
    assert capsys.readouterr().out.startswith("no ranks were running")


def test_dist_status_and_shutdown_see_the_ranks_kit_experiments_started(ip, capsys):
    """The lab bench and kit.experiments.run start their own ranks when no %%distributed ones are ready.
    `%dist status` said "no ranks running" and `%dist shutdown` "no ranks were running" while those 2 ranks
    (about 230 MiB each) kept running; a `%dist restart` said "earlier variables are gone" of ranks it never
    had. Each now names them, and shutdown stops them."""
    from kit.experiments import cluster_for

    ip.run_line_magic("dist", "shutdown")
    theirs = cluster_for(2)  # what run()/the lab bench use when %%distributed has no ranks
    pids = list(theirs.pids.values())
    capsys.readouterr()
    ip.run_line_magic("dist", "status")
    out = capsys.readouterr().out
    assert out.startswith("no %%distributed ranks running") and "also running in this kernel: 2 rank(s)" in out, out
    assert all(str(p) in out for p in pids), out
    ip.run_line_magic("dist", "restart --cpus 2")
    out = capsys.readouterr().out
    assert "started: 2 rank(s)" in out and "earlier variables are gone" not in out, out
    assert "also running in this kernel: 2 rank(s)" in out, out
    mine = list(ip.find_line_magic("dist").__self__.cluster.pids.values())
    ip.run_line_magic("dist", "shutdown")
    out = capsys.readouterr().out
    assert out.startswith("ranks stopped; stopped 2 rank(s) that kit.experiments"), out
    assert theirs.state == "stopped"
    assert_pids_gone(pids + mine)
    assert cluster_for(2).state == "ready"  # the next run starts its ranks again
    from kit.experiments import shutdown
    shutdown()


def test_an_interrupted_start_is_one_line_and_leaves_no_ranks(ip, monkeypatch):
    # The stop button while the first cell's ranks start (Binder's first start takes seconds): it printed a
    # 60-line KeyboardInterrupt traceback through the kit's start-up.
    from kit.engine.cluster import Cluster
    from kit.notebook.magics import get_cluster

    ip.run_line_magic("dist", "shutdown")
    real, pids = Cluster.start, []

    def start_then_interrupt(self):
        real(self)  # the ranks came up; the interrupt lands before the magic has them
        pids.extend(self.pids.values())
        raise KeyboardInterrupt

    monkeypatch.setattr(Cluster, "start", start_then_interrupt)
    with pytest.raises(UsageError, match="start-up interrupted: no ranks are running; run the cell again"):
        ip.run_cell_magic("distributed", "--cpus 2", "rank")
    assert len(pids) == 2
    assert_pids_gone(pids)
    assert get_cluster() is None or get_cluster().state == "stopped"


def test_unload_stops_workers(ip):
    from kit.notebook.magics import get_cluster

    ip.run_cell_magic("distributed", "--cpus 2", "rank")
    pids = list(get_cluster().pids.values())
    assert ip.run_cell("%unload_ext kit").success  # in a cell: no load took the ranks, so they stop when it ends
    assert_pids_gone(pids)
    assert "distributed" not in ip.magics_manager.magics["cell"]
    ip.run_line_magic("load_ext", "kit")
    ip.run_cell_magic("distributed", "--cpus 2", "rank")
    pids = list(get_cluster().pids.values())
    ip.run_line_magic("unload_ext", "kit")  # a script driving the shell, outside any cell: they stop at once
    assert_pids_gone(pids)
    ip.run_line_magic("load_ext", "kit")  # back for the module fixture's teardown


def test_unload_then_load_in_one_cell_keeps_ranks_as_a_reload_does(ip):
    """This shell's own ranks (read from its own magics: other modules' shells may share the process)."""
    from kit.notebook import magics

    own = magics._INSTANCES[id(ip)].cluster
    if own is None or own.world_size != 2 or own.state == "stopped":
        ip.run_cell_magic("distributed", "--cpus 2", "x = rank")
        own = magics._INSTANCES[id(ip)].cluster
    pids = dict(own.pids)
    assert ip.run_cell("%unload_ext kit\n%load_ext kit").success
    kept = magics._INSTANCES[id(ip)].cluster
    assert kept is not None and kept.pids == pids and kept.state != "stopped"


def test_the_cluster_is_the_current_shells_when_another_shell_loaded_the_kit_first(ranks, ip, monkeypatch):
    """Several shells in one process (tests): get_cluster answers for the current one, not the first loaded."""
    from kit.notebook import magics

    other_shells_magics = type("Magics", (), {"cluster": None})()
    monkeypatch.setattr(magics, "_INSTANCES", {-1: other_shells_magics, **magics._INSTANCES})
    assert magics.get_cluster() is not None and magics.get_cluster() is magics._INSTANCES[id(ip)].cluster


# Compare the placement, not the flag; flags given while ranks run are applied or refused.
def test_gpus_after_cpus_without_gpus_uses_the_same_ranks(ip, capsys, monkeypatch):
    from kit.notebook.magics import get_cluster

    monkeypatch.setenv("KIT_FAKE_GPU_COUNT", "0")
    ip.run_cell_magic("distributed", "--cpus 2", "1")
    pids = dict(get_cluster().pids)
    capsys.readouterr()
    ip.run_cell_magic("distributed", "--gpus 2", "dist.get_backend()")  # no GPU here: --gpus 2 means these ranks
    out = capsys.readouterr()
    assert "'gloo'" in out.out and get_cluster().pids == pids
    with pytest.raises(UsageError, match="--strict forbids"):
        ip.run_cell_magic("distributed", "--gpus 2 --strict", "1")
    with pytest.raises(UsageError, match="%dist restart --gpus 3"):
        ip.run_cell_magic("distributed", "--gpus 3", "1")


def test_pg_timeout_while_running_asks_for_a_restart_and_threads_apply(ip, capsys):
    from kit.notebook.magics import get_cluster

    ip.run_cell_magic("distributed", "--cpus 2", "1")
    pids = dict(get_cluster().pids)
    with pytest.raises(UsageError, match=r"--pg-timeout 7 .*`%dist restart --pg-timeout 7`"):
        ip.run_cell_magic("distributed", "--pg-timeout 7", "1")
    ip.run_cell_magic("distributed", "--pg-timeout 60", "1")  # the value already in force: fine
    ip.run_cell_magic("distributed", "--threads 2", "torch.get_num_threads()")
    out = capsys.readouterr()
    assert "[ranks 0,1] Out: 2" in out.out and "2 torch thread(s) per rank now" in out.err
    assert get_cluster().pids == pids and get_cluster().config.threads == 2
    ip.run_line_magic("dist", "restart --cpus 2 --pg-timeout 7 --threads 1")
    assert get_cluster().config.pg_timeout_s == 7 and get_cluster().config.threads == 1


def test_start_up_progress_and_more_ranks_than_cores(monkeypatch, make_cluster, capsys):
    from kit.engine import ready

    monkeypatch.setattr(ready, "PROGRESS_EVERY_S", 0.2)
    n = (os.cpu_count() or 1) + 1
    make_cluster(world_size=n, template=False)  # fresh interpreters: forked ranks join before the first progress line
    seen = capsys.readouterr()
    err = seen.err
    # on stdout (a red note in a lesson that needs these ranks read as an error)
    assert f"{n} ranks on {os.cpu_count()} core(s)" in seen.out and f"{n} ranks on" not in err
    # the advice holds wherever the ranks came from: a cell's --cpus, or run()'s config (lesson 08's 3 ranks)
    cores = os.cpu_count()
    assert (f"expected where a lesson asks for {n} ranks. Otherwise {cores} ranks show the same collectives faster "
            f"(--cpus {cores} in a %%distributed cell, world_size={cores} in a config)") in seen.out
    assert f"/{n} ranks joined" in err


def test_broken_ranks_are_a_usage_error_with_the_fix(ip):
    """What the next cell says is a message with the choice, not a traceback through the kit."""
    import signal

    from kit.notebook.magics import get_cluster

    ip.run_cell_magic("distributed", "--cpus 2", "1")
    os.kill(get_cluster().pids[1], signal.SIGKILL)
    import time

    deadline = time.monotonic() + 30  # the kernel notices the death between cells, without a request
    while get_cluster().state != "broken" and time.monotonic() < deadline:
        time.sleep(0.05)
    with pytest.raises(UsageError, match=r"rank 1 was killed by SIGKILL.*`%dist restart`"):
        ip.run_cell_magic("distributed", "", "1")
    ip.run_line_magic("dist", "restart --cpus 2")
