"""Signed frames on the private control socket between the kernel and one worker.

Whoever can send a frame runs code as the user, so every frame is authenticated:
HMAC-SHA256 over (direction, sequence number, payload) with a per-session 32-byte key.
The sequence number makes a replayed or reordered frame fail its check, and the
direction tag stops a frame from being reflected back. The payload is unpickled only
after the signature has been verified.
"""
from __future__ import annotations

import hashlib
import hmac
import io
import os
import pickle
import socket
import struct
import threading
import types
from typing import Any, TypedDict

from kit.errors import AuthenticationError

__all__ = ["Channel", "FrameDecoder", "encode_frame", "encode_frame_parts", "undecodable", "pickle_for_ranks",
           "size_hint", "KEY_BYTES", "MAX_FRAME_BYTES", "LIMIT_ENV", "frame_limit_bytes", "FrameTooBig", "seal",
           "unseal", "TO_TEMPLATE", "FROM_TEMPLATE", "SESSION_SLOT", "Reply", "ErrorInfo", "Packed",
           "REQUESTS", "EXEC", "CALL", "PUSH", "PUSH_COMMIT", "PULL", "RESET_PG", "WHERE", "RELEASE_GROUP", "VERDICT",
           "INTERRUPT", "SHUTDOWN", "WELCOME", "REFUSED", "HELLO", "READY", "START_FAILED", "DONE", "DISPLAY",
           "PROGRESS", "PREFLIGHT", "RELEASED", "OUTPUT", "DIED", "PROTOCOL_ERROR"]

# Frame kinds: each a plain string in the signed envelope, named once here.
# The kernel's requests; the rank's main thread serves each and answers with one DONE frame (a `Reply`).
EXEC, CALL, PUSH, PUSH_COMMIT, PULL, RESET_PG = "exec", "call", "push", "push_commit", "pull", "reset_pg"
REQUESTS = (EXEC, CALL, PUSH, PUSH_COMMIT, PULL, RESET_PG)
# Kernel -> rank, answered (or acted on) by the rank's control thread while a cell runs: WHERE is answered
# with a WHERE frame, RELEASE_GROUP with RELEASED; VERDICT is a pre-flight check's outcome.
WHERE, RELEASE_GROUP, VERDICT, INTERRUPT, SHUTDOWN = "where", "release_group", "verdict", "interrupt", "shutdown"
WELCOME, REFUSED = "welcome", "refused"  # to a rank attaching from torchrun: come in (the marker), or why not
# Rank -> kernel. Start-up: HELLO, then READY (in the group) or START_FAILED. While a request runs: DISPLAY
# (a display() bundle), PROGRESS (hooks.progress), PREFLIGHT (a collective about to be entered), OUTPUT (an
# attached rank's stdout/stderr bytes; a local rank's come on pipes), then DONE.
HELLO, READY, START_FAILED, DONE, DISPLAY = "hello", "ready", "start_failed", "done", "display"
PROGRESS, PREFLIGHT, RELEASED, OUTPUT = "progress", "preflight", "released", "output"
# Never sent: the kernel's IO thread reports a rank's death (body: its exit code) and a channel that failed
# authentication (body: why) as frames of these kinds, so every waiter reads one stream.
DIED, PROTOCOL_ERROR = "died", "protocol_error"


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
    undecodable: str  # the kernel could not unpickle the reply (kit.protocol._decode): why

KEY_BYTES = 32
MAX_FRAME_BYTES = 1 << 30  # 1 GiB by default: larger messages are refused on the sending side
LIMIT_ENV = "KIT_MAX_FRAME_MIB"  # raises it; read when a channel or a message is made (ranks: at start)


def frame_limit_bytes() -> int:
    """The largest message either end sends or accepts: KIT_MAX_FRAME_MIB (MiB), else 1 GiB."""
    try:
        mib = int(os.environ.get(LIMIT_ENV, ""))
    except ValueError:
        return MAX_FRAME_BYTES
    return mib << 20 if mib > 0 else MAX_FRAME_BYTES


