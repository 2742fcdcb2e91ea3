"""Kernel side: waiting on the ranks, and saying in plain words what went wrong.

`collect` gathers one request's replies, output and deaths; it explains a cell that is
stuck (who failed, who waits where), relays interrupts (first: SIGINT to the ranks;
second: every rank's stack; third: stop waiting), and turns a dead process into a
message with the signal and its likely cause.
"""
from __future__ import annotations

import os
import queue
import re
import signal
import time
from typing import Any, Callable, Protocol

from kit.config import LaunchConfig
from kit.engine.launcher import WorkerProcess
from kit.engine.output import CellResult, LineSplitter
from kit.engine.preflight import Preflight
from kit.errors import RankFailure, WorkerStartError


class Cluster(Protocol):
    """What waiting needs from kit.engine.cluster.Cluster (a Protocol, so this module never imports it)."""

    config: LaunchConfig
    state: str
    _workers: list[WorkerProcess]
    _stale: tuple[int, set[int]] | None
    _stopping: bool
    _preflight: Preflight | None
    _on_display: Callable[[int, dict[str, Any]], None] | None

    @property
    def world_size(self) -> int: ...
    def where(self, ranks: Any = None, timeout_s: float = 2.0) -> dict[int, str]: ...
    def _mark_broken(self, reason: str) -> None: ...
    def _ready(self) -> Any: ...
    def _new_id(self) -> int: ...
    def _next_pg_prefix(self) -> str: ...
    def _send(self, rank: int, kind: str, body: Any) -> None: ...

__all__ = ["collect", "wait_ready", "drain_stale", "soft_reset", "describe_exit", "death_failure", "rss_mib"]

Emit = Callable[[int, str, str], None]
_CAUSES = {
    "SIGKILL": "Most often the machine ran out of memory and the OS killed the biggest process (unless the code "
               "killed it itself); try a smaller batch or model, fewer ranks, or bf16",
    "SIGSEGV": "A crash in native code (torch, gloo, CUDA or ctypes); the stderr tail below shows the Python line "
               "that was running",
    "SIGABRT": "An abort in native code: a gloo collective mismatch ('EnforceNotMet'), an NCCL watchdog "
               "timeout, or an uncaught C++ exception",
    "SIGTERM": "Something outside the kit terminated it",
    "SIGBUS": "Often /dev/shm is too small for the tensors being shared",
}
HANG_GRACE_S = 2.0  # a failure elsewhere, then this long with ranks still busy: say who waits where
INTERRUPT_GRACE_S = 0.5  # after an interrupt, ranks still busy this long are explained
_FAULT_LINE = re.compile(r'File "<cell \d+>", line (\d+)')


def describe_exit(code: int | None) -> str:
    if code is None:
        return "exited"
    if code < 0:
        try:
            name = signal.Signals(-code).name
        except ValueError:
            name = f"signal {-code}"
        return f"was killed by {name} (signal {-code})"
    return f"exited with code {code}"


def death_failure(rank: int, code: int | None, tail: str, stopping: bool) -> RankFailure:
    if stopping:
        return RankFailure(rank, "Shutdown", "the ranks were shut down while this ran", died=True, time_s=time.monotonic())
    name = signal.Signals(-code).name if code is not None and code < 0 and -code in signal.valid_signals() else ""
    cause = _CAUSES.get(name, "")
    text = f"the process {describe_exit(code)}. {cause + '. ' if cause else ''}Its variables are lost; " \
           f"run `%dist restart` (or Cluster.restart()) for fresh ranks."
    lines = _FAULT_LINE.findall(tail)  # faulthandler's dump names the cell line of a native crash
    return RankFailure(rank, "WorkerDied", text, traceback=("----- stderr tail -----\n" + tail) if tail else "",
                       line=int(lines[-1]) if lines else None, died=True, time_s=time.monotonic())


def rss_mib(pid: int) -> float | None:
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) / 1024
    except OSError:
        return None
    return None


def _signal(cluster: Cluster, ranks: list[int], sig: int) -> None:
    for w in cluster._workers:
        if w.rank in ranks and w.proc.poll() is None:
            try:
                os.kill(w.pid, sig)  # our own child, by pid
            except ProcessLookupError:
                pass


def _tail(splitter: LineSplitter, rank: int, n: int = 20) -> str:
    return "\n".join(splitter.captured.get((rank, "stderr"), [])[-n:])


