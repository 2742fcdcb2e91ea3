"""Kernel side: one thread that reads every worker's control socket, stdout and stderr.

It decodes signed frames, answers pre-flight checks at once (so ranks never wait on the
kernel's main thread), splits output at the per-request markers, and notices a worker's
death the moment its pipes close. Everything else goes to `events` for `Cluster.run`.

Output is bounded here, before it can pile up in the queue: per rank, stream and cell at most
IO_CAP_BYTES are queued; the rest is counted (a "dropped" event at the cell's end marker or at
end of file) and only its last few KiB are kept, for a dying rank's last words.
"""
from __future__ import annotations

import os
import queue
import selectors
import threading
import time
from typing import Any, Callable, NamedTuple

from kit.engine.launcher import WorkerProcess
from kit.engine.attach import AttachedRank
from kit.engine.output import IO_CAP_BYTES
from kit.messages import DIED, OUTPUT, PROTOCOL_ERROR
from kit.protocol import Channel

__all__ = ["IOThread", "Event", "DISCONNECTED", "OUT", "DROPPED", "MARK"]

DISCONNECTED = "disconnected"  # the "exit code" of an attached rank whose connection closed
# What a rank's output pipes give (the other events are its frames, of kit.messages' kinds):
OUT, DROPPED, MARK = "out", "dropped", "mark"


class Event(NamedTuple):
    """One thing the IO thread saw, queued in the order it saw it.

    kind OUT: `body` is bytes the rank wrote on `stream`; DROPPED: `body` bytes of it were not queued (past
    the cap); MARK: `stream` holds all of request `body`'s output. Any other kind is a frame from the rank's
    control channel (kit.messages: DONE, DISPLAY, ...; DIED and PROTOCOL_ERROR from this thread itself), with
    `stream` None and `body` the frame's body."""

    kind: str
    rank: int
    stream: str | None
    body: Any

_TAIL_BYTES = 4096  # kept of the dropped output: a dying rank's last words


