"""No orphans: workers die with their kernel however it dies, and a new kernel reaps leftovers."""
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
    import json, signal, sys, time
    # A kernel that these signals kill: under `nohup` (or a background job) the test runner ignores SIGHUP
    # (SIGINT), and an ignored signal stays ignored in its children, so this fake kernel would not die at all.
    signal.signal(signal.SIGHUP, signal.SIG_DFL)
    signal.signal(signal.SIGINT, signal.default_int_handler)
    from kit.engine.cluster import Cluster
    from kit.config import LaunchConfig
    c = Cluster(LaunchConfig(world_size=2)).start()
    print(json.dumps(list(c.pids.values())), flush=True)
    if sys.argv[1] == "exit":
        sys.exit(0)          # a normal kernel shutdown: atexit stops the ranks
    time.sleep(600)
""")


def _fake_kernel(mode: str, env: dict | None = None) -> tuple[subprocess.Popen, list[int]]:
    proc = subprocess.Popen([sys.executable, "-c", FAKE_KERNEL, mode], stdout=subprocess.PIPE, text=True,
                            env=env or os.environ.copy())
    pids = json.loads(proc.stdout.readline())
    return proc, pids


@pytest.mark.parametrize("sig", [signal.SIGKILL, signal.SIGTERM, signal.SIGINT, signal.SIGHUP])
def test_workers_die_with_the_kernel(sig):
    proc, pids = _fake_kernel("sleep")
    os.kill(proc.pid, sig)
    proc.wait(timeout=10)
    assert_pids_gone(pids, within_s=3)


def test_normal_exit_stops_workers():
    proc, pids = _fake_kernel("exit")
    assert proc.wait(timeout=10) == 0
    assert_pids_gone(pids, within_s=3)


def test_shutdown_leaves_no_pids_and_no_run_dir(make_cluster):
    c = make_cluster()
    run_dir, pids = c.status()["run_dir"], list(c.pids.values())
    c.shutdown()
    assert_pids_gone(pids, within_s=3)
    assert not os.path.exists(run_dir)
    c.shutdown()  # idempotent


def test_stale_workers_of_a_dead_kernel_are_reaped(make_cluster):
    """Workers whose kernel died without them (e.g. a kernel that lost its watchdogs) are reaped next time."""
    from kit.engine import run_dirs

    dead_kernel = subprocess.Popen([sys.executable, "-c", "pass"])
    dead_kernel.wait()
    run_dir = run_dirs.make_run_dir()
    # stands in for a surviving worker: its own session, and the session marker every worker carries
    stray = subprocess.Popen(["sleep", "600"], start_new_session=True,
                             env=dict(os.environ, KIT_SESSION=os.path.basename(run_dir)))
    with open(os.path.join(run_dir, "workers.json"), "w") as f:
        json.dump({"kernel_pid": dead_kernel.pid, "kernel_start": "1",
                   "workers": [{"pid": stray.pid, "start": run_dirs._start_time(stray.pid)}]}, f)
    # a registry entry whose pid was reused by an unrelated process (start time differs) is left alone
    bystander = subprocess.Popen(["sleep", "600"], start_new_session=True)
    other_dir = run_dirs.make_run_dir()
    with open(os.path.join(other_dir, "workers.json"), "w") as f:
        json.dump({"kernel_pid": dead_kernel.pid, "kernel_start": "1",
                   "workers": [{"pid": bystander.pid, "start": "12345"}]}, f)
    try:
        c = make_cluster(world_size=1)
        assert stray.pid in c.reaped and bystander.pid not in c.reaped
        assert stray.wait(timeout=5) == -signal.SIGKILL
        assert bystander.poll() is None
        assert not os.path.exists(run_dir)
    finally:
        bystander.kill()
        stray.kill()


def test_a_run_dir_whose_process_died_before_any_worker_was_registered_is_removed_next_time(tmp_path, monkeypatch):
    """A kernel killed between creating its run directory and registering its workers (or whose ranks torchrun
    started, which are never registered) left a directory that no later start removed: one per such kernel,
    for good. The next start now removes it, and keeps the directory of a process that is still alive."""
    from kit.engine import run_dirs

    monkeypatch.setenv("XDG_RUNTIME_DIR", str(tmp_path))
    code = "import os; from kit.engine.run_dirs import make_run_dir; print(make_run_dir(), flush=True); os._exit(0)"
    left = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.strip()
    assert os.path.isdir(left) and os.path.dirname(left) == run_dirs.runtime_dir()
    ours = run_dirs.make_run_dir()  # this process is alive: its directory is its business
    assert run_dirs.reap_stale() == []
    assert not os.path.exists(left), "the dead process's run directory was left behind"
    assert os.path.isdir(ours)
    run_dirs.unregister(ours)
