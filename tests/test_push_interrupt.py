"""A Ctrl-C anywhere in a push says which ranks have the values, and is right: every chosen rank or none.

The ranks keep staged values apart until the kernel's commit, so the kernel's message must follow the
commit exactly. The interrupt is delivered at every place in turn where CPython can deliver one inside
the push, and once inside the commit's own request."""
from __future__ import annotations

import signal
import sys
from types import SimpleNamespace
from typing import Any

import pytest
from IPython.core.error import UsageError

from kit.engine import transfer
from kit.engine.output import CellResult
from kit.messages import PUSH, PUSH_COMMIT
from kit.notebook import dist_line


class FakeRanks:
    """Two ranks that stage a push, keep it on a commit with keep=True, and drop it on any other request."""

    def __init__(self, interrupt_in_commit: bool = False) -> None:
        self.staged: set[int] = set()
        self.requests: list[str] = []
        self.have: set[int] = set()
        self.interrupt_in_commit = interrupt_in_commit

    def request(self, kind: str, body: dict[str, Any], ranks: Any, on_output: Any, timeout_s: Any,
                check: Any) -> CellResult:
        chosen = tuple(ranks) if ranks is not None else (0, 1)
        self.requests.append(kind)
        if kind == PUSH:
            self.staged = set(chosen)
            return CellResult(request_id=7, ranks=chosen, replies={r: {"id": 7, "ok": True} for r in chosen})
        assert kind == PUSH_COMMIT and body["push"] == 7, (kind, body)
        if self.interrupt_in_commit:
            signal.raise_signal(signal.SIGINT)  # the user's Ctrl-C while the commit's frames go out
        if body["keep"]:
            self.have |= self.staged & set(chosen)
        self.staged = set()
        return CellResult(request_id=8, ranks=chosen, replies={r: {"id": 8, "ok": True} for r in chosen})


@pytest.fixture
def python_sigint():
    old = signal.signal(signal.SIGINT, signal.default_int_handler)  # what a kernel running a cell has
    yield
    signal.signal(signal.SIGINT, old)


def _push_interrupted_at(point: int, ranks: FakeRanks) -> BaseException | None:
    """Run a push, delivering SIGINT at its `point`-th place where CPython can deliver one; return what it
    raised. CPython runs a signal handler at its eval-breaker checks: on entering a Python function and
    when a C call returns (and at loops' back edges, which the push has none of), so those are the places:
    the profiler's call, c_call and c_return events in the push's own functions and the ranks' request.
    No interrupt is delivered when the push has fewer places (then StopIteration is returned)."""
    seen = [0]
    traced = {transfer.__file__, __file__}

    def on_event(frame: Any, event: str, arg: Any) -> None:
        if event in ("call", "c_call", "c_return") and frame.f_code.co_filename in traced \
                and frame.f_code.co_name != "_push_interrupted_at":
            seen[0] += 1
            if seen[0] - 1 == point:
                signal.raise_signal(signal.SIGINT)

    sys.setprofile(on_event)
    try:
        transfer.push(ranks.request, {"big": list(range(1000))})
    except KeyboardInterrupt as e:
        return e
    finally:
        sys.setprofile(None)
    return None if seen[0] > point else StopIteration()


def test_an_interrupt_anywhere_in_a_push_says_truly_whether_the_ranks_have_it(python_sigint):
    outcomes = set()
    for point in range(1000):
        ranks = FakeRanks()
        raised = _push_interrupted_at(point, ranks)
        if isinstance(raised, StopIteration):
            break  # the push ran to its end before this place: every place has had its interrupt
        assert raised is not None, f"interrupt at place {point} was lost"
        said = str(raised)
        if not raised.args:  # only before the push sent anything (the magic says so: tests/test_faults_notebook)
            assert ranks.requests == [], f"a bare KeyboardInterrupt escaped the push at place {point}"
            continue
        if said.startswith("pushed big"):
            assert ranks.have == {0, 1}, (point, said, ranks.have)
            outcomes.add("pushed")
        else:
            assert "no rank has big" in said and ranks.have == set(), (point, said, ranks.have)
            outcomes.add("none")
    else:
        pytest.fail("the push never ran to its end")
    assert outcomes == {"pushed", "none"}, outcomes  # the sweep landed both before and after the commit
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler  # the kernel's handler is back


