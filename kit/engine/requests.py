"""Kernel side: one request, apart from the Cluster's lifecycle: its arguments checked before anything
is sent, sending it to the chosen ranks and collecting their replies (then recovering a failed group),
and turning a pull's replies into kernel objects."""
from __future__ import annotations

import pickle
import threading
import time
from typing import Any, Callable, Iterable

from kit.engine.io import Event
from kit.engine.output import CellResult, LineSplitter
from kit.engine.recover import soft_reset
from kit.engine.running import Progress, Running
from kit.engine.watch import Display, collect
from kit.errors import ConfigError, RankFailure
from kit.messages import DIED

__all__ = ["check_run_args", "choose_ranks", "send_each", "send_and_collect", "unpack_pull"]

Emit = Callable[[int, str, str], None]


def check_run_args(code: object, timeout_s: object, check: object, label: object) -> None:
    """Refuse bad `Cluster.run` arguments, naming the value and the fix."""
    if not isinstance(code, str):
        raise ConfigError(f"code must be a string of Python source, got {type(code).__name__}")
    if timeout_s is not None and (isinstance(timeout_s, bool) or not isinstance(timeout_s, (int, float))
                                  or not timeout_s > 0):
        raise ConfigError(f"timeout_s={timeout_s!r} must be a positive number of seconds, or None (no limit)")
    if check is not None and not isinstance(check, bool):
        raise ConfigError(f"check={check!r} must be True, False or None (use the cluster's setting)")
    if label is not None and (not isinstance(label, str) or not label.strip() or any(c in label for c in '"<>\n')):
        raise ConfigError(f"label={label!r} must be a short one-line name for the cell, e.g. 'In [7]'")


def choose_ranks(ranks: Iterable[int] | None, world_size: int) -> tuple[int, ...]:
    """The sorted, de-duplicated ranks a request goes to (all by default)."""
    if ranks is None:
        return tuple(range(world_size))
    if not isinstance(ranks, (str, int)):
        ranks = list(ranks)
    if isinstance(ranks, (str, int)) or not all(isinstance(r, int) and not isinstance(r, bool) for r in ranks):
        raise ConfigError(f"ranks={ranks!r} must be a list of rank numbers, e.g. ranks=[0] or ranks=[0, 1]")
    chosen = tuple(sorted(set(ranks)))
    bad = [r for r in chosen if not 0 <= r < world_size]
    if bad or not chosen:
        raise ConfigError(f"ranks {list(bad) or '[]'} not in 0..{world_size - 1}; "
                          f"choose from {list(range(world_size))}")
    return chosen


def unpack_pull(result: CellResult, names: list[str], emit: Emit) -> dict[int, dict[str, Any]]:
    """{rank: {name: value}} from a pull's replies; a value that cannot be rebuilt here is its repr, with a note."""
    out: dict[int, dict[str, Any]] = {}
    for r, rep in sorted(result.replies.items()):
        items = (rep.get("value") or {}).get("items") or {}
        out[r] = {}
        for n in names:
            packed = items.get(n) or {"repr": "", "pickle": None, "note": "nothing came back for it"}
            out[r][n], note = packed["repr"], packed.get("note")
            if packed.get("pickle") is not None:
                try:
                    out[r][n] = pickle.loads(packed["pickle"])
                except Exception as e:  # a class defined in a cell exists only on the ranks
                    note = f"it could not be rebuilt in the kernel ({type(e).__name__}: {e})"
            if note:
                emit(-1, "stderr", f"rank {r}: {n} pulled as its repr (a string): {note}")
    return out