class FrameTooBig(ValueError):
    """A message would pass the limit: raised while it is being built, before it grows past it."""

    def __init__(self, what: str, limit: int):
        self.limit_mib = limit >> 20
        super().__init__(f"{what} passes the {self.limit_mib} MiB limit of one message between the kernel and a "
                         f"rank (raise it with %env {LIMIT_ENV}=<MiB>, then %dist restart)")


class _Parts:
    """A write-only file for a Pickler: small writes are gathered, large ones (a pickled value's bytes)
    are kept by reference, never copied; stops with FrameTooBig as soon as the total passes `limit`."""

    def __init__(self, limit: int, what: str):
        self.parts: list[Any] = []
        self.small = bytearray()
        self.size, self.limit, self.what = 0, limit, what

    def write(self, data: Any) -> int:
        n = memoryview(data).nbytes
        self.size += n
        if self.size > self.limit:
            raise FrameTooBig(f"{self.what} ({self.size >> 20} MiB so far)", self.limit)
        if n < 1 << 16:
            self.small += data
        else:
            self.done()
            self.parts.append(data)
        return n

    def done(self) -> list[Any]:
        if self.small:
            self.parts.append(bytes(self.small))
            self.small = bytearray()
        return self.parts
_HEADER = struct.Struct(">Q32s")  # payload length, HMAC digest
# Inside the signed payload: the kind and the request id travel outside the pickled body, so a
# body that cannot be unpickled on arrival (a kernel-defined class a rank cannot import) is still
# a frame of a known kind answering a known request, reported as that request's error.
_ENVELOPE = struct.Struct(">Hq")  # kind length, request id (-1: none)


def _mac(key: bytes, direction: bytes, seq: int, payload: bytes) -> bytes:
    msg = direction + struct.pack(">Q", seq)
    h = hmac.new(key, msg, hashlib.sha256)
    h.update(payload)
    return h.digest()


# The rank template's packets (kit/engine/template.py <-> kit/rank/template.py): direction tags, and the
# room its environment keeps for a rank's KIT_SESSION value (written in place after each fork).
TO_TEMPLATE, FROM_TEMPLATE = b"kernel>template", b"template>kernel"
SESSION_SLOT = 64


def seal(key: bytes, direction: bytes, seq: int, data: bytes) -> bytes:
    """One signed packet (the rank template's JSON messages): the HMAC, then the data."""
    return _mac(key, direction, seq, data) + data


def unseal(key: bytes, direction: bytes, seq: int, packet: bytes) -> bytes:
    """The data of a packet made by `seal` with the same key, direction and sequence number."""
    if len(packet) < 32 or not hmac.compare_digest(packet[:32], _mac(key, direction, seq, packet[32:])):
        raise AuthenticationError("a template packet failed its signature check")
    return packet[32:]


def encode_frame_parts(key: bytes, direction: bytes, seq: int, kind: str, body: Any) -> list[Any]:
    """One signed frame as the pieces to send in order: a large bytes object in the body (a pushed
    value's pickle) is sent from where it is, not copied into the frame. Raises FrameTooBig while
    pickling, as soon as the frame passes the limit (nothing written yet: the channel stays in step)."""
    rid = body.get("id") if isinstance(body, dict) else None
    rid = rid if isinstance(rid, int) and not isinstance(rid, bool) and 0 <= rid < 2**63 else -1
    name = kind.encode()
    out = _Parts(frame_limit_bytes(), f"the {kind!r} message")
    out.write(_ENVELOPE.pack(len(name), rid) + name)
    pickle.Pickler(out, protocol=pickle.HIGHEST_PROTOCOL).dump(body)
    parts = out.done()
    h = hmac.new(key, direction + struct.pack(">Q", seq), hashlib.sha256)
    for part in parts:
        h.update(part)
    header = _HEADER.pack(out.size, h.digest())
    if parts and len(parts[0]) < 1 << 16:  # one send for a small frame (two would wait on Nagle's algorithm,
        return [header + parts[0], *parts[1:]]  # and a peer could see a later connection's frame first)
    return [header, *parts]


