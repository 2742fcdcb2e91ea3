"""Kernel side of the rank template: ranks forked from a warm interpreter instead of started fresh.

A fresh rank imports torch (about 0.7 s of CPU each, so 8 ranks take seconds); the template
(`python -m kit.rank.template`, kit/rank/template.py) imports it once and forks ranks on request.
It is started exactly like a worker (own session, key on stdin, a private socket, never a fork of
the kernel), has its own watchdog (marker `KIT_TEMPLATE=<id>`, which every rank forked from it
carries) and dies with the kernel however it dies. One template per interpreter and startup
environment (what a fork cannot change later: PYTHONPATH, LD_* and the like), kept for the
kernel's life. A rank is the template's child, so `ForkedProc` stands in for `subprocess.Popen`:
the template reports its exit status, and the kernel keeps its pipes and control socket.
"""
from __future__ import annotations

import atexit
import itertools
import json
import os
import queue
import secrets
import socket
import subprocess
import sys
import tempfile
import threading
import time
from typing import IO, Any

from kit.engine.watchdog import Watchdog, end_of_file, is_ours, start_time
from kit.errors import AuthenticationError
from kit.protocol import FROM_TEMPLATE, KEY_BYTES, SESSION_SLOT, TO_TEMPLATE, seal, unseal

__all__ = ["ForkedProc", "Template", "template_for", "prewarm", "close_all", "close_idle"]


class ForkedProc:
    """What the kit uses of subprocess.Popen, for a rank the template forked (not our child: the
    template reaps it and reports the exit status)."""

    def __init__(self, stdin: IO[bytes], stdout: IO[bytes], stderr: IO[bytes]):
        self.stdin, self.stdout, self.stderr = stdin, stdout, stderr
        self.pid = 0
        self.start: str | None = None
        self.returncode: int | None = None
        self.seen: dict[str, Any] = {}  # the template's threads and CUDA state just before the fork
        self._exited = threading.Event()

    def poll(self) -> int | None:
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        if not self._exited.wait(timeout):
            raise subprocess.TimeoutExpired(f"rank pid {self.pid}", timeout or 0.0)
        assert self.returncode is not None
        return self.returncode

    def exited(self, code: int) -> None:
        self.returncode = code
        self._exited.set()


