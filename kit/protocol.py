"""Signed frames on the private control socket between the kernel and one worker.

Whoever can send a frame runs code as the user, so every frame is authenticated:
HMAC-SHA256 over (direction, sequence number, payload) with a per-session 32-byte key.
The sequence number makes a replayed or reordered frame fail its check, and the
direction tag stops a frame from being reflected back. The payload is unpickled only
after the signature has been verified.

What the frames say (their kinds and typed bodies) is kit.messages; what fits in one and how a value is
pickled for it, kit.payload.
"""
from __future__ import annotations

import hashlib
import hmac
import os
import pickle
import socket
import struct
import threading
from typing import Any

from kit.errors import AuthenticationError
from kit.payload import Parts, frame_limit_bytes

__all__ = ["Channel", "FrameDecoder", "encode_frame", "encode_frame_parts", "KEY_BYTES", "seal", "unseal",
           "TO_TEMPLATE", "FROM_TEMPLATE", "SESSION_SLOT", "TEMPLATE_REQUEST_LIMIT_BYTES"]

KEY_BYTES = 32

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
# room its environment keeps for a rank's KIT_SESSION value (written in place after each fork), and the largest
# fork request (its environment, JSON) the kernel sends and the template reads.
TO_TEMPLATE, FROM_TEMPLATE = b"kernel>template", b"template>kernel"
SESSION_SLOT = 64
TEMPLATE_REQUEST_LIMIT_BYTES = 64 << 20  # in a memfd; exec caps an environment near 2 MiB, so never reached in practice


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
    out = Parts(frame_limit_bytes(), f"the {kind!r} message")
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
