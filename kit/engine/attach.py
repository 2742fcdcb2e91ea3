"""Kernel side: ranks that torchrun started (on this machine or others) attach to the notebook.

The kernel opens a TCP listener (loopback unless the user names an interface), prints the torchrun
command for each node, and waits for `world_size` ranks. Every connection is authenticated before
anything is unpickled (kit.handshake), then speaks the same signed frames as a local rank; output
comes as "output" frames instead of pipes. After the ranks are in, the listener keeps answering, so
an extra attacher hears why it was refused, and the notebook never notices it.
"""
from __future__ import annotations

import select
import shlex
import socket
import threading
import time
from dataclasses import dataclass, field
from typing import Any, Callable

from kit.errors import AuthenticationError, WorkerStartError
from kit.handshake import server_handshake
from kit.protocol import Channel

__all__ = ["AttachedRank", "Listener", "attach_command", "keepalive", "DEFAULT_KEY_FILE"]

DEFAULT_KEY_FILE = "~/.distributed-kit/attach.key"
Emit = Callable[[int, str, str], None]
PROGRESS_EVERY_S = 5.0


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


class Listener:
    """The kernel's listening socket and the ranks that attached through it."""

    def __init__(self, world_size: int, key: bytes, host: str = "127.0.0.1", port: int = 0):
        self.world_size, self._key = world_size, key
        self.sock = socket.create_server((host, port), backlog=max(8, 2 * world_size))
        self.host, self.port = self.sock.getsockname()[:2]
        self.ranks: dict[int, AttachedRank] = {}
        self.refused: list[str] = []  # why each refused attacher was refused (shown to the user)
        self._closed = False
        self._thread: threading.Thread | None = None
        self.emit: Emit | None = None

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
                raise WorkerStartError(
                    f"only {len(self.ranks)}/{self.world_size} ranks attached within {timeout_s:g} s (ranks "
                    f"{sorted(self.ranks) or 'none'} came). Check that torchrun runs on every node with the "
                    f"printed command, that the nodes can reach {self.host}:{self.port}, and that they have the "
                    f"key file. Raise the timeout for slow queues.")
            if now - said >= PROGRESS_EVERY_S:
                said = now
                emit(-1, "stderr", f"{len(self.ranks)}/{self.world_size} ranks attached ({now - t0:.0f} s)...")
            self._drop_vanished(emit)
            ready, _, _ = select.select([self.sock], [], [], 0.2)
            if ready:
                self._accept_one(emit)
        return [self.ranks[r] for r in sorted(self.ranks)]

    def _drop_vanished(self, emit: Emit) -> None:
        """A rank that attached and then went away before the others came frees its place."""
        for r, a in list(self.ranks.items()):
            readable, _, _ = select.select([a.sock], [], [], 0)
            if readable and not a.sock.recv(1, socket.MSG_PEEK):
                emit(-1, "stderr", f"rank {r} ({a.node}) disconnected before every rank had attached; waiting for "
                                   f"it again")
                a.sock.close()
                del self.ranks[r]

    def _accept_one(self, emit: Emit, full: bool = False) -> None:
        try:
            sock, addr = self.sock.accept()
        except OSError:
            return
        peer = f"{addr[0]}:{addr[1]}"
        try:
            keepalive(sock)
            chan = Channel(sock, server_handshake(sock, self._key), is_kernel=True)
            sock.settimeout(5.0)
            kind, hello = chan.recv()
            sock.settimeout(None)
            why = self._check(kind, hello, full)
            if why:
                try:
                    chan.send("refused", {"reason": why})
                except OSError:
                    pass
                raise AuthenticationError(why)
        except (AuthenticationError, OSError, EOFError, ValueError) as e:
            text = f"refused an attacher from {peer}: {e}"
            self.refused.append(text)
            emit(-1, "stderr", text + " (the notebook and the attached ranks are unaffected)")
            sock.close()
            return
        rank = hello["rank"]
        self.ranks[rank] = AttachedRank(rank, sock, chan, int(hello.get("pid", 0)), str(hello.get("node", "?")), peer)
        emit(-1, "stderr", f"rank {rank} attached from {hello.get('node', '?')} (pid {hello.get('pid')}); "
                           f"{len(self.ranks)}/{self.world_size}")

    def _check(self, kind: str, hello: Any, full: bool) -> str | None:
        if kind != "hello" or not isinstance(hello, dict) or not isinstance(hello.get("rank"), int):
            return "the first message was not a rank's hello"
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
                    ready, _, _ = select.select([self.sock], [], [], 0.2)
                except (OSError, ValueError):
                    return
                if ready and not self._closed:
                    self._accept_one(emit, full=True)

        self._thread = threading.Thread(target=loop, name="kit-attach-refuser", daemon=True)
        self._thread.start()

    def close(self) -> None:
        self._closed = True
        if self._thread is not None:
            self._thread.join(timeout=1)
        self.sock.close()
