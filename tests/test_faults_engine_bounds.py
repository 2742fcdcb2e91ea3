"""Output floods are bounded in kernel *memory*, not just on screen: a line without a newline
is split, lines past the cap are counted, not kept, and the IO thread queues a bounded number of bytes per
rank, stream and cell, with a marker saying how much was dropped."""
from __future__ import annotations

import threading
import time

import pytest

from kit.engine.output import OUTPUT_CAP_BYTES, TAIL_SHOWN_CHARS, LineSplitter
from conftest import quiet

psutil = pytest.importorskip("psutil")
WALL_CLOCK_S = 120  # conftest's autouse wall_clock fixture enforces it


class PeakRSS:
    """Samples this process's RSS every 10 ms while a flood runs."""

    def __init__(self) -> None:
        self.proc, self.peak, self._stop = psutil.Process(), 0, threading.Event()
        self.base = self.proc.memory_info().rss
        self._t = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.is_set():
            self.peak = max(self.peak, self.proc.memory_info().rss)
            time.sleep(0.01)

    def __enter__(self) -> "PeakRSS":
        self._t.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._t.join()

    @property
    def growth_mib(self) -> float:
        return (self.peak - self.base) / 2**20


FLOODS = {
    # one 8 MB line without a newline, on fd 1 (C level) and through print
    "one-long-line": "import os\nos.write(1, b'x' * 8_000_000)\nprint('y' * 8_000_000, end='')\n'finished'",
    # 40 MB of short lines on fd 2
    "short-lines": "import os\nchunk = (b'e' * 99 + b'\\n') * 10_000\nfor _ in range(40):\n    os.write(2, chunk)\n"
                   "'finished'",
}


@pytest.mark.parametrize("flood", list(FLOODS))
def test_flood_keeps_kernel_memory_bounded(cluster, flood):
    cluster.run("1", on_output=quiet)  # warm: the first request allocates a little
    shown: list[tuple[int, str, str]] = []
    with PeakRSS() as rss:
        r = cluster.run(FLOODS[flood], on_output=lambda *a: shown.append(a))
    assert r.ok and r.values == {0: "finished", 1: "finished"}
    assert rss.growth_mib < 40, f"kernel RSS grew {rss.growth_mib:.0f} MiB under a {flood} flood"
    for key, lines in r.output.items():  # what the result keeps is bounded too
        assert sum(len(line) + 1 for line in lines) < 2 * OUTPUT_CAP_BYTES, key
    for rank in (0, 1):
        stream = "stdout" if flood == "one-long-line" else "stderr"
        texts = [t for (rk, s, t) in shown if rk == rank and s == stream]
        assert sum(len(t) + 1 for t in texts) < OUTPUT_CAP_BYTES + 4096 + TAIL_SHOWN_CHARS  # markers, the last lines
        assert any("output truncated after 256 KiB" in t for t in texts)
        more = [t for t in texts if "KiB more" in t]
        assert more and int(more[-1].split()[1]) > 1000  # the marker counts what was dropped: megabytes
    assert cluster.run("'still fine'", on_output=quiet).values[0] == "still fine"


def test_line_splitter_bounds_partial_lines_and_what_it_keeps():
    shown: list[str] = []
    s = LineSplitter(lambda r, st, t: shown.append(t), cap_bytes=1000)
    for _ in range(200):
        s.feed(0, "stdout", b"z" * 1000)  # 200 kB, never a newline
    assert sum(len(t) for t in s._partial.get((0, "stdout"), ("", 0))[0:1]) <= 64 << 10  # the partial line is bounded
    for i in range(10_000):
        s.feed(0, "stdout", f"line {i}\n".encode())
    s.close()
    kept = s.captured[(0, "stdout")]
    assert sum(len(t) + 1 for t in kept) < 2000 + 64 * 200, "dropped lines are still kept"
    assert kept[-1] == "line 9999"  # the tail (a dying rank's last words) is kept
    assert sum(len(t) + 1 for t in shown) < 1000 + 500
    assert "KiB more stdout not shown; the last 10 line(s):" in shown[-11]  # the count, then the tail
    marker = next(t for t in shown if t.startswith("[kit] output truncated"))  # and what to do to see it all
    assert "print less often (every 100th step) or to a file per rank: log = open(f'log{rank}.txt', 'w')" in marker
    assert shown[-10:] == [f"line {i}" for i in range(9990, 10_000)]


def test_a_huge_exception_message_is_cut(cluster):
    r = cluster.run("if rank == 1:\n    raise ValueError('m' * 20_000_000)", on_output=quiet)
    failure = r.failures[1]
    assert len(failure.evalue) < 20_000 and "KiB of this text not shown" in failure.evalue
    assert len(failure.traceback) < 20_000 and failure.traceback.rstrip().endswith("m")


def test_the_end_of_a_line_whose_start_was_dropped_is_the_last_line_shown():
    # sys.stdout.write("x" * 5_000_000); print("end", rank): the IO thread drops the middle of the one long line and
    # passes on its last 4 KiB; the cell ended with "[kit] 4643 KiB more stdout not shown" and no "end 0".
    shown: list[str] = []
    s = LineSplitter(lambda r, st, t: shown.append(t), cap_bytes=1000)
    s.feed(0, "stdout", b"x" * 2000)
    s.count_dropped(0, "stdout", 5_000_000)  # what the IO thread did not queue
    s.feed(0, "stdout", b"x" * 4090 + b"end 0\n")  # its last words: the end of the same line
    s.close()
    assert "KiB more stdout not shown; the last 1 line(s):" in shown[-2], shown[-2:]
    assert shown[-1].startswith("…x") and shown[-1].endswith("xend 0") and len(shown[-1]) <= 2048, shown[-1][-80:]
