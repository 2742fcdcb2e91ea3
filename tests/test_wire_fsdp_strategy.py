"""The fsdp strategy's all-gathers and reduce-scatters follow the wire's rules (test_wire.py): a step's row
holds the collectives whose work the step waited on, even when gloo's thread runs the completion callback late;
a callback of a step stopped mid-collective adds nothing to the next step; each call's ms equal its timeline
phase whatever pauses come between two readings of the clock.

No process: `fully_shard` is replaced by a stand-in that only keeps the custom collectives the strategy installs
through FSDP2's `set_custom_all_gather` / `set_custom_reduce_scatter`; a forward pre-hook on the block calls
them as FSDP2 does (all-gather before forward), and a torch Future stands for each collective's work.
"""
from __future__ import annotations

import random
import threading
import time
import types
from typing import Any, Callable

import pytest
import torch
import torch.distributed as dist
from torch import nn

from kit.experiments.config import ExperimentConfig
from kit.experiments.measure import stamps
from kit.experiments.measure.timing import StepClock
from kit.experiments.parallel import wire
from kit.experiments.strategies.sharding import FSDPStrategy

_fsdp = pytest.importorskip("torch.distributed.fsdp._fully_shard._fsdp_collectives")


class _Work:
    def __init__(self, fut: torch.futures.Future) -> None:
        self.fut = fut

    def get_future(self) -> torch.futures.Future:
        return self.fut


class _Stop(Exception):
    """A step stopped mid-collective (the stop button, an interrupt)."""


@pytest.fixture
def strategy(monkeypatch: pytest.MonkeyPatch) -> Callable[..., tuple[FSDPStrategy, StepClock]]:
    """`make(gather, blocks)`: an fsdp strategy on a model of `blocks` blocks, each of which, before its forward,
    calls the all-gather the strategy installed; `gather()` returns that call's work (a _Work, or None: synchronous)."""
    saved = wire.WIRE.clock

    def make(gather: Callable[[], Any], blocks: int = 1) -> tuple[FSDPStrategy, StepClock]:
        installed: dict[str, Any] = {}

        def fully_shard(module: nn.Module, reshard_after_forward: bool = True) -> nn.Module:
            module.set_custom_all_gather = lambda c: installed.__setitem__("all_gather", c)
            module.set_custom_reduce_scatter = lambda c: installed.__setitem__("reduce_scatter", c)
            return module
        monkeypatch.setattr(torch.distributed.fsdp, "fully_shard", fully_shard)
        monkeypatch.setattr(dist, "get_world_size", lambda group=None: 2)
        monkeypatch.setattr(_fsdp.DefaultAllGather, "__call__", lambda self, out, inp, group, async_op=False: gather())
        def before_forward(m: nn.Module, args: Any) -> None:  # FSDP2 gathers a block's parameters here
            installed["all_gather"](torch.zeros(8), torch.zeros(4), None, True)
        model = nn.Sequential(*(nn.Linear(4, 4) for _ in range(blocks)))
        for block in model:
            block.register_forward_pre_hook(before_forward)
        clock = StepClock(device_type="cpu")
        strat = FSDPStrategy(ExperimentConfig(strategy="fsdp", workload="mlp"), model, nn.functional.mse_loss,
                             torch.device("cpu"), clock)
        assert set(installed) == {"all_gather", "reduce_scatter"}  # through FSDP2's custom-collective API
        return strat, clock
    yield make
    wire.WIRE.clock = saved
    wire.WIRE.reset()


def _comm(clock: StepClock) -> list[tuple[str, float]]:
    return [(e["name"], e["end_ms"] - e["start_ms"]) for e in clock.timeline(0) if e["kind"] == "comm"]


def test_a_steps_row_waits_for_a_late_completion_callback(strategy: Callable[..., Any]) -> None:
    """FSDP2 waited on the all-gather's work, but gloo's thread runs the kit's callback 0.2 s later: the
    step's row, its timeline and its comm report hold the call all the same (they missed it before)."""
    futures: list[torch.futures.Future] = []

    def gather() -> _Work:
        futures.append(torch.futures.Future())
        threading.Timer(0.2, futures[-1].set_result, args=(None,)).start()
        return _Work(futures[-1])
    strat, clock = strategy(gather)
    clock.begin()
    strat.train_step(torch.randn(8, 4), torch.randn(8, 4))
    row = clock.end(0, 0, 0.0, 8, keep=True)
    assert row["comm_ms"] >= 150, row
    comm = _comm(clock)
    assert [name for name, _ in comm] == ["fsdp all_gather"]  # named what it is (it read "all_reduce #0")
    assert strat.last_step["fsdp/all_gather"]["ms"] == pytest.approx(comm[0][1], abs=1e-9)
    assert strat.comm_report()["measured_payload_bytes_per_step"] == {"all_gather": 32}


