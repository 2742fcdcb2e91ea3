"""Kernel side: waiting on the ranks, and saying in plain words what went wrong.

`collect` gathers one request's replies, output and deaths; it explains a cell that is
stuck (who failed, who waits where), relays interrupts (first: SIGINT to the ranks;
second: every rank's stack; third: stop waiting), and turns a dead process into a
message with the signal and its likely cause.
"""
from __future__ import annotations

import queue
import re
import time
from typing import Any, Callable, Iterable, Protocol

from kit.config import LaunchConfig
from kit.engine.output import CellResult, LineSplitter
from kit.engine.deaths import death_failure, describe_exit
from kit.engine.preflight import Preflight
from kit.errors import RankFailure, StoppedWaiting


class Cluster(Protocol):
    """What waiting needs from kit.engine.cluster.Cluster (a Protocol, so this module never imports it)."""

    config: LaunchConfig
    state: str
    _stale: tuple[int, set[int]] | None
    _stopping: bool
    _preflight: Preflight | None
    _on_display: Callable[[int, dict[str, Any]], None] | None

    @property
    def world_size(self) -> int: ...
    def where(self, ranks: Any = None, timeout_s: float = 2.0) -> dict[int, str]: ...
    def _where_reports(self, ranks: Any = None, timeout_s: float = 2.0) -> dict[int, dict[str, Any]]: ...
    def _interrupt(self, ranks: Iterable[int]) -> None: ...
    def _exit_code(self, rank: int) -> int | str | None: ...
    def _mark_broken(self, reason: str) -> None: ...
    def _ready(self) -> Any: ...
    def _new_id(self) -> int: ...
    def _next_pg_prefix(self) -> str: ...
    def _send(self, rank: int, kind: str, body: Any) -> None: ...

__all__ = ["collect"]

Emit = Callable[[int, str, str], None]
HANG_GRACE_S = 2.0  # a failure elsewhere, then this long with ranks still busy: say who waits where
INTERRUPT_GRACE_S = 0.5  # after an interrupt, ranks still busy this long are explained
ERROR_CAP = 16 << 10  # characters of an error message or traceback kept per rank
DEATH_SIGINT_S = 0.3  # a rank died: survivors still busy this long later get SIGINT
DEATH_GRACE_S = 1.3  # ... and ranks still busy this long after the death are left behind (the group is broken)



def _tail(splitter: LineSplitter, rank: int, n: int = 20) -> str:
    return "\n".join(splitter.tail((rank, "stderr"), n))


def _stuck_report(cluster: Cluster, running: list[int], interrupted: bool = False) -> list[str]:
    reports = cluster._where_reports(running, timeout_s=1.0)
    report = {r: a["text"] for r, a in reports.items()}
    lines = [f"rank {r} is {text.splitlines()[0]}" for r, text in report.items()]
    if any(text.startswith("blocked inside") for text in report.values()):
        lines.append(f"gloo cannot be interrupted inside a collective: it raises when the process-group timeout "
                     f"({cluster.config.pg_timeout_s:g} s, counted from when the rank entered) expires; then the "
                     f"kit re-creates the group and keeps your variables. Interrupt again to see every rank's stack, "
                     f"a third time to stop waiting (the next cell then waits for the ranks first).")
    elif interrupted:
        # Each rank that answers says who handles SIGINT on it now, so "ignores" is a fact, not a guess. A rank
        # that answers with the kit's handler runs Python (the interpreter hands the GIL over every few ms), so
        # the interrupt was delivered and the cell caught it. No answer means C code holds the GIL: the
        # interrupt lands when that call returns.
        python = [r for r, text in report.items() if text.startswith("running ")]
        ignoring = [r for r in python if reports[r]["sigint"] == "ignored"]
        own = [r for r in python if reports[r]["sigint"] in ("user", "default")]
        catching = [r for r in python if r not in ignoring and r not in own]
        in_c = [r for r, text in report.items() if text.startswith("no answer")]
        after = ("Interrupt again to see every rank's stack; a third time to stop waiting. Only `%dist restart` "
                 "ends such a cell (variables are lost); the kit restores its handler after the cell.")
        if ignoring:
            lines.append(f"rank(s) {_names(ignoring)} ignore SIGINT: the cell called signal.signal(SIGINT, SIG_IGN). "
                         + after)
        if own:
            lines.append(f"rank(s) {_names(own)} run Python with the cell's own SIGINT handler "
                         f"(signal.signal(SIGINT, ...)), which did not stop the cell. " + after)
        if catching:
            lines.append(f"rank(s) {_names(catching)} run Python but did not stop: the cell catches the interrupt "
                         f"(`except KeyboardInterrupt`, or a bare `except:` in a loop). Interrupt again to see every "
                         f"rank's stack; a third time to stop waiting. Only `%dist restart` ends such a cell "
                         f"(variables are lost).")
        if in_c:
            lines.append(f"rank(s) {_names(in_c)} do not answer: C code holds the GIL, and the interrupt lands when "
                         f"that call returns. Interrupt again to see every rank's stack, a third time to stop waiting.")
        if not python and not in_c:
            lines.append("the interrupt has not landed yet; interrupt again to see every rank's stack, a third time "
                         "to stop waiting.")
    else:
        lines.append("Press interrupt to stop the cell on every rank (variables are kept); `%dist where` shows "
                     "every rank's stack.")
    return lines


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


