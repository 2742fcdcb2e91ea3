"""The wire's record of each collective agrees with the timeline: a step's report holds the same calls, each
with the ms its timeline phase shows.

- FSDP2 waits on an all-gather's work, but gloo's thread runs the kit's completion callback (which adds the
  call's ms and its phase) just after; on a loaded machine that could be after the step's report.
- The ms and the phase were two readings of the clock at each end: a switch of Python's GIL between them
  (up to its 5 ms interval) made an HSDP step report 6.4 ms of dp all-reduce against 11.2 ms of phases.
No process here: a torch Future stands for the work, and a clock that jumps at every reading for the pauses.
"""
from __future__ import annotations

import random
import threading
import time
import types

import pytest
import torch

from kit.experiments.measure import stamps
from kit.experiments.measure.timing import StepClock
from kit.experiments.parallel import wire, wire_fsdp


class _Work:
    def __init__(self, fut: torch.futures.Future) -> None:
        self.fut = fut

    def get_future(self) -> torch.futures.Future:
        return self.fut


class _Clock:
    def __init__(self) -> None:
        self.phases: list[tuple[str, str, float, float]] = []
        self.stamps = stamps.HostStamps()

    def now(self) -> float:
        return time.perf_counter()

    def add_phase(self, name: str, kind: str, start: float, end: float) -> None:
        self.phases.append((name, kind, start, end))


def test_a_report_waits_for_a_late_completion_callback() -> None:
    fut: torch.futures.Future = torch.futures.Future()
    call = wire_fsdp.CustomCollectives("fsdp", 2).wrap(
        "all_gather", lambda out, inp: _Work(fut), lambda out, inp: out.numel() * out.element_size())
    clock, saved = _Clock(), wire.WIRE.clock
    wire.WIRE.clock = clock
    try:
        with wire.WIRE.counting():
            call(torch.zeros(8), torch.zeros(4))
            # the work is done here (the caller waited), but the callback runs 0.2 s later on another thread
            threading.Timer(0.2, fut.set_result, args=(None,)).start()
            row = wire.WIRE.report()["fsdp/all_gather"]
        assert row["calls"] == 1 and row["payload_bytes"] == 32
        assert row["ms"] >= 150, row  # the call's time is in the report...
        assert [p[0] for p in clock.phases] == ["fsdp all_gather"]  # ...and its phase in the same step
        assert wire.WIRE.callbacks_due == 0
    finally:
        wire.WIRE.clock = saved
        wire.WIRE.reset()


def test_a_report_does_not_wait_when_every_call_completed() -> None:
    fut: torch.futures.Future = torch.futures.Future()
    fut.set_result(None)  # completed before the kit asks: the callback runs inline
    call = wire_fsdp.CustomCollectives("fsdp", 2).wrap("reduce_scatter", lambda out, inp: _Work(fut),
                                                  lambda out, inp: inp.numel() * inp.element_size())
    with wire.WIRE.counting():
        call(torch.zeros(4), torch.zeros(8))
        t0 = time.monotonic()
        row = wire.WIRE.report()["fsdp/reduce_scatter"]
        assert time.monotonic() - t0 < 0.1 and row["calls"] == 1 and wire.WIRE.callbacks_due == 0


def test_each_calls_ms_equal_its_timeline_phase_whatever_pauses_come_between_readings(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """The hand-written collectives (`_timed`), FSDP2's (CustomCollectives) and HSDP's all-reduce
    (ReplicaAllReduce) on a CPU clock that moves 0-5 ms at every reading, as a thread that loses the GIL
    between two readings sees it: each call's ms in the report equal its phase on the timeline exactly."""
    rng, now_s = random.Random(0), [100.0]

    def jumping() -> float:
        now_s[0] += rng.uniform(0, 0.005)
        return now_s[0]
    fake_time = types.SimpleNamespace(perf_counter=jumping, monotonic=time.monotonic, sleep=time.sleep)
    monkeypatch.setattr(wire, "time", fake_time)
    monkeypatch.setattr(stamps, "time", fake_time)
    clock, saved = StepClock(device_type="cpu"), wire.WIRE.clock
    wire.WIRE.clock = clock
    try:
        clock.begin()
        with wire.WIRE.counting():
            for _ in range(3):
                with wire._timed("tp", "all_reduce", 8, 8.0):
                    pass
            rs = wire_fsdp.CustomCollectives("fsdp", 2).wrap("reduce_scatter", lambda out, inp: None,
                                                          lambda out, inp: inp.numel() * inp.element_size())
            replicas = wire_fsdp.ReplicaAllReduce("dp", 2)
            for _ in range(3):
                rs(torch.zeros(4), torch.zeros(8))
                replicas.reduced()
                replicas._all_reduced(torch.zeros(4))
            report = wire.WIRE.report()
        phases: dict[str, float] = {}
        for name, _kind, s, e in clock.resolved_events():
            phases[name] = phases.get(name, 0.0) + e - s
        assert set(report) == {"tp/all_reduce", "fsdp/reduce_scatter", "dp/all_reduce"}
        for key, row in report.items():
            assert row["calls"] == 3 and row["ms"] > 0
            assert row["ms"] == pytest.approx(phases[key.replace("/", " ")], abs=1e-9), key
    finally:
        wire.WIRE.clock = saved


def test_a_lost_callback_neither_stalls_later_steps_nor_lands_in_them() -> None:
    """A step stopped while an asynchronous collective was in flight (its future never completes in that
    step): that step's report waits `wait_s` and says so; the next step's report (after `counting()`'s
    reset) returns at once, and the old call's callback, when it finally runs, adds nothing to it."""
    fut: torch.futures.Future = torch.futures.Future()
    call = wire_fsdp.CustomCollectives("fsdp", 2).wrap(
        "all_gather", lambda out, inp: _Work(fut), lambda out, inp: out.numel() * out.element_size())
    try:
        with wire.WIRE.counting():
            call(torch.zeros(8), torch.zeros(4))
            with pytest.warns(UserWarning, match="1 asynchronous collective"):
                assert wire.WIRE.report(wait_s=0.2)["fsdp/all_gather"]["ms"] == 0.0
        with wire.WIRE.counting():  # the next step
            t0 = time.monotonic()
            assert wire.WIRE.report() == {} and time.monotonic() - t0 < 0.1
            fut.set_result(None)  # the lost call's callback runs now
            assert wire.WIRE.report() == {}  # no stray row with its ms
    finally:
        wire.WIRE.reset()


class _CountingStamps:
    def __init__(self) -> None:
        self.taken = 0

    def begin(self) -> None:
        pass

    def stamp(self) -> object:
        self.taken += 1
        return object()  # like a CUDA event: an opaque token

    def resolve(self, s: object) -> float:
        return 0.0


def test_an_uninstrumented_run_takes_no_device_stamp_for_its_collectives() -> None:
    """instrument=False is the baseline the instrumentation's cost is measured against: on a GPU the
    hand-written collectives must record no CUDA event then (they did, two a call, once)."""
    stamps_ = _CountingStamps()
    clock, saved = StepClock(enabled=False, stamps=stamps_), wire.WIRE.clock
    wire.WIRE.clock = clock
    try:
        clock.begin()
        taken = stamps_.taken
        with wire.WIRE.counting():
            for _ in range(3):
                with wire._timed("tp", "all_reduce", 8, 8.0):
                    pass
            assert wire.WIRE.report()["tp/all_reduce"]["calls"] == 3
        assert stamps_.taken == taken and clock.resolved_events() == []
    finally:
        wire.WIRE.clock = saved
