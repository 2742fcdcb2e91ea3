"""`%dist pull` when an interrupt lands in the kernel right around the moment the values are stored:
the kernel's variables are either all the pulled values and the cell says it pulled them, or all as
they were and the cell says so in one line. (The sweep over real interrupts in a real kernel is
tests/test_transfer_transactions.py; here the two edges are hit exactly.)"""
from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest
from IPython.core.error import UsageError

from kit.notebook import dist_line


class _InterruptingRead(dict):
    """A rank's reply whose first read raises KeyboardInterrupt: the interrupt lands after the pull
    returned and before the values are stored."""

    def __getitem__(self, key: str) -> Any:
        raise KeyboardInterrupt


def _pull(reply: dict[str, Any], ns: dict[str, Any], monkeypatch, interrupt_on: str | None = None) -> list[str]:
    said: list[str] = []

    def emit(rank: int, stream: str, text: str) -> None:
        if interrupt_on is not None and text.startswith(interrupt_on) and not said:
            said.append("<interrupted>")
            raise KeyboardInterrupt  # as SIGINT's handler raises it while the line is printed
        said.append(text)

    monkeypatch.setattr(dist_line, "_emit", emit)
    cluster = SimpleNamespace(pull=lambda names, ranks, on_output, whole: {1: reply})
    magics = SimpleNamespace(shell=SimpleNamespace(user_ns=ns))
    dist_line._pull(magics, cluster, ["big", "small"], [1])  # type: ignore[arg-type]
    return said


def test_an_interrupt_after_the_values_are_stored_still_says_they_were_pulled(monkeypatch):
    """An interrupt that lands while "pulled big, small ..." is printed, after the values are stored, ends
    the pull without a KeyboardInterrupt traceback: the variables hold the pulled values, and the last line
    says the interrupt came after they were stored."""
    ns: dict[str, Any] = {"big": "before", "small": "before"}
    said = _pull({"big": [1, 2], "small": 3}, ns, monkeypatch, interrupt_on="pulled")
    assert ns["big"] == [1, 2] and ns["small"] == 3
    assert said[-1] == ("pulled big, small into the kernel as the value from rank 1 "
                        "(the interrupt came after they were stored)"), said


def test_an_interrupt_before_the_values_are_stored_leaves_every_variable_and_says_so(monkeypatch):
    ns: dict[str, Any] = {"big": "before", "small": "before"}
    with pytest.raises(UsageError) as err:
        _pull(_InterruptingRead(big=[1, 2], small=3), ns, monkeypatch)
    assert ns == {"big": "before", "small": "before"}
    assert str(err.value) == "pull of big, small interrupted; big, small in the kernel are unchanged"