def _fake_clock(monkeypatch: pytest.MonkeyPatch, perf_counter: Callable[[], float]) -> None:
    """The wire's and the step clock's perf_counter is the test's."""
    fake_time = types.SimpleNamespace(perf_counter=perf_counter, monotonic=time.monotonic, sleep=time.sleep,
                                      process_time=time.process_time)
    monkeypatch.setattr(wire, "time", fake_time)
    monkeypatch.setattr(stamps, "time", fake_time)


def test_a_callback_of_a_stopped_step_adds_nothing_to_the_next_step(
        strategy: Callable[..., Any], monkeypatch: pytest.MonkeyPatch) -> None:
    """A step stopped while its all-gather was in flight; that call completes during the next step, 1000 s
    (on the test's clock) after its launch. The next step's row, timeline and report hold its own all-gather
    only, 250 ms: the stale call, counted, would add 1,000,000 ms and a second call."""
    now_s = [1000.0]  # seconds, moved only by the test; every time below is exact in binary: the ms compare exactly
    _fake_clock(monkeypatch, lambda: now_s[0])
    stale: torch.futures.Future = torch.futures.Future()
    calls: list[int] = []

    def gather() -> _Work:
        calls.append(1)
        if len(calls) == 1:
            return _Work(stale)  # step 1: in flight when the step stops
        stale.set_result(None)  # step 2: the stopped call completes now, on this thread, at 2000 s
        now_s[0] += 0.25  # step 2's own call takes 250 ms
        done: torch.futures.Future = torch.futures.Future()
        done.set_result(None)
        return _Work(done)
    strat, clock = strategy(gather)

    def stop(m: nn.Module, args: Any) -> None:
        if len(calls) == 1:
            raise _Stop
    strat.model[0].register_forward_pre_hook(stop)
    clock.begin()
    with pytest.raises(_Stop):
        strat.train_step(torch.randn(8, 4), torch.randn(8, 4))
    now_s[0] = 2000.0  # the stopped call was launched 1000 s before the next step
    clock.begin()
    strat.train_step(torch.randn(8, 4), torch.randn(8, 4))
    row = clock.end(1, 0, 0.0, 8, keep=True)
    assert _comm(clock) == [("fsdp all_gather", 250.0)]
    assert strat.last_step["fsdp/all_gather"]["calls"] == 1
    assert strat.last_step["fsdp/all_gather"]["ms"] == 250.0
    assert row["comm_ms"] == 250.0 and row["step_ms"] == 250.0, row
    assert wire.WIRE.callbacks_due == 0


def test_each_calls_ms_equal_its_phase_whatever_pauses_come_between_readings(
        strategy: Callable[..., Any], monkeypatch: pytest.MonkeyPatch) -> None:
    """On a CPU clock that moves 0-5 ms at every reading (a thread losing the GIL between two readings sees
    that), the ms the step's report gives the all-gathers equal their phases on the timeline exactly."""
    rng, now_s = random.Random(0), [100.0]

    def jumping() -> float:
        now_s[0] += rng.uniform(0, 0.005)
        return now_s[0]
    _fake_clock(monkeypatch, jumping)
    strat, clock = strategy(lambda: None, blocks=2)  # synchronous calls, two a step
    for _ in range(2):
        clock.begin()
        strat.train_step(torch.randn(8, 4), torch.randn(8, 4))
        clock.end(0, 0, 0.0, 8, keep=True)
    phases = [ms for _, ms in _comm(clock)]
    row = strat.last_step["fsdp/all_gather"]
    assert len(phases) == 2 and all(ms > 0 for ms in phases)
    assert row["calls"] == 2 and row["ms"] == pytest.approx(sum(phases), abs=1e-9)  # this step's alone
