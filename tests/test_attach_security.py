"""Security of the attach listener (loopback only): loopback by default, authentication before
anything is unpickled, wrong keys, replayed and truncated frames, strangers, extra attachers and key files
others could read are refused with a clear message, and the listener keeps serving the right ranks."""
from __future__ import annotations

import os
import re
import secrets
import socket
import subprocess
import sys
import threading

import pytest

from conftest import wait_until
from kit.engine.attach import Listener
from kit.errors import AuthenticationError, ConfigError
from kit.handshake import client_handshake, create_key_file, read_key_file
from kit.messages import PROTOCOL
from kit.protocol import Channel

WALL_CLOCK_S = 60
KEY = secrets.token_bytes(32)


class Recording(socket.socket):
    """A client socket that keeps every byte it sends (what an eavesdropper on the network sees)."""

    sent = b""

    def sendall(self, data, *args):  # type: ignore[override]
        Recording.sent += bytes(data)
        return super().sendall(data, *args)


def _attach(port: int, key: bytes, rank: int, world_size: int = 2, sock: socket.socket | None = None,
            restart: int = 0, protocol: object = PROTOCOL):
    s = sock or socket.create_connection(("127.0.0.1", port))
    if sock is not None:
        s.connect(("127.0.0.1", port))
    chan = Channel(s, client_handshake(s, key), is_kernel=False)
    hello = {"pid": os.getpid(), "rank": rank, "world_size": world_size, "node": "test", "restart": restart}
    chan.send("hello", hello if protocol is None else dict(hello, protocol=protocol))
    return chan


def _listen(world_size: int = 2):
    said: list[str] = []
    lis = Listener(world_size, KEY)
    return lis, said, (lambda rank, stream, text: said.append(text))


def test_the_listener_binds_loopback_by_default():
    lis = Listener(2, KEY)
    try:
        assert lis.host == "127.0.0.1" and lis.sock.getsockname()[0] == "127.0.0.1"
    finally:
        lis.close()


