"""Kernel side: ranks that torchrun started (on this machine or others) attach to the notebook.

The kernel opens a TCP listener (loopback unless the user names an interface), prints the torchrun
command for each node, and waits for `world_size` ranks. Every connection is authenticated before
anything is unpickled (kit.handshake), then speaks the same signed frames as a local rank; output
comes as "output" frames instead of pipes. After the ranks are in, the listener keeps answering, so
an extra attacher hears why it was refused.

The listener may face a hostile network (`--host 0.0.0.0`): handshakes run side by side on one
selector, each with one deadline for the whole handshake (HANDSHAKE_TIMEOUT_S, hello included), at
most MAX_PENDING at once (when full, the host holding the most pending loses its oldest unproven one;
a newcomer from that same host only evicts one older than GRACE_S, else is refused and a kit rank
connects again), so connections that say nothing, trickle bytes or flood in never keep a real rank out
nor stop the progress lines and the timeout. Refusals are coalesced per host and in total
(kit.engine.refusals).
"""
from __future__ import annotations

import collections
import errno
import selectors
import shlex
import socket
import threading
import time
from dataclasses import dataclass, field
from typing import Any, Callable

from kit.engine.refusals import REFUSED_KEPT, Refusals
from kit.errors import AuthenticationError, ConfigError, WorkerStartError
from kit.handshake import ANSWER_BYTES, HANDSHAKE_TIMEOUT_S, server_greeting, server_verify
from kit.protocol import HELLO, REFUSED, Channel

__all__ = ["AttachedRank", "Listener", "attach_command", "keepalive", "DEFAULT_KEY_FILE"]

DEFAULT_KEY_FILE = "~/.distributed-kit/attach.key"
Emit = Callable[[int, str, str], None]
PROGRESS_EVERY_S = 5.0
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
        self.sock = _listen(host, port)
        self.sock.setblocking(False)
        self.host, self.port = self.sock.getsockname()[:2]
        self.ranks: dict[int, AttachedRank] = {}
        self._refusals = Refusals()
        self._pending: dict[socket.socket, _Pending] = {}
        self._by_host: collections.Counter[str] = collections.Counter()  # pending handshakes per host
        self._came: collections.Counter[str] = collections.Counter()  # connections per host (REFUSED_KEPT hosts)
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
                raise WorkerStartError(f"only {len(self.ranks)}/{self.world_size} ranks attached within "
                                       f"{timeout_s:g} s (ranks {sorted(self.ranks) or 'none'} came). {self._seen()}")
            if now - said >= PROGRESS_EVERY_S:
                said = now
                emit(-1, "stderr", f"{len(self.ranks)}/{self.world_size} ranks attached ({now - t0:.0f} s)...")
            self._drop_vanished(emit)
            self._step(emit, full=False, wait_s=min(0.2, max(0.0, t0 + timeout_s - now)))
        self._refusals.flush(emit)
        return [self.ranks[r] for r in sorted(self.ranks)]

    def _seen(self) -> str:
        """What the wait saw, so the timeout points at the network, the key or the nodes, not all three."""
        where = (f"this machine's address, port {self.port} (the listener is on every interface)"
                 if self.host in ("0.0.0.0", "") else f"{self.host}:{self.port}")
        refused = self._refusals.total
        if not sum(self._came.values()) and not refused:
            return (f"No connection came at all: check that torchrun runs on every node with the printed command "
                    f"and that the nodes can reach {where} (a firewall, or the wrong address). Raise the timeout "
                    f"for slow queues.")
        hosts = ", ".join(h for h, _ in self._came.most_common(3)) + (" and others" if len(self._came) > 3 else "")
        last = self._refusals.kept[-1].split(": ", 1)[-1] if self._refusals.kept else "none"
        return (f"{refused} connection(s) came from {hosts} and were refused (the last: {last}); "
                f"{'copy the kernel key file to the nodes (mode 0600)' if 'wrong key' in last else 'see the refusals above'}"
                f". Raise the timeout for slow queues.")

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
            host = addr[0]
            if len(self._came) < REFUSED_KEPT or host in self._came:
                self._came[host] += 1
            if len(self._pending) >= MAX_PENDING and not self._make_room(host, emit):
                sock.close()
                self._refusals.add(addr[:2], f"{MAX_PENDING} handshakes were in progress, all from this host and "
                                             f"younger than {GRACE_S:g} s; a kit rank connects again", emit)
                continue
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
