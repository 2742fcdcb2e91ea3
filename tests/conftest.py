"""Shared fixtures: a 2-rank gloo cluster, and the check that no kit process outlives a test; the tiers
(`-m unit`, `-m ranks`, `-m notebooks`, `-m browser`, `slow`) given to every test from tests/tiers.py."""
from __future__ import annotations

import _posixsubprocess
import copy
import json
import os
import signal
import subprocess
import time
from typing import Any, Callable, Iterator

import pytest

from kit.engine.cluster import Cluster
from kit.config import LaunchConfig
import tiers

# The tests that press Ctrl-C (`_thread.interrupt_main`) need Python's SIGINT handler. A shell that starts pytest in
# the background without job control (`pytest &` in a script, nohup) leaves SIGINT ignored, and interrupt_main then
# does nothing (Python >= 3.10): the cell runs on and the next tests on its ranks fail too. Put back the handler an
# interactive run (and a Jupyter kernel running a cell) has.
if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
    signal.signal(signal.SIGINT, signal.default_int_handler)


@pytest.hookimpl(tryfirst=True)  # before -m/-k select on the tier markers, and before xdist reads the groups
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Each test gets its tier's marker (and `slow` where tiers.py says so); with `--dist loadgroup`
    (pytest-xdist), the work is shared out as `_share_out` says. The xdist workers collect, and there
    `-n` reads as None: `loadgroup` is the option that survives into them. xdist turns the groups into
    node ids in its own modifyitems hook, so this one must run first."""
    for item in items:
        module, function = item.path.name, getattr(item, "originalname", item.name)
        item.add_marker(tiers.tier_of(module, function))
        if tiers.is_slow(module, function):
            item.add_marker("slow")
    if getattr(config.option, "loadgroup", False):
        _share_out(items)


def _share_out(items: list[pytest.Item]) -> None:
    """For `pytest -n 2 --dist loadgroup`: a module's tests stay on one worker, so its module-scoped cluster
    (and the session's `run_once` runs, which several modules share) start once, not once per worker. The
    lessons run one after another on one worker: two lessons at once put four busy ranks on two cores and
    turned a lesson's interleaved comparison around (its verdict then fails honestly), while the other
    worker takes everything else. Lessons and browser tests go first: they are the longest pieces of work,
    and long pieces last would leave one worker idle at the end."""
    for item in items:
        uses_run_once = "run_once" in getattr(item, "fixturenames", ())
        group = "lessons" if item.get_closest_marker("notebooks") else "run_once" if uses_run_once else item.path.name
        item.add_marker(pytest.mark.xdist_group(group))
    items.sort(key=lambda item: not (item.get_closest_marker("notebooks") or item.get_closest_marker("browser")))


def pytest_collection_finish(session: pytest.Session) -> None:
    """Whether only unit tests run, judged on what `-m`/`-k` left: collection_modifyitems above runs
    before pytest's own deselection (it must: the markers it adds are what `-m` selects on), so there
    `items` is every collected test and a `-m unit` run never counted as unit-only."""
    items = session.items
    session.config.stash[_UNIT_ONLY] = bool(items) and all(item.get_closest_marker("unit") for item in items)


_UNIT_ONLY = pytest.StashKey[bool]()
_STARTS = ((os, "fork"), (os, "forkpty"), (os, "posix_spawn"), (os, "posix_spawnp"),
           (_posixsubprocess, "fork_exec"), (subprocess, "_fork_exec"))  # every way Python starts a process


@pytest.fixture(autouse=True)
def unit_tests_start_no_process(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> None:
    """In a run of unit tests only, a unit test that starts a process fails (in a full run other tiers'
    background threads may start processes, so there the table is trusted)."""
    if not request.config.stash.get(_UNIT_ONLY, False) or not request.node.get_closest_marker("unit"):
        return

    def refuse(*_: object, **__: object) -> None:
        raise AssertionError(f"{request.node.nodeid} is in the unit tier but starts a process: move it to "
                             f"`ranks` in tests/tiers.py")
    for module, name in _STARTS:
        if hasattr(module, name):
            monkeypatch.setattr(module, name, refuse)


def assert_pids_gone(pids: list[int], within_s: float = 5.0) -> None:
    """Every pid must be gone (or a reaped zombie) within the deadline, as torch's assert_pids_noexist."""
    deadline = time.monotonic() + within_s
    alive = list(pids)
    while alive and time.monotonic() < deadline:
        alive = [p for p in alive if _alive(p)]
        if alive:
            time.sleep(0.05)
    assert not alive, f"kit processes survived: {alive}"


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


@pytest.fixture
def make_cluster() -> Iterator:
    """Factory for clusters that are always shut down, then checked for orphans."""
    made: list[Cluster] = []
    pids: list[int] = []

    def make(world_size: int = 2, **kw: object) -> Cluster:
        kw.setdefault("pg_timeout_s", 5.0)
        c = Cluster(LaunchConfig(world_size=world_size, **kw)).start()  # type: ignore[arg-type]
        made.append(c)
        pids.extend(c.pids.values())
        return c

    yield make
    for c in made:
        pids.extend(c.pids.values())
        c.shutdown()
    assert_pids_gone(pids)


@pytest.fixture(autouse=True)
def wall_clock(request: pytest.FixtureRequest) -> Iterator[None]:
    """Every test is bounded in time: a module's WALL_CLOCK_S (default 300 s) via SIGALRM,
    so a hang fails the test with a message instead of eating CI's budget."""
    limit_s = int(getattr(request.module, "WALL_CLOCK_S", 300))

    def too_long(*_: object) -> None:
        raise TimeoutError(f"this test ran past its {limit_s} s wall-clock limit")

    old = signal.signal(signal.SIGALRM, too_long)
    signal.alarm(limit_s)
    yield
    signal.alarm(0)
    signal.signal(signal.SIGALRM, old)


@pytest.fixture(scope="module")
def cluster(request: pytest.FixtureRequest) -> Iterator[Cluster]:
    """A module's 2-rank cluster (start-up costs ~2 s), shared by its tests, with the module's
    PG_TIMEOUT_S (default 5 s: short, so gloo gives up fast)."""
    c = Cluster(LaunchConfig(world_size=2, pg_timeout_s=getattr(request.module, "PG_TIMEOUT_S", 5.0))).start()
    pids = list(c.pids.values())
    yield c
    c.shutdown()
    assert_pids_gone(pids)


_RUNS: dict[tuple[int, str], dict[int, Any]] = {}  # (world size, config as JSON) -> {rank: run_rank's result}


@pytest.fixture(scope="session")
def run_once() -> Callable[..., dict[str, dict[int, Any]]]:
    """`run_once(world_size, {name: ExperimentConfig})` -> {name: {rank: run_rank's result}}: each distinct
    configuration runs once per session on local gloo ranks (harness.local.run_each), so modules that
    check different things of the same run (its bytes, its memory, the planner's formulas, its plots)
    share it. Each caller gets its own copy of the results."""
    from kit.experiments.harness.local import run_each

    def run(world_size: int, configs: dict[str, Any]) -> dict[str, dict[int, Any]]:
        keys = {name: (world_size, json.dumps(cfg.to_dict(), sort_keys=True)) for name, cfg in configs.items()}
        todo = list(dict.fromkeys(k for k in keys.values() if k not in _RUNS))
        if todo:
            per = run_each("kit.experiments.runner:run_rank", world_size, [(json.loads(k[1]),) for k in todo])
            for i, key in enumerate(todo):
                _RUNS[key] = {r: per[r][i] for r in per}
        return {name: copy.deepcopy(_RUNS[key]) for name, key in keys.items()}
    return run


def wait_until(check: Callable[[], Any], timeout_s: float = 60.0, what: str = "the condition") -> Any:
    """Poll `check()` until it returns something truthy, and return that; fail naming `what` at the deadline.

    Tests wait on the event they mean with this, never on a sleep: a loaded machine delays any event."""
    deadline = time.monotonic() + timeout_s
    while True:
        got = check()
        if got:
            return got
        assert time.monotonic() < deadline, f"waited {timeout_s:g} s for {what}; last seen: {got!r}"
        time.sleep(0.05)


def quiet(*_: object) -> None:
    """An on_output sink for tests that inspect CellResult instead of printed lines."""


requires_cuda = pytest.mark.skipif(
    not (os.path.isdir("/proc/driver/nvidia/gpus") or os.environ.get("KIT_TEST_CUDA")),
    reason="needs a CUDA GPU",
)
