"""Ranks started by torchrun attach to the kernel. `launcher="torchrun"` runs two torchrun
"nodes" on loopback (c10d rendezvous, --max-restarts 0) whose ranks attach over TCP, so the same path
real clusters use is tested here: cells, errors, interrupt, push/pull, where, deaths, shutdown, and
the kernel's death (attached ranks exit when their control connection closes)."""
from __future__ import annotations

import _thread
import json
import os
import signal
import stat
import subprocess
import sys
import threading
import time

import pytest

from conftest import assert_pids_gone, quiet, wait_until
from test_attach_hostile import env_without_torchrun, interpreter_argv
from kit.config import LaunchConfig
from kit.engine.cluster import Cluster
from kit.errors import CellError

WALL_CLOCK_S = 120


def _all_pids(c: Cluster) -> list[int]:
    agents = c.status()["attach"]["agents"]
    assert len(agents) == 2  # launcher="torchrun": two nodes on this machine
    return list(c.pids.values()) + agents


@pytest.fixture(scope="module")
def agents_tmp(tmp_path_factory: pytest.TempPathFactory):
    """The temp folder the torchrun agents of `tr` see (TMPDIR), where torch elastic makes its log folders
    unless told where."""
    return tmp_path_factory.mktemp("agents-tmp")


@pytest.fixture(scope="module")
def tr(tmp_path_factory: pytest.TempPathFactory, agents_tmp):
    key_file = str(tmp_path_factory.mktemp("attach") / "kit.key")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("TMPDIR", str(agents_tmp))  # the agents inherit it; this process's temp folder is already set
        c = Cluster(LaunchConfig(world_size=2, launcher="torchrun", key_file=key_file, pg_timeout_s=5.0,
                                 start_timeout_s=90)).start()
    pids = _all_pids(c)
    yield c
    c.shutdown()
    assert_pids_gone(pids, within_s=10)


def test_two_torchrun_nodes_attach_and_all_reduce(tr):
    assert sorted(tr.pids) == [0, 1] and tr.state == "ready"
    r = tr.run("t = torch.ones(2) * (rank + 1)\ndist.all_reduce(t)\nprint('sum', t.tolist())\nt.tolist()",
               on_output=quiet)
    assert r.ok and r.values == {0: [3.0, 3.0], 1: [3.0, 3.0]}
    assert r.stdout(0) == "sum [3.0, 3.0]" and r.stdout(1) == "sum [3.0, 3.0]"  # output travelled as frames
    assert tr.run("import os\n'TORCHELASTIC_RUN_ID' in os.environ", on_output=quiet).values == {0: True, 1: True}


def test_torchrun_nodes_keep_their_logs_in_the_run_directory(tr, agents_tmp):
    """Each torchrun agent made a `torchelastic_*` folder in the temp folder and never removed it: two per
    start, hundreds on a machine that runs the tests. They now go in the run directory, removed at shutdown."""
    assert sorted(p.name for p in agents_tmp.iterdir() if p.name.startswith("torchelastic")) == []
    assert os.listdir(os.path.join(tr.status()["run_dir"], "torchelastic"))  # the agents' own log folders


def test_c_level_output_and_big_output_travel_over_the_connection(tr):
    r = tr.run("import os, sys\nos.write(1, b'from fd 1\\n')\nsys.stderr.write('err\\n')\nprint('x' * 100_000)",
               on_output=quiet)
    assert r.ok and "from fd 1" in r.stdout(0) and r.stderr(1) == "err" and len(r.stdout(0)) > 100_000


def test_errors_name_rank_line_and_cell(tr):
    r = tr.run("x = 1\nif rank == 1:\n    raise ValueError('boom')\nt = torch.ones(1)\ndist.all_reduce(t)",
               on_output=quiet, label="In [5]")
    err = CellError(r.failures, r.notes)
    assert err.root.rank == 1 and "raised ValueError at line 3 of In [5]: boom" in str(err)
    assert "rank 1 raised ValueError at line 3 of In [5]" in r.failures[0].evalue  # released from pre-flight
    assert tr.run("x", on_output=quiet).values == {0: 1, 1: 1}


def test_interrupt_is_a_message_and_state_is_kept(tr):
    tr.run("kept = rank + 10", on_output=quiet)
    sent: list[float] = []

    def interrupt() -> None:  # once both ranks run the cell: an attached rank hears it as a message
        wait_until(lambda: all(t.startswith("running") for t in tr.where().values()), what="the ranks to run the cell")
        sent.append(time.monotonic())
        _thread.interrupt_main()
    threading.Thread(target=interrupt, daemon=True).start()
    r = tr.run("import time\ntime.sleep(60)", on_output=quiet)
    assert time.monotonic() - sent[0] < 15  # the cell sleeps 60 s: ended by the interrupt (15 s: CI's loaded cores)
    assert {f.ename for f in r.failures.values()} == {"KeyboardInterrupt"}
    assert tr.run("kept", on_output=quiet).values == {0: 10, 1: 11}


