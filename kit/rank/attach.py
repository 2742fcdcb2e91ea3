"""Worker side: a rank started by torchrun (any node) that attaches to the notebook over TCP.

`python -m kit.rank.worker --attach HOST:PORT --key-file PATH` under torchrun: connect to the
kernel's listener, prove we hold the key (and check the kernel does), say hello, wait to be
welcomed, then hand the worker a Channel like a local rank's. There are no pipes to a remote
process, so fds 1 and 2 become pipes read by a pump thread that sends their bytes as "output"
frames (C-level output too); the kernel splits them at the end-of-request markers as it does for
a local rank's pipes. A closed or dead connection (kernel gone, network dropped) ends the rank.
"""
from __future__ import annotations

import argparse
import fcntl
import os
import random
import socket
import sys
import threading
import time
from typing import Any

from kit.errors import AuthenticationError, ConfigError
from kit.handshake import HandshakeDropped, client_handshake, read_key_file
from kit.messages import HELLO, OUTPUT, PROTOCOL, REFUSED, WELCOME
from kit.protocol import Channel
from kit.rank.process import exit_now

__all__ = ["connect", "pump_output", "parse_args"]

PIPE_BYTES = 1 << 20
EXIT_REFUSED = 3  # torchrun reports it; the rank's stderr on that node says why


def parse_args(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m kit.rank.worker",
                                description="a kit rank under torchrun, attached to a notebook")
    p.add_argument("--attach", required=True, metavar="HOST:PORT", help="the kernel's listener")
    p.add_argument("--key-file", required=True, metavar="PATH", help="a copy of the kernel's key file (0600)")
    p.add_argument("--connect-timeout", type=float, default=60.0, metavar="S")
    return p.parse_args(argv)


CONNECT_TRY_S = 5.0  # one TCP connect try; a round trip to the notebook takes well under a second


def _keepalive(sock: socket.socket) -> None:
    # The kernel's machine may vanish without a FIN: notice it in seconds and exit, never run on forever.
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE, 1)
    for name, value in (("TCP_KEEPIDLE", 2), ("TCP_KEEPINTVL", 1), ("TCP_KEEPCNT", 3)):
        if hasattr(socket, name):
            sock.setsockopt(socket.IPPROTO_TCP, getattr(socket, name), value)
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)


def _refuse(text: str) -> None:
    print(f"[kit] rank {os.environ.get('RANK', '?')}: {text}", file=sys.stderr, flush=True)
    os._exit(EXIT_REFUSED)


def _connect(attach: str, host: str, port: int, deadline: float, timeout_s: float) -> socket.socket:
    """A TCP connection to the listener; a batch job may start before the notebook listens, so keep
    trying until the deadline."""
    waiting = False
    while True:
        try:
            # At most CONNECT_TRY_S a try: when a flood fills the listener's accept queue, the OS drops our SYN
            # and resends it 1, 2, 4, 8, 16 s later (a 45 s attach was seen under a flood); a new try starts
            # that backoff again at 1 s.
            try_s = min(CONNECT_TRY_S, max(1.0, deadline - time.monotonic()))
            sock = socket.create_connection((host.strip("[]"), port), timeout=try_s)
            break
        except OSError as e:
            if time.monotonic() > deadline:
                _refuse(f"cannot reach the notebook at {attach} ({e}) for {timeout_s:g} s; is "
                        f"`%dist attach` waiting, and is that address reachable from this node?")
            if not waiting:  # said once: a node's log shows why the rank sits idle
                waiting = True
                print(f"[kit] rank {os.environ.get('RANK', '?')}: the notebook at {attach} does not answer "
                      f"yet ({e}); trying every second for {timeout_s:g} s. Run `%dist attach` in "
                      f"the notebook.", file=sys.stderr, flush=True)
            if not isinstance(e, TimeoutError):  # a timed-out try has waited already
                time.sleep(1.0)
    sock.set_inheritable(False)
    _keepalive(sock)
    return sock


def connect(argv: list[str]) -> tuple[Channel, dict[str, Any]]:
    """Connect, authenticate, say hello; return the channel and the kernel's welcome."""
    args = parse_args(argv)
    host, _, port = args.attach.rpartition(":")
    if not host or not port.isdigit():
        _refuse(f"--attach {args.attach!r} must be HOST:PORT, as the notebook printed it")
    try:
        key = read_key_file(args.key_file)
    except ConfigError as e:
        _refuse(str(e))
    deadline = time.monotonic() + args.connect_timeout
    dropped = 0
    while True:  # the kernel's listener, under a flood, may close a handshake before the key is proven: again
        sock = _connect(args.attach, host, int(port), deadline, args.connect_timeout)
        try:
            session = client_handshake(sock, key)
            break
        except HandshakeDropped as e:
            sock.close()
            dropped += 1
            if time.monotonic() > deadline:
                _refuse(f"not attached: the notebook at {args.attach} closed {dropped} handshake(s) before the key "
                        f"was proven, for {args.connect_timeout:g} s (its listener was full: a flood of connections "
                        f"from somewhere?); the last: {e}")
            if dropped == 1:
                print(f"[kit] rank {os.environ.get('RANK', '?')}: the notebook closed the handshake before the key "
                      f"was proven ({e}); connecting again for up to {args.connect_timeout:g} s", file=sys.stderr,
                      flush=True)
            time.sleep(random.uniform(0.02, 0.2))  # apart from the other ranks, so they do not collide again
        except (AuthenticationError, OSError) as e:
            _refuse(f"not attached: {e}")
    try:
        chan = Channel(sock, session, is_kernel=False)
        chan.send(HELLO, {"protocol": PROTOCOL, "pid": os.getpid(), "rank": int(os.environ["RANK"]),
                            "world_size": int(os.environ["WORLD_SIZE"]), "local_rank": int(os.environ["LOCAL_RANK"]),
                            "node": socket.gethostname(),
                            "restart": int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0"))})
        sock.settimeout(None)  # the kernel welcomes us once every rank has attached
        kind, body = chan.recv()
    except (AuthenticationError, OSError, EOFError) as e:
        _refuse(f"not attached: {e}")
    if kind == REFUSED:
        _refuse(f"the notebook refused this rank: {body.get('reason')}")
    if kind != WELCOME or not isinstance(body, dict):
        _refuse(f"unexpected first message {kind!r} from the notebook")
    return chan, body


def pump_output(chan: Channel) -> int:
    """Make fds 1 and 2 pipes whose bytes travel as "output" frames. Returns a duplicate of the
    node's own stderr (torchrun's log), for faulthandler: the pump dies with a crashing process."""
    node_stderr = os.dup(2)
    for fd, stream in ((1, "stdout"), (2, "stderr")):
        r, w = os.pipe()
        try:  # bigger pipes mean bigger frames: fewer signatures and wake-ups per MiB of output
            fcntl.fcntl(w, getattr(fcntl, "F_SETPIPE_SZ", 1031), PIPE_BYTES)
        except OSError:
            pass  # over /proc/sys/fs/pipe-max-size: the default 64 KiB works, only slower
        os.dup2(w, fd)  # dup2'd fds 1/2 are inheritable: a cell's subprocesses write here too
        os.close(w)
        threading.Thread(target=_pump, args=(chan, r, stream), name=f"kit-pump-{stream}", daemon=True).start()
    return node_stderr


def _pump(chan: Channel, fd: int, stream: str) -> None:
    while True:
        try:
            data = os.read(fd, PIPE_BYTES)
        except OSError:
            return
        if not data:
            return
        try:
            chan.send(OUTPUT, {"stream": stream, "data": data})
        except OSError:
            exit_now()  # the kernel is gone
