"""Stop (the panels' Stop button, `run(..., stop=event)`) travels to the ranks on their control channel:
it reaches ranks that share no file system with the kernel (attached from other hosts), and a stop
meant for one request can never stop a later one."""
from __future__ import annotations

import queue
import subprocess
import tempfile
import threading
import types
from typing import Iterator

import pytest

from conftest import quiet
from kit.config import LaunchConfig
from kit.engine import torchrun
from kit.engine.cluster import Cluster
from kit.experiments import ExperimentConfig, run
from kit.messages import STOP_REQUEST
from kit.rank import stop_request
from kit.rank.control import ControlThread

# Long enough that the run cannot end on its own before Stop arrives, even on an idle machine (about
# 8 ms a step on attached ranks at load 3: nearly 3 minutes), short enough that a Stop that never
# arrives fails the test instead of hanging it (the old stop file did: the run went to its end).
LONG_STEPS = 20_000


def _private_mounts_work() -> bool:
    try:
        return subprocess.run(["unshare", "-rm", "true"], capture_output=True, timeout=30).returncode == 0
    except (OSError, subprocess.TimeoutExpired):
        return False


def test_stop_reaches_attached_ranks_that_cannot_see_the_kernels_files(tmp_path, monkeypatch) -> None:
    """Ranks on other hosts share no folder with the kernel. Here two torchrun nodes run in their own
    mount namespace, with an empty file system mounted over the kernel's temp folder: whatever the
    kernel writes there, they cannot see. Stop must still end the run, on both ranks at one step."""
    if not _private_mounts_work():
        pytest.skip("needs `unshare -rm` (an unprivileged mount namespace) to hide the kernel's files")
    kernel_tmp = tmp_path / "kernel-tmp"
    kernel_tmp.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(kernel_tmp))  # the kernel's temp folder, for this test
    node_command = torchrun.node_command

    def hidden_from_kernel_tmp(*args: str) -> list[str]:
        return ["unshare", "-rm", "sh", "-c", 'mount -t tmpfs kit-other-host "$0" && exec "$@"', str(kernel_tmp),
                *node_command(*args)]
    monkeypatch.setattr(torchrun, "node_command", hidden_from_kernel_tmp)
    c = Cluster(LaunchConfig(world_size=2, launcher="torchrun", key_file=str(tmp_path / "kit.key"),
                             pg_timeout_s=30.0, start_timeout_s=90)).start()
    try:
        (kernel_tmp / "written-by-the-kernel").touch()
        seen = c.run(f"import os\nos.path.exists({str(kernel_tmp / 'written-by-the-kernel')!r})", on_output=quiet)
        assert seen.values == {0: False, 1: False}, "the ranks were meant not to see the kernel's temp folder"
        stop = threading.Event()  # set once a measured step is done: the run is under way
        rec = run(ExperimentConfig(model_size="tiny", steps=LONG_STEPS, warmup_steps=0), cluster=c, stop=stop,
                  progress=lambda k, n: k >= 1 and stop.set())
        assert rec["complete"] is False and any("stopped early" in n for n in rec["notes"])
        per_rank = {r: max(s["step"] for s in rec["steps"] if s["rank"] == r) for r in (0, 1)}
        assert per_rank[0] == per_rank[1] < LONG_STEPS - 1  # one step on both: no collective left hanging
        assert c.run("rank", on_output=quiet).values == {0: 0, 1: 1}  # the ranks serve the next request
    finally:
        c.shutdown()


@pytest.fixture
def idle_rank() -> Iterator[ControlThread]:
    """A rank's control thread with nothing behind it but its request queue and a list for its notes:
    frames go to `_on_frame`."""
    stop_request.serving(None)
    lines: list[str] = []
    streams = types.SimpleNamespace(lines=lines, note=lines.append)  # the rank's stderr notes, kept
    yield ControlThread(None, 0, streams, None, None, queue.Queue(), 0, lambda: None, dict)  # type: ignore[arg-type]
    stop_request.serving(None)


def test_a_stop_stops_only_the_request_it_names(idle_rank: ControlThread) -> None:
    """The control thread records a STOP_REQUEST frame; the run loop's `asked()` is True only while the
    request it names is the one being served."""
    def stop(rid: object) -> None:
        idle_rank._on_frame(STOP_REQUEST, {"id": rid})

    stop_request.serving(7)
    assert not stop_request.asked()  # no Stop yet: plain torchrun's case forever
    stop(7)
    assert stop_request.asked()
    stop_request.serving(None)  # request 7 ended
    assert not stop_request.asked()
    stop_request.serving(8)
    assert not stop_request.asked(), "the Stop for request 7 stopped request 8"
    stop(7)  # late: request 7 is over (a stale id)
    assert not stop_request.asked(), "a stale Stop (request 7) stopped request 8"
    stop("8")  # not a request id: dropped, and said
    assert not stop_request.asked() and "dropped a stop without a request id ('8')" in idle_rank.streams.lines[-1]
    assert idle_rank.requests.empty()  # a Stop is the control thread's: never queued as a request


def test_a_stop_that_arrives_before_its_request_is_served_still_counts(idle_rank: ControlThread) -> None:
    """The control thread reads frames while the main thread still finishes the request before; a Stop
    for the queued request waits for it."""
    stop_request.serving(4)
    idle_rank._on_frame(STOP_REQUEST, {"id": 5})
    assert not stop_request.asked()
    stop_request.serving(None)
    stop_request.serving(5)
    assert stop_request.asked()
