"""Ctrl-C on the kernel never cuts a control frame in half: a send from the main thread finishes its frame,
then the interrupt is raised (a torn frame desynchronizes the rank's channel and loses the rank's state)."""
from __future__ import annotations

import signal
import threading

import pytest

from kit.engine.running import Running
from kit.engine.whole_frames import sigint_held


class TwoPartChannel:
    """A channel whose frame goes out in two writes, with the user's Ctrl-C arriving between them."""

    def __init__(self) -> None:
        self.written: list[str] = []

    def send(self, kind: str, body: object = None) -> None:
        self.written.append(f"{kind} header")
        signal.raise_signal(signal.SIGINT)  # Python runs the handler at the next bytecode: right here
        self.written.append(f"{kind} payload")


class Ranks:
    def __init__(self) -> None:
        self.channels = {0: TwoPartChannel()}


@pytest.fixture
def python_sigint():
    old = signal.signal(signal.SIGINT, signal.default_int_handler)  # what a kernel running a cell has
    yield
    signal.signal(signal.SIGINT, old)


def test_a_ctrl_c_during_a_send_lands_after_the_whole_frame(python_sigint):
    ranks = Ranks()
    with pytest.raises(KeyboardInterrupt):
        Running.send(ranks, 0, "reset_pg", {"id": 7})  # type: ignore[arg-type]
    assert ranks.channels[0].written == ["reset_pg header", "reset_pg payload"]
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler  # the kernel's handler is back


def test_without_the_hold_the_same_ctrl_c_cuts_the_frame(python_sigint):
    """What the hold prevents (and what the test above would see without it)."""
    chan = TwoPartChannel()
    with pytest.raises(KeyboardInterrupt):
        chan.send("reset_pg")
    assert chan.written == ["reset_pg header"]


def test_an_ignored_sigint_stays_ignored():
    old = signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        with sigint_held():
            signal.raise_signal(signal.SIGINT)
        assert signal.getsignal(signal.SIGINT) is signal.SIG_IGN
    finally:
        signal.signal(signal.SIGINT, old)


def test_sends_off_the_main_thread_leave_the_handler_alone(python_sigint):
    seen = []

    def send() -> None:
        with sigint_held():
            seen.append(signal.getsignal(signal.SIGINT))
    t = threading.Thread(target=send)
    t.start()
    t.join()
    assert seen == [signal.default_int_handler]
