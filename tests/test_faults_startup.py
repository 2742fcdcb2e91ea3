"""Faults 14, 16 and 19: start-up failures (an import error on one rank, a rank that never joins), no fixed
ports (29500 taken), torch already imported in the kernel, and two clusters starting at once."""
from __future__ import annotations

import socket
import threading
import time

import psutil
import pytest

from kit.engine.cluster import Cluster
from kit.config import LaunchConfig
from kit.errors import WorkerStartError
from conftest import assert_pids_gone, quiet


WALL_CLOCK_S = 40  # conftest's autouse wall_clock fixture enforces it


def _kit_workers() -> set[int]:
    found = set()
    for p in psutil.Process().children(recursive=True):
        try:
            if "kit.rank.worker" in " ".join(p.cmdline()):
                found.add(p.pid)
        except psutil.Error:
            pass
    return found


# These faults live in a sitecustomize that reads RANK, so they need a fresh interpreter per rank
# (template=False): a forked rank ran its interpreter's start-up once, in the template, before RANK
# existed. tests/test_template.py has the start-up failure of a forked rank.
def _sitecustomize(tmp_path, body: str) -> tuple[tuple[str, str], ...]:
    (tmp_path / "sitecustomize.py").write_text("import os\nif os.environ.get('RANK') == '1':\n" + body)
    return (("PYTHONPATH", str(tmp_path)),)


def test_import_error_on_one_rank_names_it_with_its_stderr_and_leaves_nothing(tmp_path):
    env = _sitecustomize(tmp_path, (
        "    import sys\n"
        "    print('rank 1 sitecustomize: refusing torch', file=sys.stderr)\n"
        "    class _NoTorch:\n"
        "        def find_spec(self, name, path=None, target=None):\n"
        "            if name == 'torch':\n"
        "                raise ImportError('torch is broken on this rank (simulated)')\n"
        "    sys.meta_path.insert(0, _NoTorch())\n"))
    before = _kit_workers()
    t0 = time.monotonic()
    with pytest.raises(WorkerStartError) as info:
        Cluster(LaunchConfig(world_size=2, env=env, start_timeout_s=30, template=False)).start()
    assert time.monotonic() - t0 < 15
    text = str(info.value)
    assert text.startswith("rank 1 failed to start: ImportError: torch is broken on this rank (simulated).")
    assert "Nothing was left running" in text and "rank 1 sitecustomize: refusing torch" in text
    assert_pids_gone(list(_kit_workers() - before))


def test_rank_that_never_joins_times_out_with_the_fix(tmp_path):
    env = _sitecustomize(tmp_path, "    import time\n    time.sleep(60)\n")
    before = _kit_workers()
    t0 = time.monotonic()
    with pytest.raises(WorkerStartError, match=r"did not join the process group within 4 s.*Raise start_timeout_s"):
        Cluster(LaunchConfig(world_size=2, env=env, start_timeout_s=4, template=False)).start()
    assert time.monotonic() - t0 < 10
    assert_pids_gone(list(_kit_workers() - before))


def test_port_29500_taken_and_torch_already_in_the_kernel(make_cluster):
    import torch  # noqa: F401  (fault 16: the kit execs fresh interpreters, never forks the kernel)

    blocker = socket.socket()
    try:
        blocker.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        blocker.bind(("127.0.0.1", 29500))
        blocker.listen()
    except OSError:
        pass  # someone else holds it already: just as good
    try:
        c = make_cluster()
        assert c.run("t = torch.ones(1)\ndist.all_reduce(t)\nt.item()", on_output=quiet).values == {0: 2.0, 1: 2.0}
        listening = []
        for pid in c.pids.values():
            for conn in psutil.Process(pid).net_connections(kind="inet"):
                if conn.status == psutil.CONN_LISTEN:
                    listening.append(conn.laddr)
        assert all(addr.port != 29500 and addr.ip in ("127.0.0.1", "::1") for addr in listening), listening
    finally:
        blocker.close()


def test_two_clusters_start_at_once_and_stay_apart(make_cluster):
    made: dict[int, Cluster] = {}
    errors: list[BaseException] = []

    def start(i: int) -> None:
        try:
            made[i] = Cluster(LaunchConfig(world_size=2, pg_timeout_s=5)).start()
        except BaseException as e:  # pragma: no cover - reported below
            errors.append(e)

    threads = [threading.Thread(target=start, args=(i,)) for i in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=30)
    pids = [p for c in made.values() for p in c.pids.values()]
    try:
        assert not errors and len(made) == 2
        for i, c in made.items():
            r = c.run(f"t = torch.ones(1) * {i + 1}\ndist.all_reduce(t)\nt.item()", on_output=quiet)
            assert r.values == {0: 2.0 * (i + 1), 1: 2.0 * (i + 1)}
        assert made[0].status()["run_dir"] != made[1].status()["run_dir"]
    finally:
        for c in made.values():
            c.shutdown()
    assert_pids_gone(pids)
