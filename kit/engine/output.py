"""Kernel side: raw per-rank output chunks become labelled lines, and the cell's result.

`\r` progress lines keep only their latest state, a line left incomplete for a second is
shown anyway (so progress is live), and each rank's output per cell is capped so a flood
cannot freeze the notebook; the cap is announced with a marker line. The cap bounds memory
too (Binder has 1-2 GB for everything): a line without a newline is cut into pieces, and
past the cap only a count and the last few lines are kept; the last TAIL_SHOWN of them are shown at the
cell's end under the count, for every rank (a dying rank's last words, a loop's last step).

Lines reach a notebook in batches (`Printer`): ipykernel sends one message per flush, and a message per line
trips Jupyter's limits: the kernel's IOPub socket drops messages past its high-water mark (1000 queued;
markers and whole ranks' output went missing under nbclient), and the server's 1000 messages/s rate limit
stops the output while the front end works through the backlog, busy long after the kernel is idle.
"""
from __future__ import annotations

import codecs
import collections
import pickle
import sys
import time
from dataclasses import dataclass, field
from typing import Any, Callable

from kit.errors import CellError, RankFailure
from kit.messages import Reply

__all__ = ["LineSplitter", "CellResult", "Printer", "print_line", "OUTPUT_CAP_BYTES", "IO_CAP_BYTES", "LINE_CAP"]

OUTPUT_CAP_BYTES = 256 << 10  # shown per rank per stream per cell; the rest is counted
IO_CAP_BYTES = OUTPUT_CAP_BYTES + (64 << 10)  # queued by the IO thread per rank, stream and cell; the rest dropped
LINE_CAP = 16 << 10  # a line longer than this (or without a newline) is shown in pieces of this size
TAIL_LINES, TAIL_LINE_CAP = 50, 2048  # kept past the cap: the last lines, each cut to this length
TAIL_SHOWN, TAIL_SHOWN_CHARS = 10, 4096  # of those, shown at the cell's end under the count of what was not
BATCH_S = 0.02  # a Printer writes each stream at most this often (50 messages/s), a quiet line at once
Emit = Callable[[int, str, str], None]


def _labelled(rank: int, text: str) -> str:
    return ("[kit] " if rank < 0 else f"[rank {rank}] ") + text + "\n"


def print_line(rank: int, stream: str, text: str) -> None:
    """An unbatched output sink, for a few lines: `[rank N] text`, or `[kit] text` for the kit's notes (rank -1)."""
    out = sys.stderr if stream == "stderr" else sys.stdout
    out.write(_labelled(rank, text))
    out.flush()


class Printer:
    """The output sink for a cell: print_line's labels, written in batches. A line is written at once when the
    last write was BATCH_S ago or more; otherwise it waits for `flush(due_only=True)` (the LineSplitter's tick,
    several times a second while a cell runs) or `flush()`. Each stream is one write and one flush, so a flood
    is a few large messages; within one batch stdout and stderr may swap order (ipykernel's own streams do too)."""

    def __init__(self) -> None:
        self._pending: dict[str, list[str]] = {}  # by stream, in the order their first lines came
        self._flushed_s = 0.0

    def __call__(self, rank: int, stream: str, text: str) -> None:
        self._pending.setdefault(stream, []).append(_labelled(rank, text))
        self.flush(due_only=True)

    def flush(self, due_only: bool = False) -> None:
        now = time.monotonic()
        if not self._pending or (due_only and now - self._flushed_s < BATCH_S):
            return
        pending, self._pending, self._flushed_s = self._pending, {}, now
        for stream, lines in pending.items():
            out = sys.stderr if stream == "stderr" else sys.stdout
            out.write("".join(lines))
            out.flush()


