"""An interrupt (Jupyter's, or Ctrl-C in a script) may land on any line of the kernel's wait for a cell,
not only inside the step that waits for events: wherever it lands, the kit relays it to the ranks and
explains, and the user never sees a KeyboardInterrupt raised from the kit's own loop. Unit tier: the
collector runs against a fake engine state; no process starts."""
from __future__ import annotations

import queue
from types import SimpleNamespace

import pytest

from kit.engine.io import MARK, Event
from kit.engine.output import LineSplitter
from kit.engine.watch import _Collector
from kit.messages import DONE

RID = 7


class _Engine(SimpleNamespace):
    """What the collector reads of the engine's running state: its event queue, and where interrupts go."""

    def __init__(self) -> None:
        super().__init__(io=SimpleNamespace(events=queue.Queue()), stopping=False, interrupted=[])

    def interrupt(self, ranks: list[int]) -> None:
        self.interrupted.append(list(ranks))
        for r in ranks:  # the rank's reply to SIGINT: its cell ended with a KeyboardInterrupt
            self.io.events.put(Event(DONE, r, None, {"id": RID, "error": {
                "ename": "KeyboardInterrupt", "evalue": "", "traceback": "KeyboardInterrupt"}}))
            for stream in ("stdout", "stderr"):
                self.io.events.put(Event(MARK, r, stream, RID))


class _InterruptOnce:
    """Raises KeyboardInterrupt the first time it is called, as a signal landing there would."""

    def __init__(self, then) -> None:
        self.then, self.fired = then, False

    def __call__(self, *args):
        if not self.fired:
            self.fired = True
            raise KeyboardInterrupt
        return self.then(*args)


class _DeadOnce(set):
    """The collector's set of dead ranks, whose first membership test is where the interrupt lands: the
    loop's own condition."""

    fired = False

    def __contains__(self, rank: object) -> bool:
        if not _DeadOnce.fired:
            _DeadOnce.fired = True
            raise KeyboardInterrupt
        return super().__contains__(rank)


def _run(c: _Collector):
    try:
        return c.run()
    except KeyboardInterrupt:  # what the user saw before: a traceback through the kit's loop
        pytest.fail("the interrupt escaped from the kit's wait instead of reaching the ranks")


def _collector(engine: _Engine, said: list[str]) -> _Collector:
    emit = lambda rank, stream, text: said.append(text)  # noqa: E731
    return _Collector(engine, RID, (0, 1), LineSplitter(emit), emit, timeout_s=30, on_display=None)


def _assert_relayed(engine: _Engine, said: list[str], result) -> None:
    assert engine.interrupted == [[0, 1]], engine.interrupted  # both ranks got it, once
    assert any("interrupt sent to rank(s) 0, 1" in s for s in said), said
    assert result.interrupted and set(result.failures) == {0, 1}
    assert any("interrupted at your request" in n for n in result.notes), result.notes


def test_an_interrupt_landing_in_the_waits_loop_condition_is_relayed_not_raised():
    engine, said = _Engine(), []
    c = _collector(engine, said)
    c.dead = _DeadOnce()
    result = _run(c)
    _assert_relayed(engine, said, result)


def test_an_interrupt_landing_in_the_after_death_check_is_relayed_not_raised():
    engine, said = _Engine(), []
    c = _collector(engine, said)
    c.checks.left_behind = _InterruptOnce(c.checks.left_behind)
    result = _run(c)
    _assert_relayed(engine, said, result)


def test_a_rank_released_after_the_interrupt_says_what_torch_said_only_when_it_said_something():
    """Rank 1 stopped at the interrupt, rank 0 released from DDP's all-reduce by the kit: its interrupt has no
    message, so the failure ends with the kit's words, never an empty `(torch said: )`; gloo's error is quoted."""
    from kit.engine.output import CellResult
    from kit.engine.watch_checks import WaitChecks
    from kit.errors import RankFailure

    checks = WaitChecks(None, CellResult(RID, (0, 1)), lambda text: None, 0.0, None)  # type: ignore[arg-type]
    checks.stopped = ([1], {0: "all_reduce"})
    quiet_one = RankFailure(0, "KeyboardInterrupt", "")
    checks.explain(0, quiet_one)
    assert quiet_one.evalue.endswith("Your variables are kept."), quiet_one.evalue
    gloo = RankFailure(0, "RuntimeError", "Connection closed by peer [127.0.0.1]:5")
    checks.explain(0, gloo)
    assert gloo.evalue.endswith("(torch said: Connection closed by peer [127.0.0.1]:5)"), gloo.evalue
