"""Authenticating a TCP connection between the kernel and a rank started by torchrun, before anything
is unpickled; and the key file both sides read.

A socketpair needs no handshake (only the two processes hold it); a listener that other machines
reach does. Challenge-response with the shared key, both ways (as `multiprocessing.connection`
does): the kernel proves it holds the key too, because whoever talks to a rank runs code there.
Each connection then signs its frames (kit.protocol) with a fresh session key derived from both
nonces, so frames recorded on one connection fail their check on any other (no cross-connection
replay), and sequence numbers stop replays within it. Only fixed-size raw bytes are read here.
"""
from __future__ import annotations

import hashlib
import hmac
import os
import secrets
import socket
import stat

from kit.errors import AuthenticationError, ConfigError

__all__ = ["server_greeting", "server_verify", "client_handshake", "create_key_file", "read_key_file",
           "HANDSHAKE_TIMEOUT_S", "ANSWER_BYTES", "HandshakeDropped"]

_MAGIC = b"KIT-ATTACH-1\n"
_NONCE = 32
HANDSHAKE_TIMEOUT_S = 5.0  # the whole handshake, hello included: a peer that has not finished by then is dropped
ANSWER_BYTES = 2 * _NONCE
_REFUSAL_MAX = 512


def _mac(key: bytes, label: bytes, a: bytes, b: bytes) -> bytes:
    return hmac.new(key, label + a + b, hashlib.sha256).digest()


class HandshakeDropped(AuthenticationError):
    """The kernel closed the connection before the key was proven (its listener was full, as under a flood
    of connections): nothing was refused, so a rank connects again."""


def _recv_exact(sock: socket.socket, n: int) -> bytes:
    buf = b""
    while len(buf) < n:
        try:
            chunk = sock.recv(n - len(buf))
        except (ConnectionError, socket.timeout) as e:
            if isinstance(e, socket.timeout):
                raise
            raise HandshakeDropped(f"the peer reset the connection during the handshake ({e})") from None
        if not chunk:
            raise HandshakeDropped(f"the peer closed the connection during the handshake ({len(buf)}/{n} bytes)")
        buf += chunk
    return buf


def server_greeting() -> tuple[bytes, bytes]:
    """The kernel's first bytes on a new connection, and the nonce they carry."""
    nonce_s = secrets.token_bytes(_NONCE)
    return _MAGIC + nonce_s, nonce_s


def server_verify(key: bytes, nonce_s: bytes, answer: bytes) -> tuple[bytes, bytes | None]:
    """Check the peer's ANSWER_BYTES answer. Returns (the reply to send, the session key), the key None
    for a wrong key (the reply then tells the peer why, in plain text). The kernel reads the answer
    itself, without blocking, so one connection never holds up another (kit.engine.attach)."""
    nonce_c, proof = answer[:_NONCE], answer[_NONCE:]
    if not hmac.compare_digest(proof, _mac(key, b"rank", nonce_s, nonce_c)):
        return (b"R" + b"wrong key: this kernel uses a different key file (copy the kernel's key file to "
                       b"this node, mode 0600)\n"), None
    return b"A" + _mac(key, b"kernel", nonce_c, nonce_s), _mac(key, b"session", nonce_s, nonce_c)


def client_handshake(sock: socket.socket, key: bytes) -> bytes:
    """The rank's side. Returns the session key; raises AuthenticationError with the kernel's refusal."""
    sock.settimeout(HANDSHAKE_TIMEOUT_S * 2)
    try:
        hello = _recv_exact(sock, len(_MAGIC) + _NONCE)
        if not hello.startswith(_MAGIC):
            raise AuthenticationError("the other end is not a kit kernel (wrong HOST:PORT?)")
        nonce_s, nonce_c = hello[len(_MAGIC):], secrets.token_bytes(_NONCE)
        try:
            sock.sendall(nonce_c + _mac(key, b"rank", nonce_s, nonce_c))
        except ConnectionError as e:
            raise HandshakeDropped(f"the peer closed the connection during the handshake ({e})") from None
        status = _recv_exact(sock, 1)
        if status == b"R":
            reason = sock.recv(_REFUSAL_MAX).decode("utf-8", "replace").strip()
            raise AuthenticationError(f"the kernel refused this rank: {reason}")
        proof = _recv_exact(sock, 32)
    except socket.timeout:
        raise HandshakeDropped("the kernel did not finish the handshake in time") from None
    if status != b"A" or not hmac.compare_digest(proof, _mac(key, b"kernel", nonce_c, nonce_s)):
        raise AuthenticationError("the kernel did not prove it holds the key; not running its requests")
    sock.settimeout(None)
    return _mac(key, b"session", nonce_s, nonce_c)


def create_key_file(path: str) -> bytes:
    """The key in `path`: created 0600 (never wider, even for a moment) when missing; an existing file
    must be this user's and 0600. Returns the 32-byte key."""
    path = os.path.expanduser(path)
    os.makedirs(os.path.dirname(os.path.abspath(path)), mode=0o700, exist_ok=True)
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_NOFOLLOW", 0), 0o600)
    except FileExistsError:
        return read_key_file(path)
    with os.fdopen(fd, "w") as f:
        f.write(secrets.token_hex(32) + "\n")
    return read_key_file(path)


def read_key_file(path: str) -> bytes:
    """The key in `path`, refusing a file others could read or that is not this user's."""
    path = os.path.expanduser(path)
    try:
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0))
    except OSError as e:
        raise ConfigError(f"cannot read the key file {path} ({e.strerror}); copy the kernel's key file here "
                          f"(mode 0600)") from None
    with os.fdopen(fd) as f:
        st = os.fstat(f.fileno())
        if not stat.S_ISREG(st.st_mode) or st.st_uid != os.getuid():
            raise ConfigError(f"the key file {path} is not a regular file of yours; refusing it")
        if st.st_mode & 0o077:
            raise ConfigError(f"the key file {path} has mode {stat.S_IMODE(st.st_mode):o}: others could read the "
                              f"key. Run `chmod 600 {path}`")
        text = f.read().strip()
    try:
        key = bytes.fromhex(text)
    except ValueError:
        key = b""
    if len(key) != 32:
        raise ConfigError(f"the key file {path} does not hold a kit key (64 hex digits); copy the kernel's file")
    return key