class LineSplitter:
    def __init__(self, emit: Emit, cap_bytes: int = OUTPUT_CAP_BYTES):
        self.emit, self.cap = emit, cap_bytes
        self._decoders: dict[tuple[int, str], Any] = {}
        self._partial: dict[tuple[int, str], tuple[str, float]] = {}
        self._shown: dict[tuple[int, str], int] = {}
        self._dropped: dict[tuple[int, str], int] = {}
        self._tail: dict[tuple[int, str], collections.deque[str]] = {}
        self._cut: set[tuple[int, str]] = set()  # the IO thread dropped bytes here: the next chunk starts mid-line
        self.captured: dict[tuple[int, str], list[str]] = {}  # the shown lines; at close() also the tail

    def feed(self, rank: int, stream: str, data: bytes) -> None:
        key = (rank, stream)
        dec = self._decoders.setdefault(key, codecs.getincrementaldecoder("utf-8")("replace"))
        text = self._partial.pop(key, ("", 0.0))[0] + dec.decode(data)
        if key in self._cut and "\n" in text:  # the end of a line whose start was dropped: it may hold the
            self._cut.discard(key)             # rank's last words (print("done") after a long write), so its end,
            head, text = text.split("\n", 1)   # marked as cut, joins the tail, counted like every line past the cap
            self._line(key, "…" + head.rsplit("\r", 1)[-1][-(TAIL_LINE_CAP - 1):])
        *lines, rest = text.split("\n")
        for line in lines:
            self._line(key, line.rsplit("\r", 1)[-1])
        rest = rest.rsplit("\r", 1)[-1]
        while len(rest) > LINE_CAP:  # a line that never ends must not grow without bound (nor be re-copied)
            self._line(key, rest[:LINE_CAP])
            rest = rest[LINE_CAP:]
        if rest:
            self._partial[key] = (rest, time.monotonic())

    def count_dropped(self, rank: int, stream: str, nbytes: int) -> None:
        """Bytes the IO thread dropped past its cap: counted here, so the final marker includes them."""
        key = (rank, stream)
        if self._shown.get(key, 0) < self.cap:
            self._shown[key] = self.cap
            self._truncated(key)
        self._dropped[key] = self._dropped.get(key, 0) + nbytes + len(self._partial.pop(key, ("", 0.0))[0])
        self._decoders.pop(key, None)  # the bytes after the gap may start inside a character
        self._tail.pop(key, None)  # lines before the gap: the tail to show is what follows it
        self._cut.add(key)

    def tail(self, key: tuple[int, str], n: int = 20) -> list[str]:
        """The last n lines seen on a stream, shown or not (a dead rank's last words)."""
        return (self.captured.get(key, [])[-n:] + list(self._tail.get(key, ())))[-n:]

    def flush_rank(self, rank: int) -> None:
        """Show a rank's pending partial lines now (before a display() from that rank)."""
        for key in [k for k in self._partial if k[0] == rank]:
            text, _ = self._partial.pop(key)
            if text:
                self._line(key, text)
        self._flush()

    def tick(self, stale_s: float = 1.0) -> None:
        """Show lines that have waited for their newline too long (progress bars)."""
        now = time.monotonic()
        for key, (text, since) in list(self._partial.items()):
            if now - since >= stale_s and text:
                del self._partial[key]
                self._line(key, text)
        self._flush(due_only=True)

    def _flush(self, due_only: bool = False) -> None:
        if isinstance(self.emit, Printer):
            self.emit.flush(due_only)

    def _line(self, key: tuple[int, str], line: str) -> None:
        shown = self._shown.get(key, 0)
        if shown >= self.cap:  # counted, not kept: only a short tail survives
            self._dropped[key] = self._dropped.get(key, 0) + len(line) + 1
            self._tail.setdefault(key, collections.deque(maxlen=TAIL_LINES)).append(line[:TAIL_LINE_CAP])
            return
        if len(line) + 1 > self.cap - shown:  # whole lines up to the cap; a first line longer than it is cut
            if shown:
                self._shown[key] = self.cap
                self._truncated(key)
                self._line(key, line)  # counted, into the tail
                return
            self._dropped[key] = self._dropped.get(key, 0) + len(line) - (self.cap - shown - 1)
            line = line[:self.cap - shown - 1]
        self.captured.setdefault(key, []).append(line)
        self._shown[key] = shown + len(line) + 1
        self.emit(key[0], key[1], line)
        if self._shown[key] >= self.cap:
            self._truncated(key)

    def _truncated(self, key: tuple[int, str]) -> None:
        self.emit(key[0], key[1], f"[kit] output truncated after {self.cap >> 10} KiB on this stream; "
                                  "the rest is counted and not shown. To see it all, print less often (every "
                                  "100th step) or to a file per rank: log = open(f'log{rank}.txt', 'w'); "
                                  "print(..., file=log)")

    def close(self) -> dict[tuple[int, str], int]:
        for key, (text, _) in list(self._partial.items()):
            if text:
                self._line(key, text)
        self._partial.clear()
        for key, n in sorted(self._dropped.items()):  # every rank's count, then its last lines
            tail = list(self._tail.pop(key, ()))
            shown = _last(tail)
            rest = n - sum(len(line) + 1 for line in shown)
            self.emit(key[0], key[1], f"[kit] {rest / 1024:.0f} KiB more {key[1]} not shown"
                                      + (f"; the last {len(shown)} line(s):" if shown else ""))
            for line in shown:
                self.emit(key[0], key[1], line)
            self.captured.setdefault(key, []).append(f"[kit] {n / 1024:.0f} KiB more {key[1]} not kept; "
                                                      f"the last {len(tail)} line(s):")
            self.captured[key] += tail
        self._flush()
        return dict(self._dropped)