def _stuck_report(cluster: Cluster, running: list[int], interrupted: bool = False) -> list[str]:
    report = cluster.where(running, timeout_s=1.0)
    lines = [f"rank {r} is {text.splitlines()[0]}" for r, text in report.items()]
    if any(text.startswith("blocked inside") for text in report.values()):
        lines.append(f"gloo cannot be interrupted inside a collective: it raises when the process-group timeout "
                     f"({cluster.config.pg_timeout_s:g} s, counted from when the rank entered) expires; then the "
                     f"kit re-creates the group and keeps your variables. Interrupt again to see every rank's stack, "
                     f"a third time to stop waiting (the next cell then waits for the ranks first).")
    elif interrupted:
        lines.append("the interrupt has not landed yet (C code may be running); interrupt again to see every "
                     "rank's stack, a third time to stop waiting.")
    else:
        lines.append("Press interrupt to stop the cell on every rank (variables are kept); `%dist where` shows "
                     "every rank's stack.")
    return lines


def collect(cluster: Cluster, events: "queue.Queue[tuple[Any, ...]]", rid: int, ranks: tuple[int, ...],
            splitter: LineSplitter, emit: Emit, timeout_s: float | None) -> CellResult:
    t0 = time.monotonic()
    result = CellResult(rid, ranks)
    done: set[int] = set()
    dead: set[int] = set()
    marks: dict[int, set[str]] = {r: set() for r in ranks}
    interrupts, interrupted_s, explained, hang_noted, timed_out = 0, 0.0, False, False, False
    done_s = checked_s = 0.0  # when the last rank finished; when we last asked who waits where

    def running() -> list[int]:
        return [r for r in ranks if r not in done and r not in dead]

    def note(text: str) -> None:
        emit(-1, "stderr", text)

    def step() -> None:
        nonlocal interrupted_s, explained, hang_noted, timed_out, checked_s
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
        if timeout_s is not None and not timed_out and busy and now - t0 > timeout_s:
            timed_out = True
            result.notes.append(f"[kit] the cell ran past its --timeout of {timeout_s:g} s, so the kit interrupted it.")
            note(f"timeout: {timeout_s:g} s passed; interrupting rank(s) {', '.join(map(str, busy))}")
            _signal(cluster, busy, signal.SIGINT)
            interrupted_s, explained = now, False

    def handle(ev: tuple[Any, ...]) -> None:
        kind, rank = ev[0], ev[1]
        if kind == "out":
            splitter.feed(rank, ev[2], ev[3])
        elif kind == "mark" and ev[3] == rid and rank in marks:
            marks[rank].add(ev[2])
        elif kind == "frame" and ev[2] == "done" and ev[3]["id"] == rid:
            body = ev[3]
            nonlocal done_s
            done.add(rank)
            done_s = time.monotonic()
            result.replies[rank] = body
            if body.get("error"):
                e = body["error"]
                result.failures[rank] = RankFailure(rank, e["ename"], e["evalue"], e["traceback"], e.get("line"),
                                                    time_s=time.monotonic())
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

    while any(not ((r in done and len(marks[r]) == 2) or r in dead) for r in ranks):
        try:
            step()
        except KeyboardInterrupt:  # Jupyter's interrupt can land anywhere in the loop
            interrupts += 1
            busy = running()
            if interrupts >= 3 or not busy:
                if busy:
                    cluster._stale = (rid, set(busy))
                    note(f"stopped waiting; rank(s) {', '.join(map(str, busy))} are still busy. The next cell waits "
                         f"for them first; `%dist restart` starts fresh ranks instead.")
                raise
            _signal(cluster, busy, signal.SIGINT)
            interrupted_s, explained = time.monotonic(), False
            note(f"interrupt sent to rank(s) {', '.join(map(str, busy))}")
            if interrupts == 2:
                for r, text in cluster.where(busy, timeout_s=1.0).items():
                    note(f"--- rank {r} ---\n{text}")
    splitter.close()
    result.output = splitter.captured
    result.elapsed_s = time.monotonic() - t0
    result.interrupted = interrupts > 0 or timed_out
    if interrupts and all(f.ename == "KeyboardInterrupt" for f in result.failures.values()):
        result.notes.append("[kit] interrupted at your request; every rank and its variables are kept.")
    return result


