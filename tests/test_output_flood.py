"""A cell printing a million lines on every rank reaches a real kernel's client complete
(each rank's first 256 KiB, the truncation marker, the count and every rank's last lines) in a few
batched messages, instead of one message per line (Jupyter's IOPub socket dropped messages past its
high-water mark: under nbclient whole stretches, rank 1's lines and the marker went missing)."""
from __future__ import annotations

import io
import re
import sys
import time

import pytest

from kit.engine.output import BATCH_S, OUTPUT_CAP_BYTES, LineSplitter, Printer

WALL_CLOCK_S = 400
FLOOD = "%%distributed --cpus 2\nfor i in range(1_000_000):\n    print(f'line {i}')"


class _Counting(io.StringIO):
    def __init__(self) -> None:
        super().__init__()
        self.flushes = 0

    def flush(self) -> None:
        self.flushes += 1


def test_printer_writes_a_flood_in_batches_and_a_quiet_line_at_once(monkeypatch):
    out, err = _Counting(), _Counting()
    monkeypatch.setattr(sys, "stdout", out)
    monkeypatch.setattr(sys, "stderr", err)
    printer = Printer()
    splitter = LineSplitter(printer, cap_bytes=1 << 30)
    t0 = time.monotonic()
    for i in range(20_000):
        splitter.feed(i % 2, "stdout", f"line {i}\n".encode())
        if i % 100 == 0:
            splitter.tick()  # as the wait loop does between drains
    splitter.close()
    elapsed_s = time.monotonic() - t0
    lines = out.getvalue().splitlines()
    assert lines == [f"[rank {i % 2}] line {i}" for i in range(20_000)]  # complete, in order, labelled
    assert out.flushes <= elapsed_s / BATCH_S + 2, (out.flushes, elapsed_s)  # one message per batch, not per line
    time.sleep(BATCH_S)
    printer(-1, "stderr", "a note after a quiet moment")
    assert err.getvalue() == "[kit] a note after a quiet moment\n" and err.flushes == 1  # written at once


def _nbclient_run(cells: list[str]) -> tuple[list[dict], float]:
    nbformat = pytest.importorskip("nbformat")
    nbclient = pytest.importorskip("nbclient")
    nb = nbformat.v4.new_notebook()
    nb.cells = [nbformat.v4.new_code_cell(c) for c in cells]
    t0 = time.monotonic()
    nbclient.NotebookClient(nb, timeout=300, kernel_name="python3").execute()
    return [c.outputs for c in nb.cells], time.monotonic() - t0


def test_a_million_lines_per_rank_reach_nbclient_complete_with_every_ranks_tail():
    outputs, elapsed_s = _nbclient_run(["%load_ext kit", FLOOD, "print('after the flood')"])
    flood = outputs[1]
    text = "".join(o.get("text", "") for o in flood if o["output_type"] == "stream")
    lines = text.splitlines()
    for rank in (0, 1):
        mine = [x[len(f"[rank {rank}] "):] for x in lines if x.startswith(f"[rank {rank}] ")]
        marker = next(i for i, x in enumerate(mine) if x.startswith(
            "[kit] output truncated after 256 KiB on this stream; the rest is counted and not shown. "))
        shown = mine[:marker]
        assert shown == [f"line {i}" for i in range(len(shown))], "lines went missing before the cap"
        assert sum(len(x) + 1 for x in shown) > OUTPUT_CAP_BYTES - 64, "the first 256 KiB are shown whole"
        count = mine[marker + 1]
        assert re.fullmatch(r"\[kit\] \d+ KiB more stdout not shown; the last 10 line\(s\):", count), count
        assert mine[marker + 2:] == [f"line {i}" for i in range(999_990, 1_000_000)], mine[marker + 1:]
    # a few batches, not a message per line: far under the 1000 a Jupyter IOPub socket holds (it drops the rest)
    assert len(flood) < 200, f"{len(flood)} messages for one flood (took {elapsed_s:.0f} s)"
    assert outputs[2] == [{"output_type": "stream", "name": "stdout", "text": "after the flood\n"}]
