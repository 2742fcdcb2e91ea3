"""Kernel side: one rank template process (`Template`, kit/rank/template.py on the other end) and the
ranks it forked (`ForkedProc`, what the kit uses of subprocess.Popen for them).

A rank is the template's child, not the kernel's: the template reports each fork and exit status over
a private SOCK_SEQPACKET socketpair, every message signed with a key that went to it on stdin. A fork
request carries the rank's pipes, its control socket and a memfd holding the signed request (a packet
holds about 208 KB; an environment may be larger). When the channel ends (normally: the template died)
its ranks are reported as they go, with the template's fate as their cause (`ForkedProc.lost`); which
template serves which environment is kit/engine/template.py's business.
"""
from __future__ import annotations

import itertools
import json
import os
import queue
import secrets
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from typing import IO, Any

from kit.engine.watchdog import Watchdog, end_of_file, is_ours, start_time
from kit.errors import AuthenticationError
from kit.messages import FORK, FORK_REFUSED, FORKED, RANK_EXITED, TEMPLATE_READY
from kit.protocol import (FROM_TEMPLATE, KEY_BYTES, SESSION_SLOT, TEMPLATE_REQUEST_LIMIT_BYTES, TO_TEMPLATE, seal,
                          unseal)
from kit.units import MIB

__all__ = ["ForkedProc", "Template", "TemplateLost", "FORK_TIMEOUT_S"]
FORK_TIMEOUT_S = 10.0  # a fork takes milliseconds; past this the template is stopped or starved


class TemplateLost(Exception):
    """The template died while a start was forking ranks from it: those ranks died with it."""

    def __init__(self, why: str):
        super().__init__(why)
        self.why = why


