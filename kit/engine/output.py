"""Kernel side: raw per-rank output chunks become labelled lines, and the cell's result.

`\r` progress lines keep only their latest state, a line left incomplete for a second is
shown anyway (so progress is live), and each rank's output per cell is capped so a flood
cannot freeze the notebook; the cap is announced with a marker line. The cap bounds memory
too (Binder has 1-2 GB for everything): a line without a newline is cut into pieces, and
past the cap only a count and the last few lines (a dying rank's last words) are kept.
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
from kit.protocol import Reply

__all__ = ["LineSplitter", "CellResult", "print_line", "OUTPUT_CAP_BYTES", "IO_CAP_BYTES", "LINE_CAP"]

OUTPUT_CAP_BYTES = 256 << 10  # shown per rank per stream per cell; the rest is counted
IO_CAP_BYTES = OUTPUT_CAP_BYTES + (64 << 10)  # queued by the IO thread per rank, stream and cell; the rest dropped
LINE_CAP = 16 << 10  # a line longer than this (or without a newline) is shown in pieces of this size
TAIL_LINES, TAIL_LINE_CAP = 50, 2048  # kept past the cap: the last lines, each cut to this length
Emit = Callable[[int, str, str], None]


def print_line(rank: int, stream: str, text: str) -> None:
    """The default output sink: `[rank N] text`, or `[kit] text` for the kit's own notes (rank -1)."""
    out = sys.stderr if stream == "stderr" else sys.stdout
    out.write(("[kit] " if rank < 0 else f"[rank {rank}] ") + text + "\n")
    out.flush()


class LineSplitter:
    def __init__(self, emit: Emit, cap_bytes: int = OUTPUT_CAP_BYTES):
        self.emit, self.cap = emit, cap_bytes
        self._decoders: dict[tuple[int, str], Any] = {}
        self._partial: dict[tuple[int, str], tuple[str, float]] = {}
        self._shown: dict[tuple[int, str], int] = {}
        self._dropped: dict[tuple[int, str], int] = {}
        self._tail: dict[tuple[int, str], collections.deque[str]] = {}
        self.captured: dict[tuple[int, str], list[str]] = {}  # the shown lines; at close() also the tail

    def feed(self, rank: int, stream: str, data: bytes) -> None:
        key = (rank, stream)
        dec = self._decoders.setdefault(key, codecs.getincrementaldecoder("utf-8")("replace"))
        text = self._partial.pop(key, ("", 0.0))[0] + dec.decode(data)
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
        self._dropped[key] = self._dropped.get(key, 0) + nbytes

    def tail(self, key: tuple[int, str], n: int = 20) -> list[str]:
        """The last n lines seen on a stream, shown or not (a dead rank's last words)."""
        return (self.captured.get(key, [])[-n:] + list(self._tail.get(key, ())))[-n:]

    def flush_rank(self, rank: int) -> None:
        """Show a rank's pending partial lines now (before a display() from that rank)."""
        for key in [k for k in self._partial if k[0] == rank]:
            text, _ = self._partial.pop(key)
            if text:
                self._line(key, text)

    def tick(self, stale_s: float = 1.0) -> None:
        """Show lines that have waited for their newline too long (progress bars)."""
        now = time.monotonic()
        for key, (text, since) in list(self._partial.items()):
            if now - since >= stale_s and text:
                del self._partial[key]
                self._line(key, text)

    def _line(self, key: tuple[int, str], line: str) -> None:
        shown = self._shown.get(key, 0)
        if shown >= self.cap:  # counted, not kept: only a short tail survives
            self._dropped[key] = self._dropped.get(key, 0) + len(line) + 1
            self._tail.setdefault(key, collections.deque(maxlen=TAIL_LINES)).append(line[:TAIL_LINE_CAP])
            return
        if len(line) + 1 > self.cap - shown:  # the cap is exact: the part past it is counted
            self._dropped[key] = self._dropped.get(key, 0) + len(line) - (self.cap - shown - 1)
            line = line[:self.cap - shown - 1]
        self.captured.setdefault(key, []).append(line)
        self._shown[key] = shown + len(line) + 1
        self.emit(key[0], key[1], line)
        if self._shown[key] >= self.cap:
            self._truncated(key)

    def _truncated(self, key: tuple[int, str]) -> None:
        self.emit(key[0], key[1], f"[kit] output truncated after {self.cap >> 10} KiB on this stream; "
                                  "the rest is counted and not shown")

    def close(self) -> dict[tuple[int, str], int]:
        for key, (text, _) in list(self._partial.items()):
            if text:
                self._line(key, text)
        self._partial.clear()
        for key, n in self._dropped.items():
            self.emit(key[0], key[1], f"[kit] {n / 1024:.0f} KiB more {key[1]} not shown")
            tail = list(self._tail.pop(key, ()))
            self.captured.setdefault(key, []).append(f"[kit] {n / 1024:.0f} KiB more {key[1]} not kept; "
                                                      f"the last {len(tail)} line(s):")
            self.captured[key] += tail
        return dict(self._dropped)


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
            raise CellError(self.failures, self.notes)
        return self
