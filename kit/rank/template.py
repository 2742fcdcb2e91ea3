"""`python -m kit.rank.template`: the rank template ("zygote") that ranks are forked from.

A fresh interpreter started by the kernel exactly as workers are (own session, key on stdin, a private
socket), never a fork of the kernel. It imports torch and what every rank imports, then waits. It never
initialises CUDA, runs no torch op (so no OpenMP or intra-op pool exists), starts no thread and holds no
lock, so `os.fork()` here copies one quiet thread. Before every fork it checks that this still holds
(one entry in /proc/self/task, `torch.cuda.is_initialized()` false) and refuses the fork with the reason
otherwise; the kernel then starts fresh interpreters. The child becomes a rank: its own session, the
pipes and control socket the kernel passed over SCM_RIGHTS on fds 0/1/2 and KIT_CTRL_FD, the cluster's
environment and session marker, a parent-death signal; only then does `kit.rank.worker.main` touch
devices and join the process group, exactly as in a fresh worker.

Messages are JSON, each signed (kit.protocol.seal) with the key that arrived on stdin. The template's
replies are one SOCK_SEQPACKET packet each; a fork request is a packet carrying five descriptors, the
last a memfd holding the signed request (a packet holds about 208 KB, a rank's environment can be
larger). End of file on stdin (the kernel died or closed the template) ends the template and every
rank it forked that is still alive.
"""
from __future__ import annotations

import gc
import json
import os
import select
import signal
import socket
import stat
import sys
import time
import traceback
from typing import Any

from kit.messages import FORK_REFUSED, FORKED, RANK_EXITED, TEMPLATE_READY
from kit.protocol import FROM_TEMPLATE, KEY_BYTES, TEMPLATE_REQUEST_LIMIT_BYTES, TO_TEMPLATE, seal, unseal
from kit.rank.fork_child import (PLACEHOLDER, become_rank_process, find_entry, map_like_the_template,
                                 reseed_like_a_fresh_interpreter, resident_file_pages, set_blas_threads)
from kit.units import MIB

__all__ = ["main", "why_unsafe", "observed"]
# What every rank imports before its first cell, and torch._dynamo: torch imports it (with sympy) the first time a
# process builds an optimizer (torch/_compile.py, _disable_dynamo), 1.3 s of CPU and 70 MiB in each rank. Imported
# here once, every rank forked later shares it: the import itself is what torch would do, only earlier.
_PRELOAD = ("torch", "torch.distributed", "torch._dynamo", "kit.rank.worker")


def observed() -> dict[str, Any]:
    """What the fork would copy: this process's threads and whether torch initialised CUDA."""
    torch = sys.modules.get("torch")
    return {"threads": len(os.listdir("/proc/self/task")),
            "cuda_initialized": bool(torch is not None and torch.cuda.is_initialized())}


def why_unsafe() -> str | None:
    """Why forking this process now could hand a rank a broken runtime, or None when it is safe."""
    tasks = sorted(os.listdir("/proc/self/task"))
    if len(tasks) != 1:
        names = []
        for tid in tasks:
            try:
                with open(f"/proc/self/task/{tid}/comm") as f:
                    names.append(f.read().strip())
            except OSError:
                pass
        return (f"the rank template runs {len(tasks)} threads ({', '.join(names)}); a fork copies only one, and a "
                f"lock another one held would stay locked in every rank")
    torch = sys.modules.get("torch")
    if torch is not None and torch.cuda.is_initialized():
        return "CUDA is initialised in the rank template, and a forked child cannot use it"
    return None


class TemplateServer:
    """This process's side of the kernel's handle (kit/engine/template_process.Template): forks a rank per
    request on `sock`, reaps them, and tells the kernel when each exits."""

    def __init__(self, sock: socket.socket, key: bytes):
        self.sock, self.key = sock, key
        self.pid = os.getpid()  # read before a fork: in the child, getppid() is init's once the template died
        self.sent = self.received = 0
        self.children: set[int] = set()
        self.resident: list[tuple[int, int]] = []  # measured after the imports; the ranks map the same pages
        self.wake_r, self.wake_w = os.pipe()
        os.set_blocking(self.wake_w, False)

    def send(self, msg: dict[str, Any]) -> None:
        try:
            self.sock.send(seal(self.key, FROM_TEMPLATE, self.sent, json.dumps(msg).encode()))
        except OSError:
            return  # the kernel's end is closed: its ranks, our children, still run; end of file on stdin ends us
        self.sent += 1

    def serve(self) -> None:
        signal.signal(signal.SIGCHLD, lambda *_: None)  # the C handler writes the wake-up pipe; select returns
        signal.set_wakeup_fd(self.wake_w, warn_on_full_buffer=False)
        while True:
            try:
                ready, _, _ = select.select([0, self.sock, self.wake_r], [], [])
            except InterruptedError:
                ready = []
            if self.wake_r in ready:
                os.read(self.wake_r, 4096)
            self.reap()
            if 0 in ready and not os.read(0, 1):
                self.end()  # the kernel is gone, or closed us: so are our ranks
            if self.sock in ready:
                self.on_packet()

    def reap(self) -> None:
        for pid in list(self.children):
            done, status = os.waitpid(pid, os.WNOHANG)
            if done:
                self.children.discard(pid)
                self.send({"op": RANK_EXITED, "pid": pid, "code": os.waitstatus_to_exitcode(status)})

    def end(self) -> None:
        for pid in self.children:  # unreaped children of ours: the pid cannot belong to anyone else
            try:
                os.killpg(pid, signal.SIGKILL)
            except OSError:
                pass
        os._exit(0)

    def on_packet(self) -> None:
        data, fds, _, _ = socket.recv_fds(self.sock, 1 << 16, 5)
        if not data:
            self.end()
        try:
            req = json.loads(unseal(self.key, TO_TEMPLATE, self.received, _request(fds)))
            self.received += 1
        except Exception:
            for fd in fds:
                os.close(fd)
            os._exit(71)  # a packet that is not the kernel's: never serve this socket again
        os.close(fds.pop())
        why = why_unsafe()
        if why is None:
            gc.collect()  # only what came since the last freeze: nothing half-collected crosses the fork
            gc.freeze()
            seen = observed()  # measured just before the fork, and reported: the tests check it
            pid = os.fork()
            if pid == 0:
                _become_rank(self, req, fds)
            self.children.add(pid)
            self.send(dict(seen, op=FORKED, id=req["id"], pid=pid))
        else:
            self.send({"op": FORK_REFUSED, "id": req["id"], "why": why})
        for fd in fds:
            os.close(fd)