class ForkedProc:
    """What the kit uses of subprocess.Popen, for a rank the template forked (not our child: the
    template reaps it and reports the exit status)."""

    def __init__(self, stdin: IO[bytes], stdout: IO[bytes], stderr: IO[bytes]):
        self.stdin, self.stdout, self.stderr = stdin, stdout, stderr
        self.pid = 0
        self.start: str | None = None
        self.returncode: int | None = None
        self.seen: dict[str, Any] = {}  # the template's threads and CUDA state just before the fork
        self.template: Template | None = None  # the template that forked it
        # (template pid, its exit code or None when it lives) when the rank ended with the kernel's channel to
        # its template lost: the root cause of its death, not the rank's own signal
        self.lost: tuple[int, int | None] | None = None
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
    """The kernel's handle on one rank template process (its own side: kit/rank/template.TemplateServer)."""

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

    def death(self, within_s: float = 0.0) -> int | None:
        """The template process's exit code once it ended (waiting up to `within_s`), else None."""
        try:
            return self.proc.wait(timeout=within_s)
        except subprocess.TimeoutExpired:
            return None

    def exit_reason(self, when: str = "") -> str:
        """Why it cannot fork (`when`: " while the ranks started", said before its last stderr line)."""
        code = self.death(within_s=1.0)  # its socket closes as it exits: the status follows at once
        if code is None:
            return f"the kit lost its channel to the rank template (pid {self.pid}){when}"
        try:
            self.log.seek(0)
            lines = self.log.read().decode(errors="replace").strip().splitlines()
        except (OSError, ValueError):
            lines = []
        tail = f": {lines[-1][:300]}" if lines else ""
        how = f"was killed by {signal.Signals(-code).name}" if -code in signal.valid_signals() else f"exited (code {code})"
        return f"the rank template (pid {self.pid}) {how}{when}{tail}"

    def fork(self, env: dict[str, str], session: str, ctrl_fd: int) -> ForkedProc | str:
        """A rank with this environment and control socket, or why the template refused."""
        if len(session.encode()) > SESSION_SLOT:
            return f"the session name {session!r} does not fit the template's {SESSION_SLOT}-byte marker slot"
        if self.gone:
            return self.exit_reason()
        rid = next(self._ids)
        body = json.dumps({"op": FORK, "id": rid, "env": env, "cwd": os.getcwd(), "session": session}).encode()
        if len(body) > TEMPLATE_REQUEST_LIMIT_BYTES:  # the template reads no larger one
            return (f"the ranks' environment takes {len(body) / MIB:.0f} MiB, over the rank template's "
                    f"{TEMPLATE_REQUEST_LIMIT_BYTES / MIB:.0f} MiB limit for one fork request")
        (in_r, in_w), (out_r, out_w), (err_r, err_w) = os.pipe(), os.pipe(), os.pipe()
        proc = ForkedProc(open(in_w, "wb"), open(out_r, "rb"), open(err_r, "rb"))
        proc.template = self
        replies: queue.Queue[dict[str, Any]] = queue.Queue()
        self._pending[rid] = (proc, replies)
        request = os.memfd_create("kit-fork-request", os.MFD_CLOEXEC)  # any size: a packet holds about 208 KB
        try:
            with self._send_lock:
                sealed = memoryview(seal(self.key, TO_TEMPLATE, self._sent, body))
                while sealed:
                    sealed = sealed[os.write(request, sealed):]
                socket.send_fds(self.sock, [b"fork"], [in_r, out_w, err_w, ctrl_fd, request])
                self._sent += 1
        except OSError as e:
            self._pending.pop(rid, None)
            replies.put({"op": FORK_REFUSED, "why": f"the rank template cannot be reached ({e.strerror})"})
        finally:
            for fd in (in_r, out_w, err_w, request):
                os.close(fd)
        try:
            reply = replies.get(timeout=FORK_TIMEOUT_S)
        except queue.Empty:  # stopped (SIGSTOP, a debugger) or starved: this start goes on without it
            self._pending.pop(rid, None)
            reply = {"op": FORK_REFUSED, "why": f"the rank template (pid {self.pid}) did not answer a fork request "
                                              f"within {FORK_TIMEOUT_S:g} s (is it stopped?)"}
        if reply["op"] != FORKED:
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
        why = self.exit_reason()
        for _, replies in list(self._pending.values()):
            replies.put({"op": FORK_REFUSED, "why": why})
        self._orphaned()

    def _on_message(self, msg: dict[str, Any]) -> None:
        op = msg.get("op")
        if op == TEMPLATE_READY:
            self.info = msg
            self._ready.set()
        elif op in (FORKED, FORK_REFUSED):
            pending = self._pending.pop(int(msg["id"]), None)
            if pending is None:  # answered after fork() gave up: its pipes are closed, so such a rank exits
                return
            proc, replies = pending
            if op == FORKED:  # registered here, before the next message: it may be this rank's exit
                proc.pid, proc.seen = int(msg["pid"]), {k: msg[k] for k in ("threads", "cuda_initialized")}
                proc.start = start_time(proc.pid)
                self._procs[proc.pid] = proc
            replies.put(msg)
        elif op == RANK_EXITED:
            proc = self._procs.pop(int(msg["pid"]), None)
            if proc is not None:
                proc.exited(int(msg["code"]))

    def _orphaned(self) -> None:
        """The kernel's channel to the template ended. Usually the template died, so its ranks got their
        parent-death SIGKILL; if it lives (the channel alone failed) its ranks live on, unreported, until
        their cluster stops them. Either way each is reported once its pid is no longer the rank's, with
        the template's fate as the cause (`ForkedProc.lost`)."""
        code = None
        while self._procs:
            code = self.death() if code is None else code
            for pid, proc in list(self._procs.items()):
                if not is_ours(pid, proc.start):
                    proc.lost = (self.pid, code)
                    # parent-death SIGKILL; with the template alive the status is unknown: 1, and `lost` says why
                    self._procs.pop(pid).exited(-signal.SIGKILL if code is not None else 1)
            time.sleep(0.02 if code is not None else 0.2)

    def busy(self) -> bool:
        """Some rank it forked still runs (a gone template learns it from /proc, not from reports)."""
        return bool(self._procs)

    def close(self) -> None:
        """End of file on its stdin: it SIGKILLs the ranks it forked that still live, and exits."""
        end_of_file(self.proc)
        self.watchdog.close()  # sweeps anything still marked KIT_TEMPLATE=<id>
        self.sock.close()
        self.log.close()