class IOThread(threading.Thread):
    def __init__(self, workers: list[WorkerProcess] | list[AttachedRank], channels: dict[int, Channel], marker: bytes,
                 on_frame: Callable[[int, str, Any], bool]):
        super().__init__(name="kit-io", daemon=True)
        self.events: queue.Queue[Event] = queue.Queue()
        self._workers = {w.rank: w for w in workers}
        self._channels = channels
        self._marker = marker
        self._on_frame = on_frame  # returns True when it consumed the frame
        self._sel = selectors.DefaultSelector()
        self._wake_r, self._wake_w = os.pipe()
        self._stopping = False
        self._pending: dict[tuple[int, str], bytes] = {}
        self._closed: dict[int, set[str]] = {r: set() for r in self._workers}
        self._socket_eof_s: dict[int, float] = {}
        self._reported_dead: set[int] = set()
        self._queued: dict[tuple[int, str], int] = {}  # bytes queued this cell, per rank and stream
        self._dropped: dict[tuple[int, str], tuple[int, bytes]] = {}  # bytes dropped, and their last few KiB
        self._sel.register(self._wake_r, selectors.EVENT_READ, ("wake", -1))
        for w in workers:
            self._sel.register(w.sock, selectors.EVENT_READ, ("sock", w.rank))
            if w.proc is None:  # attached: its output arrives as "output" frames on the socket
                self._closed[w.rank] |= {"stdout", "stderr"}
                continue
            assert w.proc.stdout is not None and w.proc.stderr is not None
            self._sel.register(w.proc.stdout, selectors.EVENT_READ, ("stdout", w.rank))
            self._sel.register(w.proc.stderr, selectors.EVENT_READ, ("stderr", w.rank))

    def dead(self) -> set[int]:
        """Ranks whose death (or lost connection) was reported."""
        return set(self._reported_dead)

    def stop(self) -> None:
        self._stopping = True
        try:
            os.write(self._wake_w, b"x")
        except OSError:
            pass

    def run(self) -> None:
        try:
            while not self._stopping:
                for key, _ in self._sel.select(timeout=0.1):
                    what, rank = key.data
                    if what == "wake":
                        continue
                    self._read(key.fileobj, what, rank)
                self._check_deaths()
        finally:
            # Stopped while some deaths were not yet reported (the pipes were closed at shutdown):
            # report them now, or a request waiting in another thread would wait forever.
            for rank, w in self._workers.items():
                gone = w.proc is None or w.proc.poll() is not None  # attached: the kernel is letting it go
                if rank not in self._reported_dead and gone:
                    self._reported_dead.add(rank)
                    code = DISCONNECTED if w.proc is None else w.proc.returncode
                    if not self._on_frame(rank, DIED, code):
                        self.events.put(Event(DIED, rank, None, code))
            self._sel.close()
            for fd in (self._wake_r, self._wake_w):
                try:
                    os.close(fd)
                except OSError:
                    pass

    def _read(self, fileobj: Any, what: str, rank: int) -> None:
        try:
            data = fileobj.recv(1 << 20) if what == "sock" else os.read(fileobj.fileno(), 1 << 16)
        except (OSError, ValueError):  # ValueError: a pipe closed under us at teardown
            data = b""
        if not data:
            self._sel.unregister(fileobj)
            self._closed[rank].add(what)
            if what == "sock":
                self._socket_eof_s[rank] = time.monotonic()
            else:
                self._flush_partial(rank, what)
            return
        if what == "sock":
            try:
                frames = self._channels[rank].feed(data)
            except Exception as e:  # a frame that fails authentication ends that channel
                self.events.put(Event(PROTOCOL_ERROR, rank, None, str(e)))
                self._sel.unregister(fileobj)
                self._closed[rank].add("sock")
                self._socket_eof_s[rank] = time.monotonic()
                return
            for kind, body in frames:
                if kind == OUTPUT and isinstance(body, dict) and self._workers[rank].proc is None:
                    stream, data = body.get("stream"), body.get("data")
                    if stream in ("stdout", "stderr") and isinstance(data, bytes):
                        self._split_output(rank, stream, self._pending.pop((rank, stream), b"") + data)
                    continue
                if kind in (OUT, DROPPED, MARK):  # not a frame kind any rank sends: it would pass for output
                    continue
                if not self._on_frame(rank, kind, body):
                    self.events.put(Event(kind, rank, None, body))
        else:
            self._split_output(rank, what, self._pending.pop((rank, what), b"") + data)

    def _split_output(self, rank: int, stream: str, buf: bytes) -> None:
        marker = self._marker
        while buf:
            i = buf.find(marker)
            if i < 0:
                j = buf.rfind(b"\x1b")  # keep a possible marker prefix for the next read
                if j >= 0 and marker.startswith(buf[j:]):
                    self._pending[(rank, stream)] = buf[j:]
                    buf = buf[:j]
                if buf:
                    self._out(rank, stream, buf)
                return
            end = buf.find(b"\n", i)
            if end < 0:
                if i:
                    self._out(rank, stream, buf[:i])
                self._pending[(rank, stream)] = buf[i:]
                return
            if i:
                self._out(rank, stream, buf[:i])
            self._end_of_cell(rank, stream)
            try:
                self.events.put(Event(MARK, rank, stream, int(buf[i + len(marker):end])))
            except ValueError:
                pass
            buf = buf[end + 1:]

    def _out(self, rank: int, stream: str, data: bytes) -> None:
        key = (rank, stream)
        room = IO_CAP_BYTES - self._queued.get(key, 0)
        if room > 0:
            self.events.put(Event(OUT, rank, stream, data[:room]))
            self._queued[key] = self._queued.get(key, 0) + min(room, len(data))
            data = data[room:]
        if data:
            n, tail = self._dropped.get(key, (0, b""))
            self._dropped[key] = (n + len(data), (tail + data)[-_TAIL_BYTES:])

    def _end_of_cell(self, rank: int, stream: str) -> None:
        """The cell's output is complete: say how much was dropped, pass on its last words, reset the budget."""
        key = (rank, stream)
        self._queued.pop(key, None)
        n, tail = self._dropped.pop(key, (0, b""))
        if n:
            self.events.put(Event(DROPPED, rank, stream, n - len(tail)))
            self.events.put(Event(OUT, rank, stream, tail))  # past the shown cap: kept as the tail, not shown

    def _flush_partial(self, rank: int, stream: str) -> None:
        rest = self._pending.pop((rank, stream), b"")
        if rest:
            self._out(rank, stream, rest)
        self._end_of_cell(rank, stream)

    def _check_deaths(self) -> None:
        now = time.monotonic()
        for rank, eof_s in self._socket_eof_s.items():
            if rank in self._reported_dead:
                continue
            pipes_done = {"stdout", "stderr"} <= self._closed[rank]
            if not pipes_done and now - eof_s < 0.5:
                continue  # let the last words on stderr arrive first
            proc = self._workers[rank].proc
            if proc is None:  # attached: the connection is all we know of it
                for stream in ("stdout", "stderr"):
                    self._flush_partial(rank, stream)
                code: int | str | None = DISCONNECTED
            else:
                try:
                    code = proc.wait(timeout=1.0)
                except Exception:
                    code = None
            self._reported_dead.add(rank)
            if not self._on_frame(rank, DIED, code):
                self.events.put(Event(DIED, rank, None, code))