def test_wrong_key_replay_truncation_and_strangers_are_refused_and_the_right_ranks_attach():
    lis, said, emit = _listen()
    results: dict[str, object] = {}

    def clients() -> None:
        try:  # a wrong key: refused with the reason, before anything is unpickled
            _attach(lis.port, secrets.token_bytes(32), 0)
        except AuthenticationError as e:
            results["wrong"] = str(e)
        raw = socket.create_connection(("127.0.0.1", lis.port))  # a stranger: not even the handshake
        raw.sendall(b"GET / HTTP/1.0\r\n\r\n" + b"x" * 64)
        results["stranger"] = raw.recv(200)
        raw.close()
        rec = Recording(socket.AF_INET, socket.SOCK_STREAM)  # a genuine rank 0, recorded on the wire
        results["chan0"] = _attach(lis.port, KEY, 0, sock=rec)
        replay = socket.create_connection(("127.0.0.1", lis.port))  # its bytes replayed on a new connection
        replay.recv(64)
        replay.sendall(Recording.sent)
        results["replay"] = replay.recv(200)
        replay.close()
        half = socket.create_connection(("127.0.0.1", lis.port))  # authenticated, then a truncated frame
        chan = Channel(half, client_handshake(half, KEY), is_kernel=False)
        from kit.protocol import encode_frame
        frame = encode_frame(chan._key, b"w->k", 0, "hello", {"rank": 1, "world_size": 2})
        half.sendall(frame[: len(frame) // 2])
        results["half"] = half.recv(200)  # closed by the kernel after its timeout
        half.close()
        results["chan1"] = _attach(lis.port, KEY, 1)

    t = threading.Thread(target=clients)
    t.start()
    try:
        ranks = lis.wait(40, emit)
    finally:
        t.join(timeout=30)
    assert [a.rank for a in ranks] == [0, 1]
    assert "wrong key" in str(results["wrong"])
    assert results["stranger"].startswith(b"KIT-ATTACH-1") or results["stranger"] == b""  # nothing was unpickled
    assert results["replay"].startswith(b"R") and b"wrong key" in results["replay"]
    assert results["half"] == b""
    assert len(lis.refused) == 4, lis.refused
    refusals = [text for text in said if "refused" in text]  # the first in full, the others counted
    assert refusals[0].startswith("refused an attacher from 127.0.0.1:"), refusals
    assert len(refusals) == 2 and re.fullmatch(r"3 more refused from 127\.0\.0\.1 in the last \d+ s \(the last: no "
                                               r"complete handshake within 5 s \(still waiting for its hello\)\)",
                                               refusals[1]), refusals
    lis.close()


def test_an_extra_attacher_and_a_duplicate_rank_are_refused_with_the_reason():
    lis, said, emit = _listen()
    reasons: list[str] = []

    kept: list[Channel] = []  # a dropped channel closes its socket: the kernel would free that rank's place

    def clients() -> None:
        kept.append(_attach(lis.port, KEY, 0))
        # the listener must hold rank 0 before its duplicate arrives: the two handshakes run side by side,
        # and a hello that reaches it in two reads may finish after the next connection's
        wait_until(lambda: 0 in lis.ranks, what="the listener to attach rank 0")
        for rank, size, protocol in ((0, 2, PROTOCOL), (1, 4, PROTOCOL), (1, 2, None), (1, 2, PROTOCOL + 1)):
            # rank 0 again; a rank of another world size; ranks of an older and of a newer kit
            chan = _attach(lis.port, KEY, rank, size, protocol=protocol)
            kind, body = chan.recv()
            reasons.append(f"{kind}: {body['reason']}")
        kept.append(_attach(lis.port, KEY, 1))

    t = threading.Thread(target=clients)
    t.start()
    lis.wait(30, emit)
    t.join(timeout=10)
    lis.keep_refusing(emit)
    for restart in (0, 1):  # one too many; a rank that torchrun restarted
        late = _attach(lis.port, KEY, 1, restart=restart)
        kind, body = late.recv()
        reasons.append(f"{kind}: {body['reason']}")
    lis.close()
    assert reasons[0] == "refused: rank 0 is already attached (from test)"
    assert reasons[1].startswith("refused: it belongs to a world of 4 ranks, but the notebook waits for 2")
    assert reasons[2] == (f"refused: rank 1 on test runs another version of the kit (protocol 1 or older, the "
                          f"notebook's is {PROTOCOL}): install the kit from the same checkout or release on every node")
    assert reasons[3].startswith(f"refused: rank 1 on test runs another version of the kit (protocol {PROTOCOL + 1},")
    assert reasons[4] == "refused: all 2 ranks are already attached (rank 1 is one too many)"
    assert reasons[5].startswith("refused: torchrun restarted rank 1 (restart 1); a restarted rank has lost")


def test_waiting_times_out_with_a_clear_message():
    from kit.errors import WorkerStartError

    lis, said, emit = _listen()
    with pytest.raises(WorkerStartError, match=r"only 0/2 ranks attached within 1 s .*printed command"):
        lis.wait(1.0, emit)
    lis.close()


def test_key_files_are_created_0600_and_readable_ones_are_refused(tmp_path):
    path = str(tmp_path / "sub" / "kit.key")
    key = create_key_file(path)
    assert len(key) == 32 and os.stat(path).st_mode & 0o777 == 0o600
    assert create_key_file(path) == key == read_key_file(path)  # an existing file is reused
    os.chmod(path, 0o644)
    with pytest.raises(ConfigError, match="chmod 600"):
        read_key_file(path)
    env = dict(os.environ, RANK="0", WORLD_SIZE="2", LOCAL_RANK="0")
    proc = subprocess.run([sys.executable, "-m", "kit.rank.worker", "--attach", "127.0.0.1:9", "--key-file", path],
                          env=env, capture_output=True, text=True, timeout=30)
    assert proc.returncode == 3 and "chmod 600" in proc.stderr
