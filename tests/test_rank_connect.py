"""A rank's TCP connect to the notebook under a flood: each try is short, so the OS's SYN backoff never adds up."""
from __future__ import annotations

import socket

import pytest

from kit.rank import attach


def _connect_after(monkeypatch, errors: list[OSError]) -> tuple[socket.socket, list[float], list[float]]:
    """`_connect` against a fake `create_connection` that raises `errors` one try each, then connects; returns
    the socket it got, each try's timeout and each sleep between tries."""
    tries: list[float] = []
    sleeps: list[float] = []
    ok = socket.socket()

    def create_connection(address, timeout):
        tries.append(timeout)
        if len(tries) <= len(errors):
            raise errors[len(tries) - 1]
        return ok

    monkeypatch.setattr(attach.socket, "create_connection", create_connection)
    monkeypatch.setattr(attach.time, "sleep", sleeps.append)
    try:
        got = attach._connect("127.0.0.1:1", "127.0.0.1", 1, attach.time.monotonic() + 600, 600)
    finally:
        ok.close()
    assert got is ok and len(tries) == len(errors) + 1
    return got, tries, sleeps


def test_a_timed_out_connect_try_starts_over_at_once_and_each_try_is_short(monkeypatch):
    """A flood that fills the listener's accept queue makes the OS drop our SYN and resend it 1, 2, 4, 8, 16 s later;
    one try waiting on that backoff took 45 s once. Each try is capped, and a timed-out one is retried without a sleep."""
    _, tries, sleeps = _connect_after(monkeypatch, [TimeoutError("timed out"), TimeoutError("timed out")])
    assert all(t <= attach.CONNECT_TRY_S for t in tries), tries  # not the 600 s left to the deadline
    assert sleeps == []  # a try that timed out has waited already


def test_a_refused_connect_waits_a_second_before_the_next_try(monkeypatch):
    """The notebook not listening yet (a batch job started first) answers at once: then one try a second."""
    _, _, sleeps = _connect_after(monkeypatch, [ConnectionRefusedError("refused")])
    assert sleeps == [1.0]


def test_the_deadline_still_ends_the_tries(monkeypatch):
    """Past the deadline the rank gives up with the reason (os._exit with the refusal code)."""
    def create_connection(address, timeout):
        raise TimeoutError("timed out")

    def exit_(code):
        raise SystemExit(code)

    monkeypatch.setattr(attach.socket, "create_connection", create_connection)
    monkeypatch.setattr(attach.os, "_exit", exit_)
    with pytest.raises(SystemExit) as e:
        attach._connect("127.0.0.1:1", "127.0.0.1", 1, attach.time.monotonic() - 1, 5)
    assert e.value.code == attach.EXIT_REFUSED
