"""What a rank's main thread does with each request kind (kit/rank/requests.py), in this process: no rank
is started. The kinds the control thread queues (kit.messages.REQUESTS) and the handlers are one table."""
from __future__ import annotations

import pickle
from types import SimpleNamespace

import pytest

from kit.messages import CALL, EXEC, PULL, PUSH, PUSH_COMMIT, REQUESTS
from kit.rank import cell
from kit.rank.requests import HANDLERS, dispatch


def _worker() -> SimpleNamespace:
    return SimpleNamespace(rank=0, cells=0, ns={}, init_group=None, staged=None)


def test_every_request_kind_has_one_handler_and_no_handler_lacks_a_kind():
    assert set(HANDLERS) == set(REQUESTS) and len(REQUESTS) == len(set(REQUESTS))


def test_a_cell_runs_in_the_ranks_namespace_and_a_call_returns_its_value():
    w = _worker()
    assert dispatch(w, EXEC, {"code": "x = 20\nx + 1"}, cell.cell_filename(1)) == 21
    assert w.ns["x"] == 20 and w.cells == 1
    assert dispatch(w, CALL, {"target": "math:hypot", "args": (3, 4)}, "") == 5.0


def test_a_push_is_kept_only_by_the_request_right_after_it():
    w = _worker()
    values = {"a": pickle.dumps([1, 2])}
    assert dispatch(w, PUSH, {"id": 7, "values": values}, "") is cell.NO_VALUE
    assert "a" not in w.ns  # staged, not yet in the namespace
    dispatch(w, PUSH_COMMIT, {"push": 7, "keep": True}, "")
    assert w.ns["a"] == [1, 2]
    dispatch(w, PUSH, {"id": 8, "values": {"b": pickle.dumps(3)}}, "")
    dispatch(w, EXEC, {"code": "pass"}, "")  # another request came first: the push is gone
    with pytest.raises(LookupError, match="no longer holds the pushed values"):
        dispatch(w, PUSH_COMMIT, {"push": 8, "keep": True}, "")
    assert "b" not in w.ns


def test_a_pull_names_what_is_missing_and_an_unknown_kind_is_refused():
    w = _worker()
    w.ns["y"] = 5
    got = dispatch(w, PULL, {"names": ["y"]}, "")
    assert got["items"]["y"]["repr"] == "5"
    with pytest.raises(NameError, match="'z'"):
        dispatch(w, PULL, {"names": ["y", "z"]}, "")
    with pytest.raises(ValueError, match="unknown request 'nope'"):
        dispatch(w, "nope", {}, "")