def _request(fds: list[int], limit: int = TEMPLATE_REQUEST_LIMIT_BYTES) -> bytes:
    """The signed request in the memfd that came last with the packet (a regular file: reading never blocks)."""
    if len(fds) != 5:
        raise ValueError(f"expected 5 descriptors, got {len(fds)}")
    st = os.fstat(fds[-1])
    if not stat.S_ISREG(st.st_mode) or st.st_size > limit:
        raise ValueError("the request is not a memfd within the size limit")
    chunks, at = [], 0
    while at < st.st_size:
        chunk = os.pread(fds[-1], st.st_size - at, at)
        if not chunk:
            break
        chunks.append(chunk)
        at += len(chunk)
    return b"".join(chunks)


def _become_rank(template: TemplateServer, req: dict[str, Any], fds: list[int]) -> None:
    """In the forked child: take the rank's pipes, session and environment, then run the worker."""
    try:
        os.setsid()  # own session and process group, like a fresh worker
        signal.set_wakeup_fd(-1)
        for sig in (signal.SIGCHLD, signal.SIGINT, signal.SIGTERM):
            signal.signal(sig, signal.SIG_DFL)
        stdin_r, stdout_w, stderr_w, ctrl = fds
        for fd, target in ((stdin_r, 0), (stdout_w, 1), (stderr_w, 2)):
            os.dup2(fd, target)
            os.close(fd)
        template.sock.close()
        os.close(template.wake_r)
        os.close(template.wake_w)
        become_rank_process(req["session"])
        os.environ.clear()
        os.environ.update(req["env"], KIT_CTRL_FD=str(ctrl), KIT_PARENT_PID=str(template.pid), KIT_PDEATHSIG="1")
        if sys.path and sys.path[0] == os.getcwd():  # `python -m` put the template's cwd first: use the kernel's
            sys.path[0] = req["cwd"]
        os.chdir(req["cwd"])
        sys.argv = [os.path.join(os.path.dirname(__file__), "worker.py")]
        reseed_like_a_fresh_interpreter()
        set_blas_threads(int(req["env"].get("KIT_THREADS", "1")))
        map_like_the_template(template.resident)
        gc.enable()
    except BaseException:  # noqa: B036 - the child must never return into the template's loop
        traceback.print_exc()
        sys.stderr.flush()
        os._exit(70)
    from kit.rank import worker

    try:
        worker.main()
    except SystemExit as e:
        os._exit(e.code if isinstance(e.code, int) else (0 if e.code is None else 1))
    except BaseException:  # noqa: B036
        traceback.print_exc()
        sys.stderr.flush()
        os._exit(1)
    os._exit(0)


def main() -> None:
    gc.disable()  # until the fork: a collection now would only dirty pages the ranks could share
    from kit.rank.process import die_with_parent

    env = os.environ
    die_with_parent(int(env["KIT_KERNEL_PID"]), env.get("KIT_PDEATHSIG") == "1")
    key = b""
    while len(key) < KEY_BYTES:  # the key arrives on stdin, never argv or the environment
        chunk = os.read(0, KEY_BYTES - len(key))
        if not chunk:
            os._exit(70)
        key += chunk
    sock = socket.socket(fileno=int(env.pop("KIT_TEMPLATE_FD")))
    sock.set_inheritable(False)
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # only the kernel's end of file ends the template
    template = TemplateServer(sock, key)
    t0 = time.monotonic()
    for name in _PRELOAD:
        __import__(name)
    gc.collect()  # now, not at the first fork (0.1-0.4 s for torch's objects); frozen, ranks never copy them
    gc.freeze()
    try:
        template.resident = resident_file_pages()
    except OSError:
        pass  # no pagemap: ranks' RSS then grows as they touch library pages
    why = why_unsafe()
    try:
        find_entry("environ", PLACEHOLDER), find_entry("cmdline", b"kit.rank.template")
        with open("/proc/self/mem", "r+b", buffering=0):
            pass
    except OSError as e:
        why = why or f"a rank could not carry its session marker ({e}), so the watchdog could not find it"
    template.send(dict(observed(), op=TEMPLATE_READY, pid=os.getpid(), unsafe=why, preload_s=time.monotonic() - t0,
                       torch=str(sys.modules["torch"].__version__),
                       resident_file_mib=sum(n for _, n in template.resident) / MIB))
    template.serve()


if __name__ == "__main__":
    main()
