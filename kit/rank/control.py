"""Rank side: the control thread. It reads every frame the kernel sends, while the main thread
runs a cell: pre-flight verdicts, interrupts for attached ranks, `where` questions, closing the
group's connections for a peer stuck in a collective, a request's Stop; requests go on to the main thread's queue.
"""
from __future__ import annotations

import queue
import signal
import time
from typing import Any, Callable

from kit.errors import AuthenticationError
from kit.messages import INTERRUPT, RELEASE_GROUP, RELEASED, REQUESTS, STOP_REQUEST, VERDICT, WHERE, undecodable
from kit.protocol import Channel
from kit.rank import peers, stop_request
from kit.rank.ledger import Ledger
from kit.rank.process import Interrupts, exit_now
from kit.rank.reply import safe_str
from kit.rank.streams import Streams
from kit.rank.where import innermost, where_text

__all__ = ["ControlThread"]


class ControlThread:
    """What the control thread reads and answers for one rank (kit.rank.worker.Worker, which serves the
    requests it queues on the main thread)."""

    def __init__(self, chan: Channel, rank: int, streams: Streams, ledger: Ledger, interrupts: Interrupts,
                 requests: "queue.Queue[tuple[str, Any]]", main_ident: int, busy: Callable[[], str | None],
                 group_sockets: Callable[[], dict[int, str]]):
        self.chan, self.rank, self.streams, self.ledger, self.interrupts = chan, rank, streams, ledger, interrupts
        self.requests, self.main_ident = requests, main_ident
        self.busy = busy  # what the main thread is serving now ("running In [7]"), None when idle
        self.group_sockets = group_sockets  # the process group's connections now (kit.rank.peers)

    def loop(self) -> None:
        """Runs on a daemon thread: reads every frame the kernel sends.

        Only a closed channel (the kernel is gone) or a failed signature (tampering) ends the
        rank from here; anything else that goes wrong with one frame is reported and the loop
        goes on, because the rank's state belongs to the user.
        """
        while True:
            try:
                kind, body = self.chan.recv()
            except (EOFError, OSError, AuthenticationError):
                exit_now()  # kernel gone or channel tampered with: never linger
            except BaseException as e:  # noqa: B036 - a decoder bug must not cost the rank its state
                self.streams.note(f"[kit] rank {self.rank}: a control frame could not be read ({type(e).__name__}: "
                                  f"{safe_str(e)[:300]}); it was dropped")
                continue
            try:
                self._on_frame(kind, body)
            except BaseException as e:  # noqa: B036
                self.streams.note(f"[kit] rank {self.rank}: could not handle a {kind!r} frame "
                                  f"({type(e).__name__}: {safe_str(e)[:300]})")

    def _on_frame(self, kind: str, body: Any) -> None:
        rid = body.get("id") if isinstance(body, dict) else None
        if undecodable(body) is not None and kind not in REQUESTS:
            self.streams.note(f"[kit] rank {self.rank}: dropped a {kind!r} frame: {undecodable(body)}")
            if kind == WHERE and rid is not None:
                self.chan.send(WHERE, {"id": rid, "text": f"(could not read the request: {undecodable(body)})"})
        elif kind == VERDICT:
            self.ledger.deliver(body)
        elif kind == INTERRUPT:  # an attached rank: no signals across machines, so the kernel asks
            signal.pthread_kill(self.main_ident, signal.SIGINT)  # the main thread: a sleep there wakes too
        elif kind == STOP_REQUEST:  # Stop: the run loop ends at its next step boundary
            if isinstance(rid, int) and not isinstance(rid, bool):
                stop_request.ask(rid)
            else:
                self.streams.note(f"[kit] rank {self.rank}: dropped a stop without a request id ({rid!r})")
        elif kind == RELEASE_GROUP:
            self.chan.send(RELEASED, {"id": rid, "text": self.release_group()})
        elif kind == WHERE:
            try:
                text = self.where()
            except BaseException as e:  # noqa: B036
                text = f"(where failed on this rank: {type(e).__name__}: {safe_str(e)[:300]})"
            self.chan.send(WHERE, {"id": rid, "text": text, "sigint": self.interrupts.describe(),
                                     "cpu_s": time.process_time(), "innermost": innermost(self.main_ident),
                                     "sigints": self.interrupts.handled})
        elif kind in REQUESTS and rid is None:
            self.streams.note(f"[kit] rank {self.rank}: dropped a {kind!r} request without an id")
        else:
            self.requests.put((kind, body))  # undecodable requests too: answered with their error

    def release_group(self) -> str:
        """A peer waits in a collective this rank finished the cell without calling: shutting down this
        rank's gloo connections makes the peer's collective raise at once instead of at the timeout.
        Only while the main thread is idle (this runs on the control thread); the kernel re-creates the
        group on every rank afterwards. Returns what was done, in words."""
        if self.busy() is not None or not self.requests.empty():
            return "busy: left the group as it is"
        return f"closed {peers.close_connections(self.group_sockets())} connection(s)"

    def where(self) -> str:
        return where_text(self.main_ident, self.ledger, self.busy(), self.requests.empty())
