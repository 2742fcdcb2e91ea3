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
import pickle
import socket
import struct
import threading
from typing import Any

from kit.errors import AuthenticationError

__all__ = ["Channel", "FrameDecoder", "encode_frame", "KEY_BYTES", "MAX_FRAME_BYTES"]

KEY_BYTES = 32
MAX_FRAME_BYTES = 1 << 30  # 1 GiB: larger results are refused on the sending side
_HEADER = struct.Struct(">Q32s")  # payload length, HMAC digest


def _mac(key: bytes, direction: bytes, seq: int, payload: bytes) -> bytes:
    msg = direction + struct.pack(">Q", seq)
    h = hmac.new(key, msg, hashlib.sha256)
    h.update(payload)
    return h.digest()


def encode_frame(key: bytes, direction: bytes, seq: int, kind: str, body: Any) -> bytes:
    payload = pickle.dumps((kind, body), protocol=pickle.HIGHEST_PROTOCOL)
    if len(payload) > MAX_FRAME_BYTES:
        raise ValueError(f"frame of {len(payload) >> 20} MiB exceeds the {MAX_FRAME_BYTES >> 20} MiB limit")
    return _HEADER.pack(len(payload), _mac(key, direction, seq, payload)) + payload


class FrameDecoder:
    """Incremental decoder: feed bytes as they arrive, get verified (kind, body) frames."""

    def __init__(self, key: bytes, direction: bytes):
        self._key, self._direction = key, direction
        self._buf = bytearray()
        self._seq = 0

    def feed(self, data: bytes) -> list[tuple[str, Any]]:
        self._buf += data
        frames = []
        while len(self._buf) >= _HEADER.size:
            length, digest = _HEADER.unpack_from(self._buf)
            if length > MAX_FRAME_BYTES:
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
            frames.append(pickle.loads(payload))  # only after the signature matched
        return frames


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

    def fileno(self) -> int:
        return self.sock.fileno()

    def send(self, kind: str, body: Any = None) -> None:
        with self._send_lock:
            frame = encode_frame(self._key, self._out_dir, self._send_seq, kind, body)
            self._send_seq += 1
            self.sock.sendall(frame)

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