def _last(lines: list[str]) -> list[str]:
    """The last TAIL_SHOWN lines, fewer where they would pass TAIL_SHOWN_CHARS (the last one always)."""
    shown: list[str] = []
    for line in reversed(lines[-TAIL_SHOWN:]):
        if shown and sum(len(x) + 1 for x in shown) + len(line) + 1 > TAIL_SHOWN_CHARS:
            break
        shown.insert(0, line)
    return shown


@dataclass
class CellResult:
    """What one request did on each rank. `values` unpickles lazily (a tensor imports torch)."""

    request_id: int
    ranks: tuple[int, ...]
    replies: dict[int, Reply] = field(default_factory=dict)  # each rank's DONE frame
    failures: dict[int, RankFailure] = field(default_factory=dict)
    output: dict[tuple[int, str], list[str]] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)
    elapsed_s: float = 0.0
    interrupted: bool = False
    displays: list[tuple[int, dict[str, Any]]] = field(default_factory=list)  # display() bundles, in order
    unsent: tuple[int, ...] = ()  # ranks the request never reached (the kernel was interrupted while sending)
    group_closed: bool = False  # the kit closed ranks' group connections to end a wait (watch_checks): re-create it

    @property
    def ok(self) -> bool:
        return not self.failures

    def stdout(self, rank: int) -> str:
        return "\n".join(self.output.get((rank, "stdout"), []))

    def stderr(self, rank: int) -> str:
        return "\n".join(self.output.get((rank, "stderr"), []))

    @property
    def reprs(self) -> dict[int, str]:
        return {r: rep["value"]["repr"] for r, rep in self.replies.items() if rep.get("value")}

    @property
    def values(self) -> dict[int, Any]:
        """Last-expression values by rank; a value that could not travel is its repr string."""
        out = {}
        for r, rep in sorted(self.replies.items()):
            v = rep.get("value")
            if v:
                out[r] = v["repr"]
                if v.get("pickle") is not None:
                    try:  # a class defined in a cell exists only on the ranks: show its repr instead
                        out[r] = pickle.loads(v["pickle"])
                    except Exception as e:
                        v.setdefault("note", None)
                        v["note"] = v["note"] or f"the value could not be rebuilt in the kernel ({type(e).__name__}: " \
                                                 f"{e}); showing its repr"
        return out

    @property
    def figures(self) -> dict[int, list[bytes]]:
        return {r: rep["figures"] for r, rep in self.replies.items() if rep.get("figures")}

    def raise_for_error(self) -> "CellResult":
        if self.failures:
            raise CellError(self.failures, self.notes, self.interrupted)
        return self
