"""The control channel accepts only its own kernel: signed frames, no listener, key off argv/env."""
from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time

import pytest

from kit.errors import AuthenticationError
from kit.protocol import Channel, FrameDecoder, encode_frame
from conftest import quiet

KEY, OTHER = b"k" * 32, b"x" * 32


def test_wrong_key_and_replay_are_rejected():
    good = encode_frame(KEY, b"k->w", 0, "exec", {"code": "1"})
    with pytest.raises(AuthenticationError):
        FrameDecoder(OTHER, b"k->w").feed(good)
    dec = FrameDecoder(KEY, b"k->w")
    assert dec.feed(good) == [("exec", {"code": "1"})]
    with pytest.raises(AuthenticationError):  # the same frame again: sequence number no longer matches
        dec.feed(good)
    with pytest.raises(AuthenticationError):  # a kernel frame reflected back as a worker frame
        FrameDecoder(KEY, b"w->k").feed(good)


def test_tampered_payload_is_rejected_before_unpickling():
    frame = bytearray(encode_frame(KEY, b"k->w", 0, "exec", {"code": "1"}))
    frame[-3] ^= 0xFF
    with pytest.raises(AuthenticationError):
        FrameDecoder(KEY, b"k->w").feed(bytes(frame))


def test_worker_rejects_a_frame_signed_with_another_key(tmp_path):
    """A live worker given key A receives code signed with key B: it must exit, never run it."""
    ours, theirs = socket.socketpair()
    marker = tmp_path / "pwned"
    env = dict(os.environ, KIT_CTRL_FD=str(theirs.fileno()), KIT_KERNEL_PID=str(os.getpid()), RANK="0",
               WORLD_SIZE="1", LOCAL_RANK="0", KIT_RUN_DIR=str(tmp_path), KIT_BACKEND="gloo",
               KIT_PG_TIMEOUT_S="5", KIT_THREADS="1", KIT_MARKER="\x1bKITtest:")
    proc = subprocess.Popen([sys.executable, "-m", "kit.rank.worker"], stdin=subprocess.PIPE, env=env,
                            pass_fds=(theirs.fileno(),), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    theirs.close()
    proc.stdin.write(KEY)
    proc.stdin.flush()
    chan = Channel(ours, KEY, is_kernel=True)
    assert chan.recv()[0] == "hello"
    assert chan.recv()[0] == "ready"
    evil = Channel(ours, OTHER, is_kernel=True)
    evil.send("exec", {"id": 1, "code": f"open({str(marker)!r}, 'w').write('x')", "check": False})
    assert proc.wait(timeout=10) != 0
    time.sleep(0.2)
    assert not marker.exists()


def test_key_is_not_on_argv_or_in_the_environment(make_cluster, monkeypatch):
    from kit.engine import local

    key, drawn = bytes(range(100, 132)), []  # the session key this start draws, known to the test
    monkeypatch.setattr(local, "new_key", lambda: drawn.append(key) or key)
    c = make_cluster(world_size=1)
    assert drawn == [key] and c.run("1", on_output=quiet).values == {0: 1}  # the rank speaks with that key
    pid = c.pids[0]
    for where in ("cmdline", "environ"):
        with open(f"/proc/{pid}/{where}", "rb") as f:
            text = f.read()
        assert key not in text and key.hex().encode() not in text, where
    env = c.run("import os\nsorted(k for k in os.environ if k.startswith('KIT_CTRL'))", on_output=quiet).values[0]
    assert env == []


def test_no_kit_socket_listens_on_any_interface(make_cluster):
    psutil = pytest.importorskip("psutil")
    c = make_cluster()
    c.run("t = torch.ones(1)\ndist.all_reduce(t)", on_output=quiet)
    for pid in c.pids.values():
        for conn in psutil.Process(pid).net_connections(kind="inet"):
            if conn.status == psutil.CONN_LISTEN:
                assert conn.laddr.ip in ("127.0.0.1", "::1"), f"rank listens on {conn.laddr}"
            if conn.raddr:
                assert conn.raddr.ip in ("127.0.0.1", "::1")


def test_run_dir_is_private(make_cluster):
    c = make_cluster(world_size=1)
    run_dir = c.status()["run_dir"]
    assert os.stat(run_dir).st_mode & 0o077 == 0
    assert os.stat(os.path.dirname(run_dir)).st_mode & 0o077 == 0


# The per-user run directory is trusted only when it is ours, 0700 and not a symlink.
def _planted(tmp_path, monkeypatch, make_bad):
    """A runtime base with `distributed-kit-<uid>` made by someone else, holding a registry that names an
    unrelated process (a `sleep` we start) as the worker of a dead kernel."""
    from kit.engine import run_dirs

    monkeypatch.setenv("XDG_RUNTIME_DIR", str(tmp_path))
    monkeypatch.setattr(run_dirs, "_FALLBACK", {})
    shared = tmp_path / f"distributed-kit-{os.getuid()}"
    victim = subprocess.Popen(["sleep", "600"], start_new_session=True)
    real = tmp_path / "elsewhere"
    real.mkdir(mode=0o700)
    planted = real / "run-evil"
    planted.mkdir(mode=0o700)
    (planted / "workers.json").write_text(json.dumps({
        "kernel_pid": 999_999_999, "kernel_start": "1",  # a dead kernel
        "workers": [{"pid": victim.pid, "start": run_dirs._start_time(victim.pid)}]}))  # start times are public
    make_bad(shared, real)
    return run_dirs, shared, victim


def _other_owner(shared, real):
    real.rename(shared)
    for path in (shared, shared / "run-evil", shared / "run-evil" / "workers.json"):
        os.chown(path, 65534, 65534)  # nobody: another local user pre-created the directory


def _world_writable(shared, real):
    real.rename(shared)
    os.chmod(shared, 0o777)


def _symlink(shared, real):
    os.symlink(real, shared)


@pytest.mark.parametrize("make_bad", [_other_owner, _world_writable, _symlink], ids=["owner", "mode", "symlink"])
def test_planted_run_dir_never_gets_a_process_killed(tmp_path, monkeypatch, make_bad):
    if make_bad is _other_owner and os.getuid() != 0:
        pytest.skip("simulating another user's directory needs chown (root)")
    run_dirs, shared, victim = _planted(tmp_path, monkeypatch, make_bad)
    try:
        assert run_dirs.reap_stale() == []
        time.sleep(0.2)
        assert victim.poll() is None, "a pid named in a planted workers.json was signalled"
        private = run_dirs.runtime_dir()
        assert private != str(shared) and os.path.dirname(private) == str(tmp_path)
        st = os.lstat(private)
        assert st.st_uid == os.getuid() and st.st_mode & 0o777 == 0o700
        notes = run_dirs.runtime_notes()
        assert len(notes) == 1 and f"refusing the run directory {shared}" in notes[0] and private in notes[0]
        assert f"remove {shared}" in notes[0]
        assert run_dirs.runtime_dir() == private and run_dirs.runtime_notes() == []  # said once, same dir
    finally:
        victim.kill()


def test_registry_in_our_own_dir_naming_an_unrelated_process_is_ignored(tmp_path, monkeypatch):
    """Even in a directory we own, a registry entry is not enough: owner, start time and the session
    marker in the process's environment must all match before anything is signalled."""
    from kit.engine import run_dirs

    monkeypatch.setenv("XDG_RUNTIME_DIR", str(tmp_path))
    victim = subprocess.Popen(["sleep", "600"], start_new_session=True)  # right start time, no kit marker
    run_dir = run_dirs.make_run_dir()
    with open(os.path.join(run_dir, "workers.json"), "w") as f:
        json.dump({"kernel_pid": 999_999_999, "kernel_start": "1",
                   "workers": [{"pid": victim.pid, "start": run_dirs._start_time(victim.pid)}, {"pid": "x"}, 7]}, f)
    try:
        assert run_dirs.reap_stale() == []
        time.sleep(0.2)
        assert victim.poll() is None
    finally:
        victim.kill()


def test_a_refused_run_dir_still_starts_ranks(tmp_path, monkeypatch, make_cluster, capsys):
    from kit.engine import run_dirs

    monkeypatch.setenv("XDG_RUNTIME_DIR", str(tmp_path))
    monkeypatch.setattr(run_dirs, "_FALLBACK", {})
    (tmp_path / f"distributed-kit-{os.getuid()}").mkdir(mode=0o755)
    os.chmod(tmp_path / f"distributed-kit-{os.getuid()}", 0o755)
    c = make_cluster(world_size=1)
    assert c.run("rank", on_output=quiet).values == {0: 0}
    assert "refusing the run directory" in capsys.readouterr().err
    assert os.path.dirname(c.status()["run_dir"]) != str(tmp_path / f"distributed-kit-{os.getuid()}")
