"""The wire's counts of FSDP2's asynchronous collectives: a step's report holds the same calls as its timeline.

FSDP2 waits on an all-gather's work, but gloo's thread runs the kit's completion callback (which adds the
call's ms and its timeline phase) just after; on a loaded machine that was after the step's report, so
the report lacked a call's ms that the step's timeline showed (an HSDP run: 6.4 ms reported, 11.2 ms of
phases). No process here: a torch Future stands for the work, completed late from another thread.
"""
from __future__ import annotations

import threading
import time

import torch

from kit.experiments.parallel import wire


class _Work:
    def __init__(self, fut: torch.futures.Future) -> None:
        self.fut = fut

    def get_future(self) -> torch.futures.Future:
        return self.fut


class _Clock:
    def __init__(self) -> None:
        self.phases: list[tuple[str, str, float, float]] = []

    def now(self) -> float:
        return time.perf_counter()

    def add_phase(self, name: str, kind: str, start: float, end: float) -> None:
        self.phases.append((name, kind, start, end))


def test_a_report_waits_for_a_late_completion_callback() -> None:
    fut: torch.futures.Future = torch.futures.Future()
    call = wire.CustomCollectives("fsdp", 2).wrap(
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
        assert wire.WIRE.pending == 0
    finally:
        wire.WIRE.clock = saved


def test_a_report_does_not_wait_when_every_call_completed() -> None:
    fut: torch.futures.Future = torch.futures.Future()
    fut.set_result(None)  # completed before the kit asks: the callback runs inline
    call = wire.CustomCollectives("fsdp", 2).wrap("reduce_scatter", lambda out, inp: _Work(fut),
                                                  lambda out, inp: inp.numel() * inp.element_size())
    with wire.WIRE.counting():
        call(torch.zeros(4), torch.zeros(8))
        t0 = time.monotonic()
        row = wire.WIRE.report()["fsdp/reduce_scatter"]
        assert time.monotonic() - t0 < 0.1 and row["calls"] == 1 and wire.WIRE.pending == 0
