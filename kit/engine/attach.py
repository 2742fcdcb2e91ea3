"""Kernel side: ranks that torchrun started (on this machine or others) attach to the notebook.

The kernel opens a TCP listener (loopback unless the user names an interface), prints the torchrun
command for each node, and waits for `world_size` ranks. Every connection passes the door first
(kit.engine.admission: the handshake, authenticated before anything is unpickled, with its flood
rules); this module decides who of the proven ranks may join (world size, rank free, not one too many,
not a restarted rank), says the progress and, on a timeout, what it saw. Attached ranks then speak the
same signed frames as a local rank; output comes as "output" frames instead of pipes. After the ranks
are in, the listener keeps answering, so an extra attacher hears why it was refused.
"""
from __future__ import annotations

import collections
import shlex
import socket
import threading
import time
from dataclasses import dataclass, field
from typing import Any, Callable

from kit.engine.admission import Admission, Hello
from kit.engine.refusals import Emit
from kit.errors import WorkerStartError
from kit.messages import HELLO, PROTOCOL
from kit.protocol import Channel

__all__ = ["AttachedRank", "Listener", "attach_command", "DEFAULT_KEY_FILE"]

DEFAULT_KEY_FILE = "~/.distributed-kit/attach.key"
PROGRESS_EVERY_S = 5.0


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
    """The kernel's listening socket and the ranks that attached through it: its door (an `Admission`)
    runs the handshakes; the listener decides who of the proven ranks may join."""

    def __init__(self, world_size: int, key: bytes, host: str = "127.0.0.1", port: int = 0):
        self.world_size = world_size
        self._door = Admission(key, host, port)
        self.sock, self.host, self.port = self._door.sock, self._door.host, self._door.port
        self.ranks: dict[int, AttachedRank] = {}
        self._thread: threading.Thread | None = None

    @property
    def refused(self) -> collections.deque[str]:
        """Why the last REFUSED_KEPT refused attachers were refused."""
        return self._door.refusals.kept

    @property
    def refused_total(self) -> int:
        return self._door.refusals.total

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
                self._door.refusals.flush(emit)
                raise WorkerStartError(f"only {len(self.ranks)}/{self.world_size} ranks attached within "
                                       f"{timeout_s:g} s (ranks {sorted(self.ranks) or 'none'} came). {self._seen()}")
            if now - said >= PROGRESS_EVERY_S:
                said = now
                emit(-1, "stderr", f"{len(self.ranks)}/{self.world_size} ranks attached ({now - t0:.0f} s)...")
            self._drop_vanished(emit)
            self._door.step(emit, lambda hello: self._admit(hello, emit, full=False),
                            wait_s=min(0.2, max(0.0, t0 + timeout_s - now)))
        self._door.refusals.flush(emit)
        return [self.ranks[r] for r in sorted(self.ranks)]

    def _seen(self) -> str:
        """What the wait saw, so the timeout points at the network, the key or the nodes, not all three."""
        where = (f"this machine's address, port {self.port} (the listener is on every interface)"
                 if self.host in ("0.0.0.0", "") else f"{self.host}:{self.port}")
        refusals, came = self._door.refusals, self._door.came
        if not sum(came.values()) and not refusals.total:
            return (f"No connection came at all: check that torchrun runs on every node with the printed command "
                    f"and that the nodes can reach {where} (a firewall, or the wrong address). Raise the timeout "
                    f"for slow queues.")
        hosts = ", ".join(h for h, _ in came.most_common(3)) + (" and others" if len(came) > 3 else "")
        last = refusals.kept[-1].split(": ", 1)[-1] if refusals.kept else "none"
        return (f"{refusals.total} connection(s) came from {hosts} and were refused (the last: {last}); "
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

    def _admit(self, hello: Hello, emit: Emit, full: bool) -> str | None:
        """Why a proven hello may not join, or None: then it is one of the ranks."""
        why = self._check(hello.kind, hello.body, full)
        if why:
            return why
        rank, node, pid = hello.body["rank"], hello.body["node"], hello.body["pid"]
        self.ranks[rank] = AttachedRank(rank, hello.sock, hello.chan, pid, node, f"{hello.peer[0]}:{hello.peer[1]}")
        emit(-1, "stderr", f"rank {rank} attached from {node} (pid {pid}); {len(self.ranks)}/{self.world_size}")
        return None

    def _check(self, kind: str, hello: Any, full: bool) -> str | None:
        if kind != HELLO or not isinstance(hello, dict) or not isinstance(hello.get("rank"), int):
            return "the first message was not a rank's hello"
        pid, node = hello.get("pid"), hello.get("node", "?")
        if type(pid) is not int or not isinstance(node, str) or len(node) > 255:
            return f"its hello is malformed (pid {str(pid)[:40]!r} must be a number, node a host name)"
        if hello.get("protocol") != PROTOCOL:
            theirs = hello.get("protocol")
            return (f"rank {hello['rank']} on {node} runs another version of the kit (protocol "
                    f"{str(theirs)[:20] if theirs is not None else '1 or older'}, the notebook's is {PROTOCOL}): "
                    f"install the kit from the same checkout or release on every node")
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
            while not self._door.closed:
                try:
                    self._door.step(emit, lambda hello: self._admit(hello, emit, full=True), wait_s=0.2)
                except (OSError, ValueError):
                    return

        self._thread = threading.Thread(target=loop, name="kit-attach-refuser", daemon=True)
        self._thread.start()

    def close(self) -> None:
        self._door.close()  # marks it closed, then waits out a step in progress
        if self._thread is not None:
            self._thread.join(timeout=1)
