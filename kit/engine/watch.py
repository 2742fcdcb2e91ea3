"""Kernel side: waiting on the ranks, and saying in plain words what went wrong.

`collect` gathers one request's replies, output and deaths; it explains a cell that is
stuck (who failed, who waits where: the checks in watch_checks.py), relays interrupts (first:
SIGINT to the ranks; second: every rank's stack; third: stop waiting) and a caller's Stop (its
`stop` event: a STOP_REQUEST frame to the ranks still running the request), and turns a dead
process into a message with the signal and its likely cause.
"""
from __future__ import annotations

import queue
import re
import threading
import time
from typing import Any, Callable

from kit.engine.output import CellResult, LineSplitter
from kit.engine.deaths import death_failure
from kit.engine.io import DROPPED, MARK, OUT, Event
from kit.engine.running import Running
from kit.engine.stuck import names
from kit.engine.watch_checks import WaitChecks
from kit.errors import RankFailure, StoppedWaiting, interrupted_note
from kit.messages import DIED, DISPLAY, DONE, PROTOCOL_ERROR, Reply

__all__ = ["collect", "Emit", "Display"]

Emit = Callable[[int, str, str], None]
Display = Callable[[int, dict[str, Any]], None]  # (rank, MIME bundle): a cell's display() as it happens
ERROR_CAP = 16 << 10  # characters of an error message or traceback kept per rank
STREAMS = {"stdout", "stderr"}  # a rank's output is complete when both carry the request's end marker
DRAIN_EVENTS = 512  # events handled per step before the checks run again (a flood must not starve them)


def _tail(splitter: LineSplitter, rank: int, n: int = 20) -> str:
    return "\n".join(splitter.tail((rank, "stderr"), n))


_RANK_CUT = re.compile(r"\[kit\] \.\.\. [\d,]+ characters of this [a-z ]+ cut[^\n]*")


def _cut(text: str, keep_end: bool = False) -> str:
    """An error message or traceback bounded like output (a 20 MB message must not reach the front end):
    messages keep their start and end, tracebacks their end (the line that raised). The rank caps its texts
    too; its note saying how much it cut is kept, so the user learns the real size."""
    if len(text) <= ERROR_CAP:
        return text
    found = _RANK_CUT.search(text)
    rank_note = found.group(0) + " " if found else ""
    note = f" [kit] ... {(len(text) - ERROR_CAP) / 1024:.0f} KiB of this text not shown ... "
    budget = ERROR_CAP - len(rank_note)
    if keep_end:
        return rank_note + note + text[-budget:]
    head = budget * 2 // 3
    return text[:head] + note + rank_note + text[-(budget - head):]