def wait_ready(events: "queue.Queue[tuple[Any, ...]]", world_size: int, timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    ready: set[int] = set()
    tails: dict[int, list[str]] = {}
    while len(ready) < world_size:
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            late = sorted(set(range(world_size)) - ready)
            raise WorkerStartError(
                f"rank(s) {late} did not join the process group within {timeout_s:g} s. The machine may be "
                f"overloaded (importing torch takes a few seconds per rank), or a rank is stuck in rendezvous. "
                f"Raise start_timeout_s, or use fewer ranks. Nothing was left running.\n" + _tails(tails))
        try:
            ev = events.get(timeout=min(0.2, remaining))
        except queue.Empty:
            continue
        kind, rank = ev[0], ev[1]
        if kind == "out":
            tails.setdefault(rank, []).extend(ev[3].decode("utf-8", "replace").splitlines()[-40:])
        elif kind == "frame" and ev[2] == "ready":
            ready.add(rank)
        elif kind == "frame" and ev[2] in ("start_failed", "died", "protocol_error"):
            time.sleep(0.2)  # let the last stderr lines arrive
            while not events.empty():
                extra = events.get_nowait()
                if extra[0] == "out":
                    tails.setdefault(extra[1], []).extend(extra[3].decode("utf-8", "replace").splitlines()[-40:])
            detail = ev[3]["traceback"] if ev[2] == "start_failed" else f"the process {describe_exit(ev[3])}"
            last = detail.strip().splitlines()[-1] if detail.strip() else "unknown error"
            hint = " Is torch installed in this Python? (pip install torch)" if "No module named 'torch'" in detail else ""
            raise WorkerStartError(f"rank {rank} failed to start: {last}.{hint} Nothing was left running.\n"
                                   f"{detail}\n" + _tails(tails))


def _tails(tails: dict[int, list[str]]) -> str:
    return "\n".join(f"----- rank {r} output (last lines) -----\n" + "\n".join(lines[-20:])
                     for r, lines in sorted(tails.items()) if lines)


def drain_stale(cluster: Cluster, events: "queue.Queue[tuple[Any, ...]]", emit: Emit) -> None:
    """Before a new request: wait for ranks still busy with an abandoned one."""
    assert cluster._stale is not None
    rid, waiting = cluster._stale
    limit_s = cluster.config.pg_timeout_s + 15
    emit(-1, "stderr", f"waiting up to {limit_s:.0f} s for rank(s) {sorted(waiting)} to finish the interrupted cell")
    deadline, suspect = time.monotonic() + limit_s, False
    while waiting and time.monotonic() < deadline:
        try:
            ev = events.get(timeout=0.2)
        except queue.Empty:
            continue
        if ev[0] == "out":
            emit(ev[1], ev[2], ev[3].decode("utf-8", "replace").rstrip("\n"))
        elif ev[0] == "frame" and ev[2] == "done" and ev[3]["id"] == rid:
            waiting.discard(ev[1])
            suspect = suspect or bool(ev[3].get("suspect"))
        elif ev[0] == "frame" and ev[2] == "died":
            cluster._mark_broken(f"rank {ev[1]} {describe_exit(ev[3])}")
            break
    cluster._stale = None
    if waiting and cluster.state == "ready":
        cluster._mark_broken(f"rank(s) {sorted(waiting)} never finished an interrupted cell")
    if cluster.state == "ready" and suspect:
        soft_reset(cluster, events, None)
    if cluster.state != "ready":
        cluster._ready()  # raises ClusterStateError with the fix


def soft_reset(cluster: Cluster, events: "queue.Queue[tuple[Any, ...]]", result: CellResult | None,
               why: str = "failed") -> None:
    """Re-create the process group on a fresh store prefix; every rank keeps its Python state."""
    everyone = tuple(range(cluster.world_size))
    rid, prefix = cluster._new_id(), cluster._next_pg_prefix()
    assert cluster._preflight is not None
    cluster._preflight.begin(rid, frozenset(everyone))
    for r in everyone:
        cluster._send(r, "reset_pg", {"id": rid, "prefix": prefix, "check": False})
    res = collect(cluster, events, rid, everyone, LineSplitter(lambda *a: None), lambda *a: None, None)
    if res.ok and why == "destroyed":
        text = ("[kit] the cell called destroy_process_group(), so the kit re-created the default group for the "
                "next cells (`dist` works as before). Objects built on the old group (DDP models) must be rebuilt.")
    elif res.ok:
        text = ("[kit] a collective failed, so the kit re-created the process group (destroy + init on a fresh "
                "store prefix). Your variables are kept; objects built on the old group (DDP models, subgroups) "
                "must be rebuilt.")
    else:
        cluster._mark_broken("the process group could not be re-created after a collective failed")
        text = f"[kit] re-creating the process group failed: {next(iter(res.failures.values())).summary()}"
    if result is not None:
        result.notes.append(text)
