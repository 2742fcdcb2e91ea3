"""A harness rank leaves cleanly while gloo's thread still releases its last callback.

run_local's ranks used to leave through interpreter finalization. gloo's worker threads outlive
destroy_process_group (DDP's reducer keeps the group alive), and the kit's DDP comm hook's
`.then()` callback is released on such a thread after DDP has already waited on the hook's
future. When that thread runs late (a busy machine) the main thread is already finalizing; the
thread's GIL request then ends it with pthread_exit, whose unwinding through a C++ destructor
calls std::terminate: "terminate called without an active exception", SIGABRT, seen in about
one full test run in five. The target below makes the thread run late on purpose: every thread
of the rank on one core and gloo's threads at SCHED_IDLE (they run only when that core has
nothing else to do). Before the fix every such run aborted (3 of 3, each also on its retry);
now the ranks leave with os._exit once their result is written.
"""
from __future__ import annotations

import os
import sys

import pytest

from kit.experiments.harness.local import run_local

WALL_CLOCK_S = 300

LINUX_SCHED_IDLE = pytest.mark.skipif(not sys.platform.startswith("linux") or not hasattr(os, "SCHED_IDLE"),
                                      reason="needs Linux's SCHED_IDLE to delay gloo's threads")


def _delay_gloo_threads(core: int) -> int:
    """Pin every thread of this rank to `core`; gloo's threads (named by torch) to SCHED_IDLE."""
    starved = 0
    for tid in os.listdir("/proc/self/task"):
        try:
            os.sched_setaffinity(int(tid), {core})
            with open(f"/proc/self/task/{tid}/comm") as f:
                name = f.read().strip()
            if name.startswith(("pt_gloo", "gloo")):
                os.sched_setscheduler(int(tid), os.SCHED_IDLE, os.sched_param(0))
                starved += 1
        except (OSError, FileNotFoundError):  # a thread that ended meanwhile
            continue
    return starved


def ddp_with_late_gloo_threads() -> int:
    """Runs on each rank: two DDP steps with the kit's comm hook while gloo's threads run late."""
    import torch.distributed as dist

    from kit.experiments.config import ExperimentConfig
    from kit.experiments.runner import run_rank
    starved = _delay_gloo_threads(dist.get_rank() % (os.cpu_count() or 1))
    run_rank(ExperimentConfig(strategy="ddp", steps=2, warmup_steps=1).to_dict())
    return starved


def raises_on_rank_1() -> None:
    import torch.distributed as dist
    if dist.get_rank() == 1:
        raise ValueError("rank 1 refuses on purpose")


@LINUX_SCHED_IDLE
def test_rank_leaves_cleanly_while_gloo_thread_runs_late() -> None:
    got = run_local("test_harness_exit:ddp_with_late_gloo_threads", 2)
    assert got[0] >= 2 and got[1] >= 2, got  # the delay really applied: gloo's 2 workers (and its loop)


def test_an_exception_on_a_rank_still_reaches_the_caller() -> None:
    """Ranks that succeed leave by os._exit; a rank that raises must still report its traceback."""
    import torch.multiprocessing as mp
    with pytest.raises(mp.ProcessRaisedException, match="rank 1 refuses on purpose"):
        run_local("test_harness_exit:raises_on_rank_1", 2)


TORCHRUN_SCRIPT = """
import os, sys
sys.path.insert(0, {tests!r})
import torch.distributed as dist
from test_harness_exit import _delay_gloo_threads
from kit.experiments.config import ExperimentConfig
from kit.experiments.runner import run_rank
dist.init_process_group("gloo")
_delay_gloo_threads(dist.get_rank() % (os.cpu_count() or 1))
run_rank(ExperimentConfig(strategy={strategy!r}, workload="gpt", steps=2, warmup_steps=1).to_dict())
dist.destroy_process_group()
"""


@LINUX_SCHED_IDLE
@pytest.mark.parametrize("strategy", ["ddp", "ep"])
def test_a_torchrun_script_exits_cleanly_after_a_run_while_gloo_threads_run_late(tmp_path, strategy: str) -> None:
    """Under torchrun a script leaves through interpreter finalization (the kit cannot os._exit
    there): run_rank waits until gloo's threads have let go of the kit's callbacks (ddp's comm
    hook) and of the collectives' tensors (ep's all-to-alls) before it returns
    (kit/experiments/measure/callbacks.py). Before, each such run aborted (ddp 3 of 3, ep 2 of 2)."""
    import subprocess
    script = tmp_path / "train.py"
    script.write_text(TORCHRUN_SCRIPT.format(tests=os.path.dirname(__file__), strategy=strategy))
    proc = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2",
                           str(script)], capture_output=True, text=True, timeout=WALL_CLOCK_S, cwd=tmp_path)
    assert "terminate called" not in proc.stderr + proc.stdout, proc.stderr[-2000:]
    assert proc.returncode == 0, proc.stderr[-2000:]