def _names(ranks: Iterable[int]) -> str:
    return ", ".join(map(str, sorted(ranks)))


def collect(cluster: Cluster, events: "queue.Queue[tuple[Any, ...]]", rid: int, ranks: tuple[int, ...],
            splitter: LineSplitter, emit: Emit, timeout_s: float | None) -> CellResult:
    t0 = time.monotonic()
    result = CellResult(rid, ranks)
    done: set[int] = set()
    dead: set[int] = set()
    marks: dict[int, set[str]] = {r: set() for r in ranks}
    interrupts, interrupted_s, explained, hang_noted, timed_out = 0, 0.0, False, False, False
    done_s = checked_s = 0.0  # when the last rank finished; when we last asked who waits where
    death: RankFailure | None = None  # the first death while others still ran: the root cause
    after_death: set[int] = set()  # the survivors the kit interrupted because of it

    def running() -> list[int]:
        return [r for r in ranks if r not in done and r not in dead]

    def note(text: str) -> None:
        emit(-1, "stderr", text)

    def step() -> None:
        nonlocal interrupted_s, explained, hang_noted, timed_out, checked_s, after_death
        try:
            ev = events.get(timeout=0.1)
        except queue.Empty:
            ev = None
        if ev is not None:
            handle(ev)
        splitter.tick()
        now = time.monotonic()
        busy = running()
        if interrupted_s and not explained and busy and now - interrupted_s > INTERRUPT_GRACE_S:
            explained = True
            for line in _stuck_report(cluster, busy, interrupted=True):
                note(line)
        failed_s = min((f.time_s for f in result.failures.values()), default=None)
        if failed_s and not hang_noted and busy and now - failed_s > HANG_GRACE_S and not interrupted_s:
            hang_noted = True
            first = min(result.failures.values(), key=lambda f: f.time_s)
            stuck = _stuck_report(cluster, busy)
            note(first.summary() + "; " + "; ".join(stuck[:-1]))
            note(stuck[-1])
        finished = [r for r in done if r not in result.failures]
        if finished and busy and not hang_noted and not interrupted_s and now - max(done_s, checked_s) > HANG_GRACE_S:
            checked_s = now  # a rank that finished while others sit in a collective: a skipped collective
            report = cluster.where(busy, timeout_s=1.0)
            blocked = {r: t.splitlines()[0] for r, t in report.items() if t.startswith(("blocked inside", "waiting at"))}
            if blocked:
                hang_noted = True
                note(f"rank(s) {', '.join(map(str, finished))} finished the cell; " + "; ".join(
                    f"rank {r} is {t}" for r, t in blocked.items()) + ". A collective that only some ranks call "
                    "can never complete.")
                note(_stuck_report(cluster, busy)[-1])
        if death is not None and not after_death and busy and now - death.time_s > DEATH_SIGINT_S:
            # Ranks blocked in gloo learn of the death by themselves within milliseconds (connection reset);
            # the short delay spares them a SIGINT landing while they report that error.
            after_death = set(busy)
            note(f"interrupting rank(s) {_names(busy)} because rank {death.rank} died; the cell ends now")
            cluster._interrupt(busy)
        if timeout_s is not None and not timed_out and busy and now - t0 > timeout_s:
            timed_out = True
            result.notes.append(f"[kit] the cell ran past its --timeout of {timeout_s:g} s, so the kit interrupted it.")
            note(f"timeout: {timeout_s:g} s passed; interrupting rank(s) {', '.join(map(str, busy))}")
            cluster._interrupt(busy)
            interrupted_s, explained = now, False

    def handle(ev: tuple[Any, ...]) -> None:
        nonlocal death
        kind, rank = ev[0], ev[1]
        if kind == "out":
            splitter.feed(rank, ev[2], ev[3])
        elif kind == "dropped":
            splitter.count_dropped(rank, ev[2], ev[3])
        elif kind == "mark" and ev[3] == rid and rank in marks:
            marks[rank].add(ev[2])
        elif kind == "frame" and ev[2] == "done" and ev[3]["id"] == rid:
            body = ev[3]
            nonlocal done_s
            done.add(rank)
            done_s = time.monotonic()
            result.replies[rank] = body
            for text in body.get("notes") or ():  # the rank's own notes (a redirected fd 1): said once per cell
                if text not in result.notes:
                    result.notes.append(text)
            if body.get("error"):
                e = body["error"]
                result.failures[rank] = RankFailure(rank, e["ename"], _cut(e["evalue"]), _cut(e["traceback"], True),
                                                    e.get("line"), time_s=time.monotonic(), cell=e.get("cell"))
                if death is not None and rank in after_death and e["ename"] == "KeyboardInterrupt":
                    result.failures[rank].evalue = (f"interrupted by the kit because rank {death.rank} died (a "
                                                    f"consequence, not a cause); run `%dist restart` for fresh ranks")
        elif kind == "frame" and ev[2] == "display" and ev[3]["id"] == rid:
            splitter.flush_rank(rank)  # text printed before display() comes first
            if cluster._on_display is not None:
                cluster._on_display(rank, ev[3]["bundle"])
            else:
                result.displays.append((rank, ev[3]["bundle"]))
        elif kind == "frame" and ev[2] in ("died", "protocol_error"):
            dead.add(rank)
            code = ev[3] if ev[2] == "died" else None
            failure = death_failure(rank, code, _tail(splitter, rank), cluster._stopping)
            if ev[2] == "protocol_error":
                failure.evalue = f"its control channel failed authentication ({ev[3]})"
            if rank in ranks:
                result.failures.setdefault(rank, failure)
            if not cluster._stopping:
                cluster._mark_broken(f"rank {rank} {describe_exit(code)}")
                note(f"rank {rank} died: {failure.evalue}")
                survivors = running()
                if survivors and death is None:  # the group lost a member: nothing the others do can complete
                    death = failure  # step() interrupts the survivors after DEATH_SIGINT_S

    def on_interrupt() -> bool:
        """One interrupt from the user; True: stop waiting now."""
        nonlocal interrupts, interrupted_s, explained
        interrupts += 1
        busy = running()
        if not busy:  # only the output markers are missing: do not wait for them
            note("stopped waiting for the ranks' last output; the cell had finished on every rank")
            return True
        if interrupts >= 3:
            cluster._stale = (rid, set(busy))
            raise StoppedWaiting(busy, rid)
        cluster._interrupt(busy)
        interrupted_s, explained = time.monotonic(), False
        note(f"interrupt sent to rank(s) {_names(busy)}")
        if interrupts == 2:
            for r, text in cluster.where(busy, timeout_s=1.0).items():
                note(f"--- rank {r} ---\n{text}")
        return False

    pending = 0  # interrupts not yet handled: one may land while the kit handles the previous one
    while any(not ((r in done and len(marks[r]) == 2) or r in dead) for r in ranks):
        try:
            if pending:
                pending -= 1
                if on_interrupt():
                    break
            else:
                step()
        except StoppedWaiting:
            raise
        except KeyboardInterrupt:  # Jupyter's interrupt can land anywhere, also inside on_interrupt
            pending += 1
        if death is not None and time.monotonic() - death.time_s > DEATH_GRACE_S and running():
            now = time.monotonic()
            for r in running():  # it ignored the interrupt: the cell ends without it (the group is broken anyway)
                result.failures[r] = RankFailure(
                    r, "StillRunning", f"interrupted by the kit because rank {death.rank} died, but it ignored the "
                    f"interrupt and still runs, so the kit stopped waiting for it (a consequence, not a cause). Run "
                    f"`%dist restart` for fresh ranks.", time_s=now)
                dead.add(r)
    splitter.close()
    result.output = splitter.captured
    result.elapsed_s = time.monotonic() - t0
    result.interrupted = interrupts > 0 or timed_out
    if interrupts and all(f.ename == "KeyboardInterrupt" for f in result.failures.values()):
        result.notes.append("[kit] interrupted at your request; every rank and its variables are kept.")
    return result
