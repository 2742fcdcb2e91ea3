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

import ctypes
import gc
import json
import os
import re
import select
import signal
import socket
import stat
import sys
import time
import traceback
from typing import Any

from kit.protocol import FROM_TEMPLATE, KEY_BYTES, SESSION_SLOT, TO_TEMPLATE, seal, unseal

__all__ = ["main", "why_unsafe", "observed", "overwrite", "become_rank_process",
           "reseed_like_a_fresh_interpreter"]
_PRELOAD = ("torch", "torch.distributed", "kit.rank.worker")  # what every rank imports before its first cell


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


def _find(which: str, old: bytes) -> int:
    """Address of the entry `old` in this process's original argv or environment block: what
    /proc/PID/cmdline and /proc/PID/environ show (ps, the watchdog and the stale-rank reaper read them)."""
    with open(f"/proc/self/{which}", "rb") as f:
        block = f.read()
    with open("/proc/self/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()  # index = field number - 3
    start = int(fields[45 if which == "cmdline" else 47])  # arg_start (field 48) or env_start (field 50)
    at = 0 if block.startswith(old + b"\0") else block.find(b"\0" + old + b"\0") + 1
    if at <= 0 and not block.startswith(old + b"\0"):
        raise OSError(f"{old[:20]!r}... is not in /proc/self/{which}")
    return start + at


def overwrite(which: str, old: bytes, new: bytes) -> None:
    """Replace an entry in place (a fork cannot exec a new argv or environment), padded with NULs."""
    if len(new) > len(old):
        raise OSError(f"{new!r} is longer than the {len(old)} bytes it replaces")
    where = _find(which, old)
    with open("/proc/self/mem", "r+b", buffering=0) as mem:
        mem.seek(where)
        mem.write(new + b"\0" * (len(old) - len(new)))


_PLACEHOLDER = b"KIT_SESSION=" + b"?" * SESSION_SLOT


def become_rank_process(session: str) -> None:
    """Carry the cluster's `KIT_SESSION=<session>` in /proc/PID/environ like a fresh worker (the watchdog
    and a later kernel's reaper look for it), and show up in ps as `python -m kit.rank.worker`."""
    overwrite("environ", _PLACEHOLDER, b"KIT_SESSION=" + session.encode())
    overwrite("cmdline", b"kit.rank.template", b"kit.rank.worker")


def reseed_like_a_fresh_interpreter() -> None:
    """A fork copies the template's random generators, so every rank (and every restart) would draw the
    same numbers. A fresh interpreter seeds each from the OS when it is created: torch's CPU generator
    at import, Python's `random` at import (CPython also re-seeds it after a fork), numpy's global
    generator at its import. Do the same here. CUDA's generators need nothing: the template never
    initialised CUDA, so a rank creates them itself, seeded as in a fresh interpreter."""
    import random

    random.seed()  # from os.urandom, as at import
    torch = sys.modules.get("torch")
    if torch is not None:
        torch.default_generator.seed()  # a non-deterministic seed, as the generator's creation at import
        if torch.cuda.is_initialized():  # never in a template (checked before the fork); kept for truth
            for i in range(torch.cuda.device_count()):
                torch.cuda.default_generators[i].seed()
    if "numpy.random" in sys.modules:
        sys.modules["numpy.random"].seed()


def _blas_threads(n: int) -> None:
    """numpy's OpenBLAS was loaded with one thread (so the template has no pool); give the rank its share."""
    try:
        with open("/proc/self/maps") as f:
            paths = {line.split()[-1] for line in f if "openblas" in line.lower() and line.rstrip().endswith(".so")}
    except OSError:
        return
    for path in paths:
        lib = ctypes.CDLL(path)
        for name in ("openblas_set_num_threads", "scipy_openblas_set_num_threads64_", "openblas_set_num_threads64_"):
            if hasattr(lib, name):
                getattr(lib, name)(ctypes.c_int(n))
                break


_PAGE = os.sysconf("SC_PAGE_SIZE")
_MADV_POPULATE_READ = 22  # Linux 5.14+


def resident_file_pages() -> list[tuple[int, int]]:
    """(address, bytes) runs of file-backed pages (torch's libraries, mostly) mapped in this process now."""
    runs: list[tuple[int, int]] = []
    present = bytes(b >> 7 for b in range(256))  # top byte -> 1 when bit 63 of the entry (present) is set
    with open("/proc/self/maps") as maps, open("/proc/self/pagemap", "rb", buffering=0) as pagemap:
        for line in maps:
            parts = line.split()
            if len(parts) < 6 or not parts[5].startswith("/"):
                continue
            start, end = (int(x, 16) for x in parts[0].split("-"))
            pagemap.seek(start // _PAGE * 8)
            high = pagemap.read((end - start) // _PAGE * 8)[7::8]  # each little-endian entry's top byte
            for m in re.finditer(b"\x01+", high.translate(present)):
                runs.append((start + m.start() * _PAGE, (m.end() - m.start()) * _PAGE))
    return runs


def _map_like_the_template(runs: list[tuple[int, int]]) -> None:
    """A fork copies the page tables of anonymous memory only: library pages the template touched while
    importing torch are not mapped in the child until touched again, so the rank's RSS would grow by them
    later, inside a user's memory measurement. Map them now, as a fresh interpreter's own import did."""
    madvise = ctypes.CDLL(None, use_errno=True).madvise
    madvise.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
    for address, length in runs:
        if madvise(address, length, _MADV_POPULATE_READ) != 0 and ctypes.get_errno() == 22:
            return  # EINVAL: a kernel before 5.14; RSS then grows as pages are touched


class Template:
    def __init__(self, sock: socket.socket, key: bytes):
        self.sock, self.key = sock, key
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
                self.send({"op": "exited", "pid": pid, "code": os.waitstatus_to_exitcode(status)})

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
            self.send(dict(seen, op="forked", id=req["id"], pid=pid))
        else:
            self.send({"op": "refused", "id": req["id"], "why": why})
        for fd in fds:
            os.close(fd)


def _request(fds: list[int], limit: int = 64 << 20) -> bytes:  # the kernel's REQUEST_LIMIT_BYTES
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


def _become_rank(template: Template, req: dict[str, Any], fds: list[int]) -> None:
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
        os.environ.update(req["env"], KIT_CTRL_FD=str(ctrl), KIT_PARENT_PID=str(os.getppid()), KIT_PDEATHSIG="1")
        if sys.path and sys.path[0] == os.getcwd():  # `python -m` put the template's cwd first: use the kernel's
            sys.path[0] = req["cwd"]
        os.chdir(req["cwd"])
        sys.argv = [os.path.join(os.path.dirname(__file__), "worker.py")]
        reseed_like_a_fresh_interpreter()
        _blas_threads(int(req["env"].get("KIT_THREADS", "1")))
        _map_like_the_template(template.resident)
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
    template = Template(sock, key)
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
        _find("environ", _PLACEHOLDER), _find("cmdline", b"kit.rank.template")
        with open("/proc/self/mem", "r+b", buffering=0):
            pass
    except OSError as e:
        why = why or f"a rank could not carry its session marker ({e}), so the watchdog could not find it"
    template.send(dict(observed(), op="ready", pid=os.getpid(), unsafe=why, preload_s=time.monotonic() - t0,
                       torch=str(sys.modules["torch"].__version__),
                       resident_file_mib=sum(n for _, n in template.resident) / 2**20))
    template.serve()


if __name__ == "__main__":
    main()
