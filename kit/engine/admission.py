"""Kernel side: the attach listener's door. Every connection from its accept until its hello is proven.

The door may face a hostile network (`--host 0.0.0.0`): handshakes run side by side on one selector,
each with one deadline for the whole handshake (HANDSHAKE_TIMEOUT_S, hello included), at most MAX_PENDING
at once (when full, the host holding the most pending loses its oldest unproven one; a newcomer from that
same host only evicts one older than GRACE_S, else is refused and a kit rank connects again), so
connections that say nothing, trickle bytes or flood in never keep a real rank out nor stop the listener's
progress lines and timeout. Nothing is unpickled before the key is proven (kit.handshake). Whether a
proven hello may join (world size, rank free) is the listener's decision (kit.engine.attach); the door
only carries it out. Refusals are coalesced per host and in total (kit.engine.refusals).
"""
from __future__ import annotations

import collections
import errno
import selectors
import socket
import threading
import time
from dataclasses import dataclass, field
from typing import Any, Callable

from kit.engine.refusals import REFUSED_KEPT, Emit, Refusals
from kit.errors import AuthenticationError, ConfigError
from kit.handshake import ANSWER_BYTES, HANDSHAKE_TIMEOUT_S, server_greeting, server_verify
from kit.messages import REFUSED
from kit.protocol import Channel

__all__ = ["Admission", "Hello", "keepalive", "MAX_PENDING", "GRACE_S", "HELLO_MAX_BYTES"]

MAX_PENDING = 128  # unauthenticated connections handshaking at once (a real rank's handshake takes milliseconds)
HELLO_MAX_BYTES = 1 << 16  # an authenticated peer's hello is a few hundred bytes
GRACE_S = 0.25  # a handshake this young is not evicted by a newcomer from its own host


def _listen(host: str, port: int) -> socket.socket:
    """The listening socket, or ConfigError in one line for an address it cannot be (IPv6, a typo)."""
    if ":" in host:
        raise ConfigError(f"--host {host!r}: the attach listener speaks IPv4 only (IPv6 is not supported); use "
                          f"this machine's IPv4 address, 0.0.0.0 (every interface) or 127.0.0.1")
    try:
        return socket.create_server((host, port), backlog=MAX_PENDING)
    except (OSError, ValueError, OverflowError) as e:
        if getattr(e, "errno", None) == errno.EADDRINUSE:
            raise ConfigError(f"--port {port} is in use on {host}; choose another --port (0: any free one)") from None
        why = getattr(e, "strerror", None) or str(e)
        raise ConfigError(f"--host {host!r} --port {port}: not an address this machine can listen on ({why}); use "
                          f"this machine's IPv4 address or name, 0.0.0.0 (every interface) or 127.0.0.1") from None


def keepalive(sock: socket.socket) -> None:
    """A node that vanishes (power, network) sends no FIN: TCP keepalive notices it in about 5 s, and it
    works while the rank's Python is busy (the OS answers the probes, not the interpreter)."""
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE, 1)
    for name, value in (("TCP_KEEPIDLE", 2), ("TCP_KEEPINTVL", 1), ("TCP_KEEPCNT", 3)):
        if hasattr(socket, name):
            sock.setsockopt(socket.IPPROTO_TCP, getattr(socket, name), value)
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)


@dataclass
class _Pending:
    """A connection in its handshake: the greeting is sent; the answer, then the hello, are awaited."""

    sock: socket.socket
    peer: tuple[str, int]
    nonce_s: bytes
    deadline: float
    buf: bytearray = field(default_factory=bytearray)
    chan: Channel | None = None  # once the key is proven: the hello comes on it
    hello_bytes: int = 0


@dataclass(frozen=True)
class Hello:
    """A connection that proved the key and sent its first frame: what the listener decides on."""

    sock: socket.socket  # blocking from the moment it is admitted: the kernel's IO thread reads it
    chan: Channel
    peer: tuple[str, int]
    kind: str  # HELLO from a kit rank; anything else is refused
    body: Any


# The listener's decision on a proven hello: None admits it (the door lets go of it), a reason refuses it.
Decide = Callable[[Hello], "str | None"]


