"""`%dist pull x` where a rank has no `x`: one line naming the ranks, the kernel's `x` unchanged and
what to do next, not the rank's NameError traceback through the kit's own frames. Any other
error a rank reports keeps its full report. (The real ranks: test_magics::test_pulling_a_name_…)"""
from __future__ import annotations

import pytest

from kit.engine import transfer
from kit.engine.output import CellResult
from kit.errors import CellError, RankFailure, TransferError
from kit.messages import PULL, names_not_defined, not_defined


def _request(failures: dict[int, RankFailure]):
    def request(kind, body, ranks, on_output, timeout_s, check):
        assert kind == PULL
        return CellResult(request_id=1, ranks=(0, 1), failures=failures)
    return request


def _missing(rank: int, names: list[str]) -> RankFailure:
    return RankFailure(rank, "NameError", not_defined(names, rank), traceback="Traceback ... kit/rank/requests.py")


def test_the_rank_s_text_reads_back_as_the_names_it_lacks():
    assert names_not_defined(not_defined(["x", "y"], 1), ["x", "xy", "y"]) == ["x", "y"]
    assert names_not_defined("name 'x' is not defined", ["x"]) is None  # a cell's own NameError


def test_names_no_rank_has_are_said_in_one_line_per_name():
    with pytest.raises(TransferError) as err:
        transfer.pull_whole(_request({0: _missing(0, ["x"]), 1: _missing(1, ["x", "y"])}), ["x", "y"])
    assert str(err.value) == (
        "pull of x, y refused: ranks 0, 1 have no variable x; rank 1 has no variable y; x, y in the kernel are "
        "unchanged. Assign them in a %%distributed cell first (variables of the kernel's own cells are not on the "
        "ranks: %dist push copies one there), then pull again")


def test_the_line_names_them_in_the_learners_order_whichever_rank_replied_first():
    """CI saw "ranks 0, 1 … nowhere_x; rank 0 … only_one" for `%dist pull only_one nowhere_x` when rank 1's
    reply came first: the line followed the replies' arrival."""
    said = set()
    for failures in ({0: _missing(0, ["a", "b"]), 1: _missing(1, ["b"])},
                     {1: _missing(1, ["b"]), 0: _missing(0, ["a", "b"])}):  # rank 1's reply first
        with pytest.raises(TransferError) as err:
            transfer.pull_whole(_request(failures), ["a", "b"])
        said.add(str(err.value).split(";")[0] + ";" + str(err.value).split(";")[1])
    assert said == {"pull of a, b refused: rank 0 has no variable a; ranks 0, 1 have no variable b"}, said


@pytest.mark.parametrize("other", [
    RankFailure(1, "ValueError", "a genuine error", traceback="Traceback ..."),
    RankFailure(1, "WorkerDied", "the process was killed by SIGKILL", died=True),
    RankFailure(1, "NameError", "name 'helper' is not defined", traceback="Traceback ..."),
], ids=["other-error", "died", "other-name-error"])
def test_any_other_rank_error_keeps_its_report(other):
    with pytest.raises(CellError) as err:
        transfer.pull_whole(_request({0: _missing(0, ["x"]), 1: other}), ["x"])
    assert err.value.failures[1] is other