def test_push_pull_where_status(tr, tmp_path):
    tr.push({"w": [1, 2, 3]})
    assert tr.pull("w") == {0: {"w": [1, 2, 3]}, 1: {"w": [1, 2, 3]}}
    release = tmp_path / "release"
    cell = threading.Thread(target=tr.run, args=(f"import os, time\nwhile not os.path.exists({str(release)!r}): "
                                                 "time.sleep(0.02)",), kwargs={"on_output": quiet})
    cell.start()
    try:  # idle, then "about to start the next request" (queued), then running: where names the cell's line
        wait_until(lambda: (w := tr.where()) and all("running <cell" in t and "line 2" in t for t in w.values()),
                   what="both attached ranks' where to name the running cell's line 2")
    finally:
        release.touch()
        cell.join()
    ranks = tr.status()["ranks"]
    assert all(info["alive"] and info["node"] for info in ranks.values())


def test_an_extra_attacher_and_a_wrong_key_are_refused_and_the_notebook_keeps_working(tr, tmp_path):
    attach = tr.status()["attach"]
    address, key_file = attach["address"], attach["key_file"]
    env = dict(os.environ, RANK="0", WORLD_SIZE="2", LOCAL_RANK="0")
    extra = subprocess.run([sys.executable, "-m", "kit.rank.worker", "--attach", address, "--key-file",
                            key_file], env=env, capture_output=True, text=True, timeout=30)
    assert extra.returncode == 3 and "all 2 ranks are already attached" in extra.stderr, extra.stderr
    wrong = tmp_path / "wrong.key"
    wrong.write_text("ab" * 32 + "\n")
    wrong.chmod(0o600)
    bad = subprocess.run([sys.executable, "-m", "kit.rank.worker", "--attach", address, "--key-file", str(wrong)],
                         env=env, capture_output=True, text=True, timeout=30)
    assert bad.returncode == 3 and "wrong key" in bad.stderr, bad.stderr
    # the rank hears "wrong key" as the listener records it: wait for the record, not for the rank's exit
    def with_wrong_key() -> list[str] | None:
        refused = tr.status()["attach"]["refused"]
        return refused if any("wrong key" in why for why in refused) else None
    refused = wait_until(with_wrong_key, what="the wrong key's refusal in status()")
    assert len(refused) >= 2, refused
    assert tr.run("rank", on_output=quiet).values == {0: 0, 1: 1}


def test_key_file_is_0600_and_never_on_a_command_line(tr):
    path = tr.status()["attach"]["key_file"]
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o600
    key_hex = open(path).read().strip()
    for pid in _all_pids(tr):
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            assert key_hex.encode() not in f.read()
        with open(f"/proc/{pid}/environ", "rb") as f:
            assert key_hex.encode() not in f.read()


def test_a_rank_that_dies_is_reported_within_seconds(tmp_path):
    c = Cluster(LaunchConfig(world_size=2, launcher="torchrun", key_file=str(tmp_path / "k.key"), pg_timeout_s=30.0,
                             start_timeout_s=90)).start()
    pids = _all_pids(c)
    try:
        said: list[str] = []
        t0 = time.monotonic()
        r = c.run("import os, time\nif rank == 1:\n    time.sleep(0.3)\n    os.kill(os.getpid(), 9)\n"
                  "t = torch.ones(2)\ndist.all_reduce(t)",
                  check=False, on_output=lambda rank, s, text: said.append(text) if rank < 0 else None)
        assert time.monotonic() - t0 < 5
        dead = r.failures[1]
        assert dead.died and "lost its control connection" in dead.evalue, dead.evalue
        assert any(text.startswith("rank 1 died: it lost its control connection") for text in said), said
        assert c.state == "broken"
    finally:
        c.shutdown()
    assert_pids_gone(pids, within_s=10)  # torchrun (--max-restarts 0) ends the job; nothing restarts it