def encode_frame(key: bytes, direction: bytes, seq: int, kind: str, body: Any) -> bytes:
    """The frame as one bytes object (tests and small messages; Channel.send sends the parts)."""
    return b"".join(encode_frame_parts(key, direction, seq, kind, body))


class _RefusingPickler(pickle.Pickler):
    """Notes every function or class pickled by reference to the kernel's `__main__`: a rank's
    `__main__` is its own namespace, so such a reference fails there or, worse, finds a different
    object of the same name that a cell defined."""

    def __init__(self, file: Any) -> None:
        super().__init__(file, protocol=pickle.HIGHEST_PROTOCOL)
        self.from_main: list[str] = []

    def reducer_override(self, obj: Any) -> Any:
        if isinstance(obj, (type, types.FunctionType)) and getattr(obj, "__module__", None) == "__main__":
            self.from_main.append(getattr(obj, "__qualname__", "?"))
        return NotImplemented


def size_hint(value: Any) -> int:
    """Bytes a value's pickle will at least take, known without pickling it: arrays, tensors, bytes,
    and those one level inside a list, tuple or dict (so a refusal comes before any copy)."""
    def own(v: Any) -> int:
        if isinstance(v, (bytes, bytearray, memoryview)):
            return memoryview(v).nbytes
        n = getattr(v, "nbytes", None)  # numpy arrays, torch tensors
        if isinstance(n, int) and getattr(v, "device", None) is not None and str(v.device) == "meta":
            return 0
        return n if isinstance(n, int) and n >= 0 else 0
    inner = value.values() if isinstance(value, dict) else value if isinstance(value, (list, tuple)) else ()
    return own(value) + sum(own(v) for v in inner)


def pickle_for_ranks(name: str, value: Any) -> bytes:
    """Pickle one pushed value in the kernel, by value where possible; raise TypeError naming the
    object (and what to do) when the ranks could not rebuild it, FrameTooBig before any copy when it
    is over the message limit (from its size, or as soon as its pickle passes it)."""
    limit = frame_limit_bytes()
    hint = size_hint(value)
    if hint > limit:
        raise FrameTooBig(f"{name} ({-(-hint >> 20)} MiB)", limit)
    try:
        import cloudpickle  # optional: pickles notebook-defined functions and classes by value
    except ImportError:
        cloudpickle = None
    out = _Parts(limit, name)
    pickler: _RefusingPickler | None = None
    try:
        if cloudpickle is not None:
            cloudpickle.dump(value, out, protocol=pickle.HIGHEST_PROTOCOL)
        else:
            pickler = _RefusingPickler(out)
            pickler.dump(value)
    except FrameTooBig:
        raise
    except Exception as e:
        raise TypeError(f"cannot push {name!r}: it cannot be pickled ({type(e).__name__}: {e}). Create it on the "
                        f"ranks instead, in a %%distributed cell") from None
    if pickler is not None and pickler.from_main:
        what = ", ".join(dict.fromkeys(pickler.from_main))
        raise TypeError(f"cannot push {name!r}: it is or uses {what}, defined in the notebook's kernel, which the "
                        f"ranks cannot import. Define it in a %%distributed cell, or put it in a module the ranks "
                        f"can import (installing cloudpickle lets the kit send such functions by value)")
    return b"".join(out.done())  # the one copy: large parts are views of the value's own buffers


class FrameDecoder:
    """Incremental decoder: feed bytes as they arrive, get verified (kind, body) frames."""

    def __init__(self, key: bytes, direction: bytes):
        self._key, self._direction = key, direction
        self._buf = bytearray()
        self._seq = 0
        self._limit = frame_limit_bytes()

    def feed(self, data: bytes) -> list[tuple[str, Any]]:
        self._buf += data
        frames = []
        while len(self._buf) >= _HEADER.size:
            length, digest = _HEADER.unpack_from(self._buf)
            if length > self._limit:
                raise AuthenticationError("frame length out of range; closing the channel")
            end = _HEADER.size + length
            if len(self._buf) < end:
                break
            payload = bytes(self._buf[_HEADER.size:end])
            del self._buf[:end]
            expected = _mac(self._key, self._direction, self._seq, payload)
            if not hmac.compare_digest(digest, expected):
                raise AuthenticationError(
                    f"frame {self._seq} failed its HMAC check (wrong key, replay or tampering); closing the channel"
                )
            self._seq += 1
            frames.append(_decode(payload))  # only after the signature matched
        return frames


