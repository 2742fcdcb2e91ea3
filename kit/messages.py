"""What the kernel and a rank say to each other: every frame kind, named once, and the typed bodies.

Pure vocabulary (no sockets, no signing, no pickling): kit.protocol carries these frames, signed;
kit.rank.requests maps each request kind to what the rank does; the kernel's engine reads the replies.
"""
from __future__ import annotations

import re
from typing import Any, TypedDict

__all__ = ["PROTOCOL", "Reply", "ErrorInfo", "Packed", "undecodable",
           "REQUESTS", "EXEC", "CALL", "PUSH", "PUSH_COMMIT", "PULL", "RESET_PG", "WHERE", "RELEASE_GROUP", "VERDICT",
           "INTERRUPT", "STOP_REQUEST", "SHUTDOWN", "WELCOME", "REFUSED", "HELLO", "READY", "START_FAILED", "DONE",
           "DISPLAY", "PROGRESS", "PREFLIGHT", "RELEASED", "OUTPUT", "DIED", "PROTOCOL_ERROR",
           "FORK", "FORKED", "FORK_REFUSED", "RANK_EXITED", "TEMPLATE_READY",
           "not_defined", "names_not_defined"]

# The frames' meaning, versioned: a rank attaching from torchrun on another machine may run another install of
# the kit, so its hello carries this number and the kernel refuses a different one (kit.engine.attach) instead
# of each side guessing at the other's frames. Raise it when a frame's kind or body changes.
PROTOCOL = 3

# Frame kinds: each a plain string in the signed envelope, named once here.
# The kernel's requests; the rank's main thread serves each and answers with one DONE frame (a `Reply`).
EXEC, CALL, PUSH, PUSH_COMMIT, PULL, RESET_PG = "exec", "call", "push", "push_commit", "pull", "reset_pg"
REQUESTS = (EXEC, CALL, PUSH, PUSH_COMMIT, PULL, RESET_PG)
# Kernel -> rank, answered (or acted on) by the rank's control thread while a cell runs: WHERE is answered
# with a WHERE frame, RELEASE_GROUP with RELEASED; VERDICT is a pre-flight check's outcome; STOP_REQUEST
# {"id": request id} asks that request to end at its next step boundary (kit.rank.stop_request; Stop).
WHERE, RELEASE_GROUP, VERDICT, INTERRUPT, SHUTDOWN = "where", "release_group", "verdict", "interrupt", "shutdown"
STOP_REQUEST = "stop_request"
WELCOME, REFUSED = "welcome", "refused"  # to a rank attaching from torchrun: come in (the marker), or why not
# Rank -> kernel. Start-up: HELLO, then READY (in the group) or START_FAILED. While a request runs: DISPLAY
# (a display() bundle), PROGRESS (hooks.progress), PREFLIGHT (a collective about to be entered), OUTPUT (an
# attached rank's stdout/stderr bytes; a local rank's come on pipes), then DONE.
HELLO, READY, START_FAILED, DONE, DISPLAY = "hello", "ready", "start_failed", "done", "display"
PROGRESS, PREFLIGHT, RELEASED, OUTPUT = "progress", "preflight", "released", "output"
# Never sent: the kernel's IO thread reports a rank's death (body: its exit code) and a channel that failed
# authentication (body: why) as frames of these kinds, so every waiter reads one stream.
DIED, PROTOCOL_ERROR = "died", "protocol_error"

# Kernel <-> its rank template (kit.rank.template; kit.protocol's TO_TEMPLATE/FROM_TEMPLATE, a socket of their
# own): each message's "op". The kernel asks FORK; the template answers FORKED or FORK_REFUSED (body "why"),
# says TEMPLATE_READY once it has preloaded, and RANK_EXITED (pid, code) when a rank it forked ends.
# FORK_REFUSED/TEMPLATE_READY reuse REFUSED/READY's words: on the template's own socket, never among rank frames
FORK, FORKED, FORK_REFUSED, RANK_EXITED, TEMPLATE_READY = "fork", "forked", "refused", "exited", "ready"


class ErrorInfo(TypedDict):
    """A failed request's error, as the rank saw it (kit.rank.reply.error_info)."""

    ename: str  # the exception's type name
    evalue: str  # its message, capped
    traceback: str  # capped, the end kept
    line: int | None  # the cell's line that raised
    cell: str | None  # the cell's label ("In [7]")


class Packed(TypedDict, total=False):
    """A value as it travels to the kernel (kit.rank.cell.pack_value): always its repr; its pickle when it
    can travel (else None, and `note` says why); its HTML when it has one; a pull's one per name in `items`."""

    repr: str
    pickle: bytes | None
    note: str | None
    html: str
    items: dict[str, "Packed"]


class Reply(TypedDict, total=False):
    """The body of a DONE frame: one rank's answer to one request (built in kit.rank.worker.Worker.handle;
    kit.rank.reply.stripped/bare when the full one cannot be sent)."""

    id: int  # the request's id
    ok: bool
    value: Packed | None  # the cell's last value or the call's return value (None: nothing to show)
    error: ErrorInfo | None
    figures: list[bytes]  # PNGs of the figures the cell left open
    notes: list[str]  # the rank's own notes about this request (a redirected fd 1, a replaced SIGINT handler)
    suspect: bool  # a collective failed on this rank: the process group must be re-created
    pg_gone: bool  # the cell destroyed the default process group
    undecodable: str  # the kernel could not unpickle the reply (kit.protocol, on arrival): why


def undecodable(body: Any) -> str | None:
    """Why a received body could not be unpickled, or None for an ordinary body."""
    return body.get("undecodable") if isinstance(body, dict) else None


# A pull naming a variable the rank does not have: the rank raises NameError with this text (so Cluster.pull
# raises the rank's CellError, as any failed request does), and `%dist pull` reads the names back from it to
# say so in one line. Both sides use these two, so the text and its reading change together.
_NOT_DEFINED = re.compile(r"name\(s\) (.*) not defined on rank \d+")


def not_defined(names: list[str], rank: int) -> str:
    return f"name(s) {', '.join(map(repr, names))} not defined on rank {rank}"


def names_not_defined(evalue: str, asked: list[str]) -> list[str] | None:
    """The asked names a rank's `not_defined` text lists, or None for any other text."""
    found = _NOT_DEFINED.fullmatch(evalue)
    if found is None:
        return None
    return [n for n in asked if repr(n) in found.group(1)]