def test_a_node_that_dies_is_reported_between_cells(tmp_path):
    """A whole "node" goes: its torchrun agent is SIGKILLed; its rank follows (parent-death signal), the
    connection closes, and the cluster is marked broken at once, naming the rank and what to do."""
    c = Cluster(LaunchConfig(world_size=2, launcher="torchrun", key_file=str(tmp_path / "k.key"),
                             start_timeout_s=90)).start()
    pids = _all_pids(c)
    try:
        os.killpg(c.status()["attach"]["agents"][1], signal.SIGKILL)  # the agent leads its session: the "node" goes
        deadline = time.monotonic() + 5
        while c.state != "broken" and time.monotonic() < deadline:
            time.sleep(0.1)
        status = c.status()
        assert c.state == "broken" and "lost its control connection" in status["broken_reason"], status
        # (c10d rendezvous numbers the nodes in arrival order: either rank may have been on that node)
        assert sorted(info["alive"] for info in status["ranks"].values()) == [False, True]  # the other node lives
    finally:
        c.shutdown()
    assert_pids_gone(pids, within_s=10)


_KERNEL = """
import json, sys, time
from kit import Cluster, LaunchConfig
c = Cluster(LaunchConfig(world_size=2, launcher="torchrun", key_file=sys.argv[1], start_timeout_s=90)).start()
c.run("t = torch.ones(1)\\ndist.all_reduce(t)", on_output=lambda *a: None)
print(json.dumps(list(c.pids.values()) + c.status()["attach"]["agents"]), flush=True)
time.sleep(600)
"""


def test_attached_ranks_exit_when_the_kernel_dies(tmp_path):
    kernel = subprocess.Popen([sys.executable, "-c", _KERNEL, str(tmp_path / "k.key")], stdout=subprocess.PIPE,
                              text=True)
    assert kernel.stdout is not None
    pids = json.loads(kernel.stdout.readline())
    assert len(pids) == 4
    os.kill(kernel.pid, signal.SIGKILL)
    kernel.wait(timeout=10)
    assert_pids_gone(pids, within_s=8)


_ATTACH_KERNEL = """
import json, sys, time
from kit import Cluster
c = Cluster.attach(world_size=2, key_file=sys.argv[1], timeout_s=90)
r = c.run("t = torch.ones(1) * (rank + 1)\\ndist.all_reduce(t)\\nt.item()", on_output=lambda *a: None)
print("VALUES|" + json.dumps(r.values) + "|" + json.dumps(list(c.pids.values())), flush=True)
time.sleep(600)
"""


def test_the_printed_command_attaches_and_ranks_exit_when_the_kernel_dies(tmp_path):
    """The user's path: `Cluster.attach` prints the torchrun command; run it on each "node" (here twice on
    loopback); the ranks attach. Then the kernel dies: no watchdog knows these ranks (torchrun started
    them, not the kernel), so they must exit because their control connection closed."""
    kernel = subprocess.Popen([sys.executable, "-c", _ATTACH_KERNEL, str(tmp_path / "k.key")],
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    assert kernel.stderr is not None and kernel.stdout is not None
    command = ""
    while not command:
        line = kernel.stderr.readline()
        assert line, "the kernel ended before printing the command"
        if line.strip().startswith("torchrun "):
            command = line.strip()
    assert "--max-restarts 0" in command and "--attach 127.0.0.1:" in command and "--key-file" in command
    with __import__("socket").socket() as s:
        s.bind(("127.0.0.1", 0))
        rdzv = f"127.0.0.1:{s.getsockname()[1]}"
    argv = interpreter_argv(command.replace("NODE0_HOST:29400", rdzv))  # torchrun is not on every PATH
    env = env_without_torchrun(GLOO_SOCKET_IFNAME="lo")
    nodes = [subprocess.Popen(argv + [], env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                              start_new_session=True) for _ in range(2)]
    try:
        line = kernel.stdout.readline()
        assert line.startswith("VALUES"), line
        _, values, pids = line.split("|")
        assert json.loads(values) == {"0": 3.0, "1": 3.0}
        os.kill(kernel.pid, signal.SIGKILL)
        kernel.wait(timeout=10)
        assert_pids_gone(json.loads(pids), within_s=8)  # the ranks: their connection closed
        for node in nodes:  # torchrun (--max-restarts 0) ends when its rank does
            assert node.wait(timeout=30) != 0
    finally:
        for node in nodes:
            if node.poll() is None:
                os.killpg(node.pid, signal.SIGKILL)
        if kernel.poll() is None:
            kernel.kill()


def test_experiments_run_on_attached_ranks(tr, tmp_path):
    """The lab bench's experiments drive ranks through Cluster.call, which attached ranks serve as local ones."""
    from kit.experiments import ExperimentConfig, run

    progress: list[tuple[int, int]] = []
    rec = run(ExperimentConfig(model_size="tiny", steps=3, warmup_steps=1, world_size=2), cluster=tr,
              results_path=str(tmp_path / "runs.jsonl"), progress=lambda k, n: progress.append((k, n)))
    assert {s["rank"] for s in rec["steps"]} == {0, 1} and progress and progress[-1][0] == progress[-1][1], progress