class Template:
    def __init__(self, env: dict[str, str]):
        self.key, self.tag = secrets.token_bytes(KEY_BYTES), secrets.token_hex(8)
        self.sock, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        self.log = tempfile.TemporaryFile()  # its stderr: read only when it fails to start
        main_thread = threading.current_thread() is threading.main_thread()
        env = dict(env, KIT_TEMPLATE=self.tag, KIT_SESSION="?" * SESSION_SLOT, KIT_TEMPLATE_FD=str(theirs.fileno()),
                   KIT_KERNEL_PID=str(os.getpid()), KIT_PDEATHSIG="1" if main_thread else "0",
                   # one thread for every BLAS/OpenMP runtime loaded at import: no pool exists to be forked
                   OMP_NUM_THREADS="1", MKL_NUM_THREADS="1", OPENBLAS_NUM_THREADS="1")
        self.watchdog = Watchdog(f"KIT_TEMPLATE={self.tag}")
        try:
            self.proc = subprocess.Popen([sys.executable, "-m", "kit.rank.template"], stdin=subprocess.PIPE,
                                         stdout=subprocess.DEVNULL, stderr=self.log, pass_fds=(theirs.fileno(),),
                                         env=env, start_new_session=True)
        finally:
            theirs.close()
        self.watchdog.watch(self.proc.pid)
        assert self.proc.stdin is not None
        self.proc.stdin.write(self.key)  # stdin stays open: its end of file ends the template
        self.proc.stdin.flush()
        self.info: dict[str, Any] = {}
        self.gone = False
        self._ready = threading.Event()
        self._sent = self._received = 0
        self._send_lock = threading.Lock()
        self._ids = itertools.count(1)
        self._pending: dict[int, tuple[ForkedProc, queue.Queue[dict[str, Any]]]] = {}
        self._procs: dict[int, ForkedProc] = {}
        threading.Thread(target=self._read, name="kit-template", daemon=True).start()

    @property
    def pid(self) -> int:
        return self.proc.pid

    def wait_ready(self, timeout_s: float) -> str | None:
        """None when ranks can be forked; otherwise why not, in one line."""
        if not self._ready.wait(timeout_s):
            return f"the rank template did not finish importing torch within {timeout_s:g} s"
        if not self.info:
            return self.exit_reason()
        return self.info.get("unsafe")

    def exit_reason(self) -> str:
        code = self.proc.poll()
        try:
            self.log.seek(0)
            lines = self.log.read().decode(errors="replace").strip().splitlines()
        except (OSError, ValueError):
            lines = []
        tail = f": {lines[-1][:300]}" if lines else ""
        return f"the rank template exited (code {code}){tail}"

    def fork(self, env: dict[str, str], session: str, ctrl_fd: int) -> ForkedProc | str:
        """A rank with this environment and control socket, or why the template refused."""
        if len(session.encode()) > SESSION_SLOT:
            return f"the session name {session!r} does not fit the template's {SESSION_SLOT}-byte marker slot"
        (in_r, in_w), (out_r, out_w), (err_r, err_w) = os.pipe(), os.pipe(), os.pipe()
        proc = ForkedProc(open(in_w, "wb"), open(out_r, "rb"), open(err_r, "rb"))
        replies: queue.Queue[dict[str, Any]] = queue.Queue()
        rid = next(self._ids)
        self._pending[rid] = (proc, replies)
        body = json.dumps({"op": "fork", "id": rid, "env": env, "cwd": os.getcwd(), "session": session}).encode()
        try:
            with self._send_lock:
                socket.send_fds(self.sock, [seal(self.key, TO_TEMPLATE, self._sent, body)], [in_r, out_w, err_w, ctrl_fd])
                self._sent += 1
        except OSError as e:
            self._pending.pop(rid, None)
            replies.put({"op": "refused", "why": f"the rank template cannot be reached ({e.strerror})"})
        finally:
            for fd in (in_r, out_w, err_w):
                os.close(fd)
        reply = replies.get()
        if reply["op"] != "forked":
            for f in (proc.stdin, proc.stdout, proc.stderr):
                f.close()
            return str(reply["why"])
        return proc

    def _read(self) -> None:
        try:
            while True:
                data = self.sock.recv(1 << 16)
                if not data:
                    break
                msg = json.loads(unseal(self.key, FROM_TEMPLATE, self._received, data))
                self._received += 1
                self._on_message(msg)
        except (OSError, ValueError, AuthenticationError):
            pass
        self.gone = True
        self._ready.set()
        for _, replies in list(self._pending.values()):
            replies.put({"op": "refused", "why": self.exit_reason()})
        self._orphaned()

    def _on_message(self, msg: dict[str, Any]) -> None:
        op = msg.get("op")
        if op == "ready":
            self.info = msg
            self._ready.set()
        elif op in ("forked", "refused"):
            proc, replies = self._pending.pop(int(msg["id"]))
            if op == "forked":  # registered here, before the next message: it may be this rank's exit
                proc.pid, proc.seen = int(msg["pid"]), {k: msg[k] for k in ("threads", "cuda_initialized")}
                proc.start = start_time(proc.pid)
                self._procs[proc.pid] = proc
            replies.put(msg)
        elif op == "exited":
            proc = self._procs.pop(int(msg["pid"]), None)
            if proc is not None:
                proc.exited(int(msg["code"]))

    def _orphaned(self) -> None:
        """The template is gone, so its ranks got their parent-death SIGKILL: report them when they are."""
        deadline = time.monotonic() + 5.0
        while self._procs and time.monotonic() < deadline:
            for pid, proc in list(self._procs.items()):
                if not is_ours(pid, proc.start):
                    self._procs.pop(pid).exited(-9)
            time.sleep(0.02)

    def busy(self) -> bool:
        return bool(self._procs)

    def close(self) -> None:
        """End of file on its stdin: it SIGKILLs the ranks it forked that still live, and exits."""
        end_of_file(self.proc)
        self.watchdog.close()  # sweeps anything still marked KIT_TEMPLATE=<id>
        self.sock.close()
        self.log.close()