def send_each(running: Running, chosen: tuple[int, ...], kind: str, body: dict[str, Any]) -> tuple[list[int], bool]:
    """Send one request to each chosen rank on a helper thread; return (the ranks that got it, interrupted).

    The kernel's KeyboardInterrupt lands on the main thread, never inside `sendall` here: half a frame
    would desynchronize the rank's channel and cost it its state. An interrupt stops the sending
    after the frame in flight; the caller tells the ranks that got it what to do."""
    sent: list[int] = []
    failed: list[BaseException] = []
    stop, finished, began, gate = threading.Event(), threading.Event(), threading.Event(), threading.Lock()

    def work() -> None:
        try:  # `finished` on every way out: the kernel waits for nothing else
            with gate:
                if stop.is_set():  # interrupted after start() returned, before this thread ran: it sends nothing
                    return
                began.set()
            for r in chosen:
                if stop.is_set():
                    return
                try:
                    running.send(r, kind, body)
                except OSError:  # it died a moment ago; the IO thread is about to report it
                    running.mark_broken(f"rank {r} is gone (its control channel closed)")
                    running.io.events.put(Event(DIED, r, None, running.exit_code(r)))
                except BaseException as e:  # noqa: B036 - encoding failed (a frame over the limit): the caller's
                    failed.append(e)
                    return
                else:
                    sent.append(r)
        finally:
            finished.set()

    interrupted = False
    try:
        threading.Thread(target=work, name="kit-send", daemon=True).start()
    except KeyboardInterrupt:  # in start()'s own wait the thread may already run, or may never
        interrupted = True
        with gate:
            stop.set()
            if not began.is_set():
                finished.set()  # it sends nothing, now or later
    while True:
        try:  # the wait and its test in one `try`: an interrupt may land on either
            if finished.wait(0.1):
                break
        except KeyboardInterrupt:
            interrupted = True
            stop.set()
    if failed and not sent:
        raise failed[0]
    return sent, interrupted


def send_and_collect(running: Running, kind: str, body: dict[str, Any], chosen: tuple[int, ...], emit: Emit,
                     timeout_s: float | None, check: bool | None, on_progress: Progress | None = None,
                     on_display: Display | None = None, stop: threading.Event | None = None) -> CellResult:
    """Send one request to `chosen` (the caller holds the request lock) and wait for every reply. A rank
    whose reply says the process group failed or was destroyed gets the group re-created afterwards.
    `stop` set while waiting: the ranks still running it are asked to stop it (watch.collect).
    Interrupted while sending: the ranks that got it are interrupted too and the result says which ones
    never got it (`result.unsent`)."""
    rid = running.new_id()
    check = running.config.check_collectives if check is None else check
    running.preflight.begin(rid, frozenset(chosen))
    running.on_progress = on_progress  # before sending: a rank may report at once
    try:
        sent, interrupted = send_each(running, chosen, kind, dict(body, id=rid, check=check))
        unsent = tuple(r for r in chosen if r not in sent)
        for r in unsent:  # nobody may wait at a collective for a rank that never got the cell
            running.preflight.rank_ended(r, "never got the request (interrupted while sending)")
        if interrupted and sent:
            running.interrupt(sent)
        result = collect(running, rid, tuple(r for r in chosen if r in sent or not interrupted), LineSplitter(emit),
                         emit, timeout_s, on_display, stop)
    finally:
        running.on_progress = None
    result.interrupted = result.interrupted or interrupted
    if interrupted:
        result.unsent = unsent
        for r in unsent:
            result.failures[r] = RankFailure(r, "KeyboardInterrupt", "interrupted while the kernel was sending the "
                                             "request: it never reached this rank", time_s=time.monotonic())
    # The kit closed group connections to end a wait: whatever the waiting rank raised then (the interrupt, or
    # gloo's "Connection closed by peer", which marks it suspect: the order depends on timing) is that act's
    # consequence, so the note says so, not "a collective failed".
    if result.group_closed and running.ready:
        soft_reset(running, result, why="released")
    elif any(rep.get("suspect") for rep in result.replies.values()) and running.ready:
        soft_reset(running, result)
    elif any(rep.get("pg_gone") for rep in result.replies.values()) and running.ready:
        soft_reset(running, result, why="destroyed")
    return result