def test_an_interrupt_while_the_commit_goes_out_lands_after_it(python_sigint):
    ranks = FakeRanks(interrupt_in_commit=True)
    with pytest.raises(KeyboardInterrupt, match="pushed big: the interrupt came as the ranks kept it; rank"):
        transfer.push(ranks.request, {"big": 1})
    assert ranks.have == {0, 1}


def test_a_commit_that_fails_on_a_rank_says_who_has_the_values_and_is_no_interrupt(python_sigint):
    """The commit holds Ctrl-C, so a failed commit is its timeout or a death, never the user's interrupt:
    it is a TransferError naming who has the values, not a KeyboardInterrupt."""
    from kit.errors import RankFailure, TransferError

    class CommitFails(FakeRanks):
        def request(self, kind, body, ranks, on_output, timeout_s, check):
            result = super().request(kind, body, ranks, on_output, timeout_s, check)
            if kind == PUSH_COMMIT:
                self.have.discard(1)
                result.failures[1] = RankFailure(1, "Died", "killed by signal 9", died=True)
            return result

    ranks = CommitFails()
    with pytest.raises(TransferError, match=r"^push of big half done: the commit failed on rank\(s\) 1 \(rank 1 died: "
                                            r"killed by signal 9\), so rank\(s\) 0 have big and rank\(s\) 1 do not"):
        transfer.push(ranks.request, {"big": 1})
    assert ranks.have == {0}


def test_an_uninterrupted_push_says_nothing_and_every_rank_has_it(python_sigint):
    ranks = FakeRanks()
    transfer.push(ranks.request, {"big": 1}, ranks=[1])
    assert ranks.have == {1}


def _magic_push(monkeypatch, push: Any, interrupt_printing: bool = False,
                recorded: list[Any] | None = None) -> list[str]:
    """`%dist push big` against a stand-in cluster; `recorded` gets what the magic hands `%dist export`."""
    said: list[str] = []

    def emit(rank: int, stream: str, text: str) -> None:
        if interrupt_printing and not said:
            said.append("<interrupted>")
            raise KeyboardInterrupt  # as SIGINT's handler raises it while the line is printed
        said.append(text)

    monkeypatch.setattr(dist_line, "_emit", emit)
    magics = SimpleNamespace(shell=SimpleNamespace(user_ns={"big": 1}),
                             record_push=lambda names, ranks: (recorded if recorded is not None else []).append(names))
    dist_line._push(magics, SimpleNamespace(push=push), ["big"], None)  # type: ignore[arg-type]
    return said


def test_the_magic_says_pushed_when_the_interrupt_lands_as_it_prints(monkeypatch):
    recorded: list[Any] = []
    with pytest.raises(UsageError, match=r"^pushed big to every rank \(the interrupt came after the ranks had"):
        _magic_push(monkeypatch, lambda values, ranks: None, interrupt_printing=True, recorded=recorded)
    assert recorded == [["big"]]  # every rank has it: `%dist export` writes it


def test_a_push_the_interrupt_followed_is_exported_as_a_push(monkeypatch, python_sigint):
    """The interrupt came as the ranks kept the values (transfer.push says so): they are on every rank, so the
    exported script assigns them too (without them it would fail under torchrun with a NameError)."""
    def kept_then_interrupted(values: Any, ranks: Any) -> None:
        transfer.push(FakeRanks(interrupt_in_commit=True).request, values, ranks)

    recorded: list[Any] = []
    with pytest.raises(UsageError, match="^pushed big: the interrupt came as the ranks kept it"):
        _magic_push(monkeypatch, kept_then_interrupted, recorded=recorded)
    assert recorded == [["big"]]


def test_the_magic_says_nothing_was_sent_when_the_interrupt_lands_before_the_push(monkeypatch):
    def interrupted_on_entry(values: Any, ranks: Any) -> None:
        raise KeyboardInterrupt  # bare: transfer.push words every interrupt that lands inside it

    recorded: list[Any] = []
    with pytest.raises(UsageError, match="^push of big interrupted before anything was sent; no rank has big$"):
        _magic_push(monkeypatch, interrupted_on_entry, recorded=recorded)
    assert recorded == []  # no rank has it: the script must not assign it either
