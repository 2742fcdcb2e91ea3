"""Kernel side: ranks that torchrun started (on this machine or others) attach to the notebook.

The kernel opens a TCP listener (loopback unless the user names an interface), prints the torchrun
command for each node, and waits for `world_size` ranks. Every connection is authenticated before
anything is unpickled (kit.handshake), then speaks the same signed frames as a local rank; output
comes as "output" frames instead of pipes. After the ranks are in, the listener keeps answering, so
an extra attacher hears why it was refused.

The listener may face a hostile network (`--host 0.0.0.0`): handshakes run side by side on one
selector, each with one deadline for the whole handshake (HANDSHAKE_TIMEOUT_S, hello included), at
most MAX_PENDING at once (the oldest is dropped for a newcomer), so connections that say nothing or
trickle bytes never keep a real rank out nor stop the progress lines and the timeout. Refusals from
one host are coalesced (kit.engine.refusals).
"""
from __future__ import annotations

import collections
import selectors
import shlex
import socket
import threading
import time
from dataclasses import dataclass, field
from typing import Any, Callable

from kit.engine.refusals import Refusals
from kit.errors import AuthenticationError, WorkerStartError
from kit.handshake import ANSWER_BYTES, HANDSHAKE_TIMEOUT_S, server_greeting, server_verify
from kit.protocol import HELLO, REFUSED, Channel

__all__ = ["AttachedRank", "Listener", "attach_command", "keepalive", "DEFAULT_KEY_FILE"]

DEFAULT_KEY_FILE = "~/.distributed-kit/attach.key"
Emit = Callable[[int, str, str], None]
PROGRESS_EVERY_S = 5.0
MAX_PENDING = 128  # unauthenticated connections handshaking at once (a real rank's handshake takes milliseconds)
HELLO_MAX_BYTES = 1 << 16  # an authenticated peer's hello is a few hundred bytes


def keepalive(sock: socket.socket) -> None:
    """A node that vanishes (power, network) sends no FIN: TCP keepalive notices it in about 5 s, and it
    works while the rank's Python is busy (the OS answers the probes, not the interpreter)."""
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE, 1)
    for name, value in (("TCP_KEEPIDLE", 2), ("TCP_KEEPINTVL", 1), ("TCP_KEEPCNT", 3)):
        if hasattr(socket, name):
            sock.setsockopt(socket.IPPROTO_TCP, getattr(socket, name), value)
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)


@dataclass
class AttachedRank:
    """An attached rank: what a WorkerProcess is for a local one, without a local process."""

    rank: int
    sock: socket.socket
    chan: Channel
    pid: int  # on its node
    node: str  # the node's host name, as the rank reported it
    peer: str  # the address it connected from
    proc: None = None  # no process of ours: stop and interrupt are messages
    started_s: float = field(default_factory=time.monotonic)


def attach_command(host: str, port: int, key_file: str, nnodes: int, nproc_per_node: int,
                   rdzv_endpoint: str = "NODE0_HOST:29400", extra: str = "") -> str:
    """The command to run on every node (the key file path, never the key)."""
    return (f"torchrun --nnodes {nnodes} --nproc-per-node {nproc_per_node} --max-restarts 0 "
            f"--rdzv-backend c10d --rdzv-endpoint {rdzv_endpoint} --rdzv-id kit-{port} {extra}"
            f"-m kit.rank.worker --attach {host}:{port} --key-file {shlex.quote(key_file)}")


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


