"""Rank side: the connections of this rank's process group (gloo's TCP pairs), so the kit can close
them when peers wait in a collective this rank will never call: what a finished torchrun process does
by exiting, so the peers' collective fails at once instead of at the process-group timeout."""
from __future__ import annotations

import os
import socket

__all__ = ["socket_fds", "close_connections"]


def socket_fds(exclude: set[int] = frozenset(), store_port: int | None = None) -> dict[int, str]:
    """{fd: "socket:[inode]"} of this process's sockets, without `exclude` and without connections to
    `store_port` (torchrun's rendezvous store, which the re-created group needs)."""
    out = {}
    for name in os.listdir("/proc/self/fd"):
        fd = int(name)
        try:
            target = os.readlink(f"/proc/self/fd/{name}")
        except OSError:
            continue
        if target.startswith("socket:") and fd not in exclude and not (store_port and _peer_port(fd) == store_port):
            out[fd] = target
    return out


def _peer_port(fd: int) -> int | None:
    s = socket.socket(fileno=os.dup(fd))
    try:
        peer = s.getpeername()
        return peer[1] if isinstance(peer, tuple) else None
    except OSError:
        return None
    finally:
        s.close()


def close_connections(sockets: dict[int, str]) -> int:
    """Shut down each connected socket that is still the one recorded (an fd number may have been
    reused); listeners are left alone (gloo aborts the process when its accept fails). Returns how many."""
    closed = 0
    for fd, target in sockets.items():
        try:
            if os.readlink(f"/proc/self/fd/{fd}") != target:
                continue
            s = socket.socket(fileno=os.dup(fd))
        except OSError:
            continue
        try:
            if not s.getsockopt(socket.SOL_SOCKET, socket.SO_ACCEPTCONN):
                s.shutdown(socket.SHUT_RDWR)
                closed += 1
        except OSError:
            pass  # not connected (any more)
        finally:
            s.close()  # our duplicate only
    return closed
