"""Rank state as a notebook user meets it, through a real kernel (jupyter_client, `%load_ext kit`):
cell labels, interrupted pushes, uneven collectives, interrupted DataLoaders, placement notes."""
from __future__ import annotations

import re
from typing import Iterator

import pytest

from kernel_util import Kernel, kernel_available

pytestmark = pytest.mark.skipif(kernel_available() is not None, reason=str(kernel_available()))
WALL_CLOCK_S = 240  # conftest's autouse wall_clock fixture enforces it


@pytest.fixture(scope="module")
def kernel() -> Iterator[Kernel]:
    with Kernel() as k:
        r = k.run("%load_ext kit")
        assert r.status == "ok", r.text
        yield k


def test_cell_labels_are_the_number_jupyter_shows(kernel):
    kernel.run("x = 1")
    r = kernel.run("%%distributed --cpus 2 --pg-timeout 10\ndef f():\n    raise ValueError('boom')\nf()", timeout_s=180)
    assert r.status == "error"
    shown = f"In [{r.execution_count}]"
    labels = set(re.findall(r"In \[\d+\]", r.text))
    assert labels == {shown}, f"Jupyter shows {shown}; the kit said {labels}: {r.text[-1500:]}"
    later = kernel.run("%%distributed\nf()")
    assert "ValueError" in later.text and shown in later.text  # the function's own cell, as Jupyter numbered it