class Admission:
    """The listening socket and the handshakes in progress on it, with the flood rules above."""

    def __init__(self, key: bytes, host: str, port: int):
        self._key = key
        self.sock = _listen(host, port)
        self.sock.setblocking(False)
        self.host, self.port = self.sock.getsockname()[:2]
        self.refusals = Refusals()
        self.came: collections.Counter[str] = collections.Counter()  # connections per host (REFUSED_KEPT hosts)
        self._pending: dict[socket.socket, _Pending] = {}
        self._by_host: collections.Counter[str] = collections.Counter()  # pending handshakes per host
        self._sel = selectors.DefaultSelector()  # epoll: no limit on descriptor numbers, unlike select()
        self._sel.register(self.sock, selectors.EVENT_READ)
        self._lock = threading.Lock()  # the listener's wait and its refusing thread never overlap; close from anywhere
        self.closed = False

    def step(self, emit: Emit, decide: Decide, wait_s: float) -> None:
        """Accept newcomers and advance every handshake that has bytes, never blocking on one peer."""
        with self._lock:
            if self.closed:
                return
            for key, _ in self._sel.select(wait_s):
                if key.fileobj is self.sock:
                    self._accept(emit)
                elif key.fileobj in self._pending:
                    self._advance(self._pending[key.fileobj], emit, decide)  # type: ignore[index]
            now = time.monotonic()
            for p in [p for p in self._pending.values() if p.deadline <= now]:
                stage = "its hello" if p.chan is not None else "the key's proof"
                self._refuse(p, f"no complete handshake within {HANDSHAKE_TIMEOUT_S:g} s (still waiting for {stage})",
                             emit)
            self.refusals.flush(emit, now)

    def _accept(self, emit: Emit) -> None:
        for _ in range(MAX_PENDING):  # what is queued now; the rest on the next step
            try:
                sock, addr = self.sock.accept()
            except OSError:  # BlockingIOError: none left; others: that connection is already gone
                return
            host = addr[0]
            if len(self.came) < REFUSED_KEPT or host in self.came:
                self.came[host] += 1
            if len(self._pending) >= MAX_PENDING and not self._make_room(host, emit):
                sock.close()
                self.refusals.add(addr[:2], f"{MAX_PENDING} handshakes were in progress, all from this host and "
                                            f"younger than {GRACE_S:g} s; a kit rank connects again", emit)
                continue
            greeting, nonce_s = server_greeting()
            try:
                sock.setblocking(False)
                keepalive(sock)
                sock.send(greeting)  # a fresh socket's buffer takes these few bytes whole
            except OSError as e:
                sock.close()
                self.refusals.add(addr[:2], f"the connection failed at once ({e})", emit)
                continue
            self._pending[sock] = _Pending(sock, addr[:2], nonce_s, time.monotonic() + HANDSHAKE_TIMEOUT_S)
            self._by_host[host] += 1
            self._sel.register(sock, selectors.EVENT_READ)

    def _make_room(self, host: str, emit: Emit) -> bool:
        """The table is full: the host holding the most pending handshakes loses its oldest one whose key is
        not proven yet, so a flood from one host never evicts another host's rank. A newcomer from that
        same host evicts only a handshake older than GRACE_S (a rank's takes milliseconds); else it is
        refused itself, and a kit rank connects again (kit.rank.attach)."""
        flood_host, _ = self._by_host.most_common(1)[0]
        same = host == flood_host or self._by_host[host] >= self._by_host[flood_host]
        unproven = [p for p in self._pending.values() if p.peer[0] == flood_host and p.chan is None]
        if not unproven:
            return False
        oldest = min(unproven, key=lambda p: p.deadline)
        if same and oldest.deadline - HANDSHAKE_TIMEOUT_S > time.monotonic() - GRACE_S:
            return False
        self._refuse(oldest, f"{MAX_PENDING} connections were handshaking at once, {self._by_host[flood_host]} "
                             f"of them from {flood_host}; its oldest was dropped", emit)
        return True

    def _advance(self, p: _Pending, emit: Emit, decide: Decide) -> None:
        try:
            data = p.sock.recv(HELLO_MAX_BYTES)
        except BlockingIOError:
            return
        except OSError as e:
            return self._refuse(p, f"the connection failed during the handshake ({e})", emit)
        if not data:
            return self._refuse(p, "it closed the connection during the handshake", emit)
        try:
            if p.chan is None:
                p.buf += data
                if len(p.buf) < ANSWER_BYTES:
                    return
                reply, session = server_verify(self._key, p.nonce_s, bytes(p.buf[:ANSWER_BYTES]))
                p.sock.send(reply)
                if session is None:
                    return self._refuse(p, "wrong key (or not a kit rank)", emit)
                p.chan, data = Channel(p.sock, session, is_kernel=True), bytes(p.buf[ANSWER_BYTES:])
            p.hello_bytes += len(data)
            if p.hello_bytes > HELLO_MAX_BYTES:
                return self._refuse(p, f"its hello was over {HELLO_MAX_BYTES} bytes", emit)
            frames = p.chan.feed(data) if data else []
        except (AuthenticationError, OSError) as e:
            return self._refuse(p, str(e), emit)
        if frames:
            self._decide(p, Hello(p.sock, p.chan, p.peer, *frames[0]), emit, decide)

    def _decide(self, p: _Pending, hello: Hello, emit: Emit, decide: Decide) -> None:
        why = decide(hello)
        if why:
            try:
                hello.chan.send(REFUSED, {"reason": why})
            except OSError:
                pass
            return self._refuse(p, why, emit)
        self._forget(p)
        p.sock.setblocking(True)  # from now on the kernel's IO thread reads it

    def _forget(self, p: _Pending) -> None:
        if self._pending.pop(p.sock, None) is not None:
            self._by_host[p.peer[0]] -= 1
            if self._by_host[p.peer[0]] <= 0:
                del self._by_host[p.peer[0]]
        try:
            self._sel.unregister(p.sock)
        except (KeyError, ValueError):
            pass

    def _refuse(self, p: _Pending, why: str, emit: Emit) -> None:
        self._forget(p)
        p.sock.close()
        self.refusals.add(p.peer, why, emit)

    def close(self) -> None:
        self.closed = True
        with self._lock:
            for p in list(self._pending.values()):
                self._forget(p)
                p.sock.close()
            self._sel.close()
            self.sock.close()