class Listener:
    """The kernel's listening socket and the ranks that attached through it."""

    def __init__(self, world_size: int, key: bytes, host: str = "127.0.0.1", port: int = 0):
        self.world_size, self._key = world_size, key
        self.sock = socket.create_server((host, port), backlog=MAX_PENDING)
        self.sock.setblocking(False)
        self.host, self.port = self.sock.getsockname()[:2]
        self.ranks: dict[int, AttachedRank] = {}
        self._refusals = Refusals()
        self._pending: dict[socket.socket, _Pending] = {}
        self._sel = selectors.DefaultSelector()  # epoll: no limit on descriptor numbers, unlike select()
        self._sel.register(self.sock, selectors.EVENT_READ)
        self._lock = threading.Lock()  # wait() and the refusing thread never overlap; close() may come from anywhere
        self._closed = False
        self._thread: threading.Thread | None = None
        self.emit: Emit | None = None

    @property
    def refused(self) -> collections.deque[str]:
        """Why the last REFUSED_KEPT refused attachers were refused."""
        return self._refusals.kept

    @property
    def refused_total(self) -> int:
        return self._refusals.total

    def wait(self, timeout_s: float, emit: Emit, alive: Callable[[], str | None] = lambda: None) -> list[AttachedRank]:
        """Accept until every rank attached; `alive()` names a local launcher that already failed."""
        t0 = time.monotonic()
        said = t0
        while len(self.ranks) < self.world_size:
            now = time.monotonic()
            failed = alive()
            if failed:
                raise WorkerStartError(f"{failed}. {len(self.ranks)}/{self.world_size} ranks had attached. "
                                       f"Nothing was left running.")
            if now - t0 > timeout_s:
                self._refusals.flush(emit)
                raise WorkerStartError(
                    f"only {len(self.ranks)}/{self.world_size} ranks attached within {timeout_s:g} s (ranks "
                    f"{sorted(self.ranks) or 'none'} came). Check that torchrun runs on every node with the "
                    f"printed command, that the nodes can reach {self.host}:{self.port}, and that they have the "
                    f"key file. Raise the timeout for slow queues.")
            if now - said >= PROGRESS_EVERY_S:
                said = now
                emit(-1, "stderr", f"{len(self.ranks)}/{self.world_size} ranks attached ({now - t0:.0f} s)...")
            self._drop_vanished(emit)
            self._step(emit, full=False, wait_s=min(0.2, max(0.0, t0 + timeout_s - now)))
        self._refusals.flush(emit)
        return [self.ranks[r] for r in sorted(self.ranks)]

    def _drop_vanished(self, emit: Emit) -> None:
        """A rank that attached and then went away before the others came frees its place."""
        for r, a in list(self.ranks.items()):
            try:
                gone = not a.sock.recv(1, socket.MSG_PEEK | socket.MSG_DONTWAIT)
            except BlockingIOError:
                gone = False
            except OSError:
                gone = True
            if gone:
                emit(-1, "stderr", f"rank {r} ({a.node}) disconnected before every rank had attached; waiting for "
                                   f"it again")
                a.sock.close()
                del self.ranks[r]

    def _step(self, emit: Emit, full: bool, wait_s: float) -> None:
        """Accept newcomers and advance every handshake that has bytes, never blocking on one peer."""
        with self._lock:
            if self._closed:
                return
            for key, _ in self._sel.select(wait_s):
                if key.fileobj is self.sock:
                    self._accept(emit)
                elif key.fileobj in self._pending:
                    self._advance(self._pending[key.fileobj], emit, full)  # type: ignore[index]
            now = time.monotonic()
            for p in [p for p in self._pending.values() if p.deadline <= now]:
                stage = "its hello" if p.chan is not None else "the key's proof"
                self._refuse(p, f"no complete handshake within {HANDSHAKE_TIMEOUT_S:g} s (still waiting for {stage})",
                             emit)
            self._refusals.flush(emit, now)

    def _accept(self, emit: Emit) -> None:
        for _ in range(MAX_PENDING):  # what is queued now; the rest on the next step
            try:
                sock, addr = self.sock.accept()
            except OSError:  # BlockingIOError: none left; others: that connection is already gone
                return
            if len(self._pending) >= MAX_PENDING:  # a newcomer may be a real rank: the oldest handshake goes
                oldest = min(self._pending.values(), key=lambda p: p.deadline)
                self._refuse(oldest, f"{MAX_PENDING} connections were handshaking at once; the oldest was dropped",
                             emit)
            greeting, nonce_s = server_greeting()
            try:
                sock.setblocking(False)
                keepalive(sock)
                sock.send(greeting)  # a fresh socket's buffer takes these few bytes whole
            except OSError as e:
                sock.close()
                self._refusals.add(addr[:2], f"the connection failed at once ({e})", emit)
                continue
            self._pending[sock] = _Pending(sock, addr[:2], nonce_s, time.monotonic() + HANDSHAKE_TIMEOUT_S)
            self._sel.register(sock, selectors.EVENT_READ)

    def _advance(self, p: _Pending, emit: Emit, full: bool) -> None:
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
            self._hello(p, *frames[0], emit=emit, full=full)

    def _hello(self, p: _Pending, kind: str, hello: Any, emit: Emit, full: bool) -> None:
        assert p.chan is not None
        why = self._check(kind, hello, full)
        if why:
            try:
                p.chan.send(REFUSED, {"reason": why})
            except OSError:
                pass
            return self._refuse(p, why, emit)
        self._forget(p)
        p.sock.setblocking(True)  # from now on the kernel's IO thread reads it
        rank, node = hello["rank"], hello["node"]
        self.ranks[rank] = AttachedRank(rank, p.sock, p.chan, hello["pid"], node, f"{p.peer[0]}:{p.peer[1]}")
        emit(-1, "stderr", f"rank {rank} attached from {node} (pid {hello['pid']}); "
                           f"{len(self.ranks)}/{self.world_size}")

    def _forget(self, p: _Pending) -> None:
        self._pending.pop(p.sock, None)
        try:
            self._sel.unregister(p.sock)
        except (KeyError, ValueError):
            pass

    def _refuse(self, p: _Pending, why: str, emit: Emit) -> None:
        self._forget(p)
        p.sock.close()
        self._refusals.add(p.peer, why, emit)

    def _check(self, kind: str, hello: Any, full: bool) -> str | None:
        if kind != HELLO or not isinstance(hello, dict) or not isinstance(hello.get("rank"), int):
            return "the first message was not a rank's hello"
        pid, node = hello.get("pid"), hello.get("node", "?")
        if type(pid) is not int or not isinstance(node, str) or len(node) > 255:
            return f"its hello is malformed (pid {str(pid)[:40]!r} must be a number, node a host name)"
        rank, size = hello["rank"], hello.get("world_size")
        restarts = hello.get("restart") or 0
        if restarts and (full or rank in self.ranks):  # torchrun restarted it: the notebook's state is gone there
            return (f"torchrun restarted rank {rank} (restart {restarts}); a restarted rank has lost the notebook's "
                    f"variables and its group. Run torchrun with --max-restarts 0, and `%dist restart` for fresh ranks")
        if full or len(self.ranks) >= self.world_size:
            return f"all {self.world_size} ranks are already attached (rank {rank} is one too many)"
        if size != self.world_size:
            return (f"it belongs to a world of {size} ranks, but the notebook waits for {self.world_size} "
                    f"(torchrun --nnodes x --nproc-per-node must make {self.world_size})")
        if not 0 <= rank < self.world_size:
            return f"rank {rank} is outside 0..{self.world_size - 1}"
        if rank in self.ranks:
            return f"rank {rank} is already attached (from {self.ranks[rank].node})"
        return None

    def keep_refusing(self, emit: Emit) -> None:
        """After every rank is in: answer later attachers with the reason, on a daemon thread."""
        def loop() -> None:
            while not self._closed:
                try:
                    self._step(emit, full=True, wait_s=0.2)
                except (OSError, ValueError):
                    return

        self._thread = threading.Thread(target=loop, name="kit-attach-refuser", daemon=True)
        self._thread.start()

    def close(self) -> None:
        self._closed = True
        if self._thread is not None:
            self._thread.join(timeout=1)
        with self._lock:
            for p in list(self._pending.values()):
                self._forget(p)
                p.sock.close()
            self._sel.close()
            self.sock.close()