_TEMPLATES: dict[tuple[str, ...], Template] = {}
_REFUSED: dict[tuple[str, ...], str] = {}  # an environment whose template refused: do not retry every start
_LOCK = threading.Lock()


_READ_LATER = ("GLOO_", "NCCL_", "MASTER_")  # read when a rank creates its group, after the fork: no new template


def _key(env: dict[str, str]) -> tuple[str, ...]:
    return (sys.executable, *sorted(f"{k}={v}" for k, v in env.items() if not k.startswith(_READ_LATER)))


def _unsupported() -> str | None:
    if not sys.platform.startswith("linux") or not hasattr(os, "fork") or not hasattr(socket, "send_fds"):
        return "forking ranks needs Linux and Python 3.9 or newer"
    return None


def prewarm(env: dict[str, str]) -> None:
    """Start the template for this environment now (it imports torch while the user reads)."""
    with _LOCK:
        if _unsupported() is None and _key(env) not in _TEMPLATES and _key(env) not in _REFUSED:
            _TEMPLATES[_key(env)] = Template(env)


def template_for(env: dict[str, str], timeout_s: float) -> Template | str:
    """The ready template for ranks started from this environment, or why ranks must start fresh."""
    why = _unsupported()
    if why is not None:
        return why
    key = _key(env)
    with _LOCK:
        if key in _REFUSED:
            return _REFUSED[key]
        template = _TEMPLATES.get(key)
        if template is not None and template.gone:
            _TEMPLATES.pop(key).close()
            template = None
        if template is None:
            idle = [k for k, t in _TEMPLATES.items() if not t.busy()]
            for other in idle[:max(0, len(_TEMPLATES) - 1)]:  # keep one other environment's template warm
                _TEMPLATES.pop(other).close()
            template = _TEMPLATES[key] = Template(env)
    why = template.wait_ready(timeout_s)
    if why is not None:
        with _LOCK:
            if template.info.get("unsafe"):  # it will say the same next time; a crash or a timeout may not
                _REFUSED[key] = why
            if _TEMPLATES.get(key) is template:
                del _TEMPLATES[key]
        template.close()
        return why
    return template


def close_idle(within_s: float = 3.0) -> int:
    """Close every template that holds no live rank (`%dist shutdown`: the user frees the memory, about
    150 MiB per template with torch imported; the next start imports torch again); how many closed.

    A template hears of its ranks' exits from its own reports, a moment after they died: one whose ranks
    were just stopped is given up to `within_s` to report them (a template with ranks alive stays)."""
    deadline = time.monotonic() + within_s
    with _LOCK:
        candidates = list(_TEMPLATES.items())
    while any(t.busy() for _, t in candidates) and time.monotonic() < deadline:
        time.sleep(0.05)
    with _LOCK:
        idle = [k for k, t in candidates if not t.busy() and _TEMPLATES.get(k) is t]
        templates = [_TEMPLATES.pop(k) for k in idle]
    for template in templates:
        template.close()
    return len(templates)


@atexit.register
def close_all() -> None:
    """Registered before the clusters' own atexit hook (the launcher imports this module first), so it
    runs after it: the ranks are stopped, then their templates."""
    with _LOCK:
        templates = list(_TEMPLATES.values())
        _TEMPLATES.clear()
    for template in templates:
        template.close()