def undecodable(body: Any) -> str | None:
    """Why a received body could not be unpickled, or None for an ordinary body."""
    return body.get("undecodable") if isinstance(body, dict) else None


def _decode(payload: bytes) -> tuple[str, Any]:
    """(kind, body) of a verified payload. Never raises: a body that fails to unpickle becomes
    {"id", "undecodable", "error"}, so the receiver answers that request instead of dying."""
    view = memoryview(payload)
    try:
        n, rid = _ENVELOPE.unpack_from(view)
        kind = bytes(view[_ENVELOPE.size:_ENVELOPE.size + n]).decode()
    except (struct.error, UnicodeDecodeError) as e:
        n, rid, kind = 0, -1, "undecodable"
        why = f"malformed envelope ({type(e).__name__})"
    else:
        try:
            return kind, pickle.loads(view[_ENVELOPE.size + n:])
        except BaseException as e:  # anything unpickling can raise (AttributeError, ImportError, ...)
            why = f"{type(e).__name__}: {_safe(e)}"
    return kind, {"id": rid if rid >= 0 else None, "undecodable": why,
                  "error": {"ename": "DecodeError", "evalue": f"the {kind!r} message could not be unpickled on "
                            f"arrival ({why})", "traceback": "", "line": None}}


def _safe(e: BaseException) -> str:
    try:
        return str(e)[:2000]
    except Exception:
        return f"<{type(e).__name__} whose str() failed>"


class Channel:
    """One end of a signed, ordered, bidirectional channel over a connected socket.

    `send` is thread-safe; `recv` is meant for one reading thread.
    """

    def __init__(self, sock: socket.socket, key: bytes, *, is_kernel: bool):
        if len(key) != KEY_BYTES:
            raise ValueError("the session key must be 32 bytes")
        self.sock = sock
        self._key = key
        self._out_dir, in_dir = (b"k->w", b"w->k") if is_kernel else (b"w->k", b"k->w")
        self._decoder = FrameDecoder(key, in_dir)
        self._pending: list[tuple[str, Any]] = []
        self._send_seq = 0
        self._send_lock = threading.Lock()
        self._owner_pid = os.getpid()  # a forked child must never write here (it would desync the MACs)

    def fileno(self) -> int:
        return self.sock.fileno()

    def disown(self) -> None:
        """Called in a forked child: from now on `send` refuses instead of corrupting the channel."""
        self._owner_pid = -1

    def send(self, kind: str, body: Any = None) -> None:
        if os.getpid() != self._owner_pid:
            raise OSError(f"this process (pid {os.getpid()}) is a fork of the one that owns the kit's control "
                          f"channel; only that process may send on it")
        with self._send_lock:
            parts = encode_frame_parts(self._key, self._out_dir, self._send_seq, kind, body)
            self._send_seq += 1
            for part in parts:
                self.sock.sendall(part)

    def feed(self, data: bytes) -> list[tuple[str, Any]]:
        """Decode bytes read elsewhere (the kernel's IO thread reads the socket itself)."""
        return self._decoder.feed(data)

    def recv(self) -> tuple[str, Any]:
        """Block until one frame arrives. Raises EOFError when the peer closed."""
        while not self._pending:
            data = self.sock.recv(1 << 20)
            if not data:
                raise EOFError("control channel closed")
            self._pending.extend(self._decoder.feed(data))
        return self._pending.pop(0)

    def close(self) -> None:
        try:
            self.sock.close()
        except OSError:
            pass