class _Collector:
    """One request's wait: replies, output and deaths in; notes about stuck ranks out (its `checks`);
    interrupts and Stop relayed."""

    def __init__(self, running: Running, rid: int, ranks: tuple[int, ...], splitter: LineSplitter, emit: Emit,
                 timeout_s: float | None, on_display: Display | None, stop: threading.Event | None = None):
        self.running, self.events, self.rid, self.ranks = running, running.io.events, rid, ranks
        self.splitter, self.emit, self.on_display = splitter, emit, on_display
        self.t0 = time.monotonic()
        self.result = CellResult(rid, ranks)
        self.checks = WaitChecks(running, self.result, self.note, self.t0, timeout_s)
        self.done: set[int] = set()
        self.dead: set[int] = set()
        self.marks: dict[int, set[str]] = {r: set() for r in ranks}  # the streams whose end marker came
        self.interrupts = 0
        self.done_s = 0.0  # when the last rank finished
        self.stop, self.stop_relayed = stop, False

    def busy(self) -> list[int]:
        return [r for r in self.ranks if r not in self.done and r not in self.dead]

    def note(self, text: str) -> None:
        self.emit(-1, "stderr", text)

    # -- the loop ------------------------------------------------------------------------------
    def run(self) -> CellResult:
        pending = 0  # interrupts not yet handled: one may land while the kit handles the previous one
        while True:
            try:  # Jupyter's interrupt can land on any line of the loop: its condition, the checks, on_interrupt
                if not self.waiting():
                    break
                if pending:
                    pending -= 1
                    if self.on_interrupt():
                        break
                else:
                    self.step()
                self.dead.update(self.checks.left_behind(self.busy()))
            except StoppedWaiting:
                raise
            except KeyboardInterrupt:
                pending += 1
        return self.finish()

    def waiting(self) -> bool:
        """Some rank neither died nor sent both its reply and every stream's end marker."""
        return any(not ((r in self.done and self.marks[r] >= STREAMS) or r in self.dead) for r in self.ranks)

    def step(self) -> None:
        try:
            ev = self.events.get(timeout=0.1)
        except queue.Empty:
            ev = None
        handled = 0  # what is already queued goes in before tick() shows a line's start as a line: its
        while ev is not None:  # rest may wait behind output that kept this thread busy (bounded: a flood
            self.handle(ev)    # must not starve the checks below)
            handled += 1
            ev = self._queued() if handled < DRAIN_EVENTS else None
        self.splitter.tick()
        busy = self.busy()
        if busy:
            self.relay_stop(busy)
            self.checks.check(time.monotonic(), busy, self.done, self.done_s)

    def relay_stop(self, busy: list[int]) -> None:
        """The caller's Stop, once, to the ranks still running this request. Sent from a helper thread:
        the user's Ctrl-C lands on this one, and must never cut a frame in half."""
        if self.stop is None or self.stop_relayed or not self.stop.is_set():
            return
        self.stop_relayed = True
        threading.Thread(target=self.running.stop_request, args=(self.rid, busy), name="kit-stop", daemon=True).start()

    def _queued(self) -> Event | None:
        try:
            return self.events.get_nowait()
        except queue.Empty:
            return None

    def finish(self) -> CellResult:
        result = self.result
        self.splitter.close()
        result.output = self.splitter.captured
        result.elapsed_s = time.monotonic() - self.t0
        result.interrupted = self.interrupts > 0 or self.checks.timed_out
        if self.interrupts and all(f.ename == "KeyboardInterrupt" for f in result.failures.values()):
            result.notes.append(interrupted_note(result.failures, self.ranks))
        return result

    # -- events ------------------------------------------------------------------------------------
    def handle(self, ev: Event) -> None:
        kind, rank, body = ev.kind, ev.rank, ev.body
        if kind == OUT:
            self.splitter.feed(rank, ev.stream, body)
        elif kind == DROPPED:
            self.splitter.count_dropped(rank, ev.stream, body)
        elif kind == MARK and body == self.rid and rank in self.marks:
            self.marks[rank].add(ev.stream)
        elif kind == DONE and body["id"] == self.rid:
            self.on_done(rank, body)
        elif kind == DISPLAY and body["id"] == self.rid:
            self.splitter.flush_rank(rank)  # text printed before display() comes first
            if self.on_display is not None:
                self.on_display(rank, body["bundle"])
            else:
                self.result.displays.append((rank, body["bundle"]))
        elif kind in (DIED, PROTOCOL_ERROR):
            self.on_death(rank, kind, body)

    def on_done(self, rank: int, body: Reply) -> None:
        result = self.result
        self.done.add(rank)
        self.done_s = time.monotonic()
        result.replies[rank] = body
        for text in body.get("notes") or ():  # the rank's own notes (a redirected fd 1): said once per cell
            if text not in result.notes:
                result.notes.append(text)
        e = body.get("error")
        if not e:
            return
        failure = result.failures[rank] = RankFailure(rank, e["ename"], _cut(e["evalue"]), _cut(e["traceback"], True),
                                                      e.get("line"), time_s=time.monotonic(), cell=e.get("cell"))
        self.checks.explain(rank, failure)

    def on_death(self, rank: int, kind: str, body: Any) -> None:
        running = self.running
        self.dead.add(rank)
        code = body if kind == DIED else None
        lost = running.lost_template(rank) if kind == DIED else None
        failure = death_failure(rank, code, _tail(self.splitter, rank), running.stopping, lost)
        if kind == PROTOCOL_ERROR:
            failure.evalue = f"its control channel failed authentication ({body})"
        if rank in self.ranks:
            self.result.failures.setdefault(rank, failure)
        if not running.stopping:
            running.mark_broken(running.death_reason(rank, code))
            # said as it happens; a rank of this cell's gets the whole of it once, in the cell's error below
            said = failure.evalue.split(". ", 1)[0] + "; the error below says what to do" \
                if rank in self.ranks and ". " in failure.evalue else failure.evalue
            self.note(f"rank {rank} died: {said}")
            if self.busy():  # the group lost a member: nothing the others do can complete
                self.checks.died(failure)  # the checks interrupt the survivors after DEATH_SIGINT_S

    def on_interrupt(self) -> bool:
        """One interrupt from the user; True: stop waiting now."""
        self.interrupts += 1
        busy = self.busy()
        if not busy:  # only the output markers are missing: do not wait for them
            self.note("stopped waiting for the ranks' last output; the cell had finished on every rank")
            return True
        if self.interrupts >= 3:
            self.running.abandoned = (self.rid, set(busy))  # the next request waits for them first (recover.py)
            raise StoppedWaiting(busy, self.rid)
        self.running.interrupt(busy)
        self.checks.interrupted()
        self.note(f"interrupt sent to rank(s) {names(busy)}")
        if self.interrupts == 2:
            for r, text in self.running.where(busy, timeout_s=1.0).items():
                self.note(f"--- rank {r} ---\n{text}")
        return False


def collect(running: Running, rid: int, ranks: tuple[int, ...], splitter: LineSplitter, emit: Emit,
            timeout_s: float | None, on_display: Display | None = None,
            stop: threading.Event | None = None) -> CellResult:
    """Wait for one request's replies and output on `ranks`, explaining and relaying as it goes."""
    return _Collector(running, rid, ranks, splitter, emit, timeout_s, on_display, stop).run()
