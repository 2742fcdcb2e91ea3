"""`python -m kit.rank.worker`: one rank. A fresh interpreter, never a fork of the kernel.

Start-up: die with the kernel (parent-death signal and a lifeline pipe), read the session
key from stdin, say hello on the inherited control socket, import torch and join the
process group, then serve requests: cells run on the main thread in one persistent
namespace, while a control thread answers "where are you?" and pre-flight verdicts.
Never imports IPython, ipywidgets or matplotlib.
"""
from __future__ import annotations

import ctypes
import faulthandler
import importlib
import os
import queue
import signal
import socket
import sys
import threading
import time
import traceback
import types
from typing import Any

from kit.rank import cell as _cell
from kit.rank import hooks
from kit.rank.ledger import Ledger, install
from kit.rank.setup import TorchSetup, looks_like_pg_failure, setup_torch
from kit.protocol import KEY_BYTES, Channel

__all__ = ["main"]


def _die_with_parent(kernel_pid: int, use_pdeathsig: bool) -> None:
    # PR_SET_PDEATHSIG fires when the spawning *thread* exits, so the kernel asks for it
    # only when it spawned us from its main thread; the lifeline pipe covers every case.
    if use_pdeathsig and sys.platform.startswith("linux"):
        try:
            ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
        except OSError:
            pass
    if os.getppid() != kernel_pid:  # the kernel died before we set the signal
        os._exit(70)


def _exit_now(*_: Any) -> None:
    try:
        os.killpg(os.getpid(), signal.SIGKILL)  # our own session: us and our cell's children
    finally:
        os._exit(70)


class _Interrupts:
    """SIGINT raises KeyboardInterrupt only inside user code, never mid-frame on the socket."""

    def __init__(self) -> None:
        self.armed = False
        self.deferred = 0
        self.pending = False
        signal.signal(signal.SIGINT, self._handler)

    def _handler(self, signum: int, frame: Any) -> None:
        if self.armed and not self.deferred:
            raise KeyboardInterrupt
        self.pending = self.armed

    def raise_pending(self) -> None:
        if self.pending and self.armed and not self.deferred:
            self.pending = False
            raise KeyboardInterrupt


class Worker:
    def __init__(self, chan: Channel, rank: int, world_size: int, marker: bytes):
        self.chan, self.rank, self.world_size, self.marker = chan, rank, world_size, marker
        self.requests: queue.Queue[tuple[str, Any]] = queue.Queue()
        self.interrupts = _Interrupts()
        self.ledger = Ledger(rank)
        self.main_ident = threading.get_ident()
        self.module = types.ModuleType("__main__")  # a real module, so cell classes pickle
        self.ns: dict[str, Any] = self.module.__dict__
        self.cells = 0
        self.pg: dict[str, Any] = {}

    def adopt(self, setup: TorchSetup, local_rank: int) -> None:
        """Torch is up: keep the group's re-init, wrap the collectives, predefine the cell names."""
        torch, dist = sys.modules["torch"], sys.modules["torch.distributed"]
        self.pg.update(init=setup.init, store=setup.store)
        install(self.ledger, self.send)
        hooks._send = self.chan.send
        self.ns.update(rank=self.rank, world_size=self.world_size, local_rank=local_rank, device=setup.device,
                       torch=torch, dist=dist, display=self.display)

    # -- sending from the main thread without tearing a frame on Ctrl-C
    def send(self, kind: str, body: Any) -> None:
        self.interrupts.deferred += 1
        try:
            self.chan.send(kind, body)
        finally:
            self.interrupts.deferred -= 1
        self.interrupts.raise_pending()

    def control_loop(self) -> None:
        """Runs on a daemon thread: reads every frame the kernel sends."""
        try:
            while True:
                kind, body = self.chan.recv()
                if kind == "verdict":
                    self.ledger.deliver(body)
                elif kind == "where":
                    self.chan.send("where", {"id": body["id"], "text": self.where()})
                else:
                    self.requests.put((kind, body))
        except BaseException:
            _exit_now()  # kernel gone or channel tampered with: never linger

    def where(self) -> str:
        frame = sys._current_frames().get(self.main_ident)
        stack = traceback.extract_stack(frame) if frame is not None else []
        user = [f for f in stack if f.filename.startswith("<cell")]
        lines = []
        cur = self.ledger.current
        if cur is not None:
            lines.append(cur.state(time.monotonic()))
        elif user:
            lines.append(f"running {user[-1].filename} line {user[-1].lineno}: {(user[-1].line or '').strip()}")
        else:
            lines.append("idle" if self.requests.empty() and not user else "busy in kit code")
        if user:
            lines.append("stack (innermost last):")
            lines += [f"  {f.filename} line {f.lineno}, in {f.name}: {(f.line or '').strip()}" for f in user]
            if stack and stack[-1] is not user[-1]:
                last = stack[-1]
                lines.append(f"  ... {os.path.basename(last.filename)}:{last.lineno} in {last.name}")
        recent = self.ledger.tail()
        if recent:
            lines.append("recent collectives (oldest first):")
            lines += ["  " + line for line in recent]
        return "\n".join(lines)

    def serve(self) -> None:
        threading.Thread(target=self.control_loop, name="kit-control", daemon=True).start()
        while True:
            try:
                kind, body = self.requests.get()
            except KeyboardInterrupt:
                continue  # a late interrupt between cells is harmless
            if kind == "shutdown":
                return
            reply = self.handle(kind, body)
            self._flush_output(body["id"])
            self.send("done", reply)

    def handle(self, kind: str, body: dict[str, Any]) -> dict[str, Any]:
        reply: dict[str, Any] = {"id": body["id"], "ok": True, "value": None, "error": None, "figures": []}
        label = _cell.cell_filename(body.get("cell", self.cells + 1)) if kind == "exec" else f"<{kind}>"
        self.ledger.begin_request(body["id"], bool(body.get("check", False)), label)
        self.interrupts.pending, self.interrupts.armed = False, True
        try:
            value = self._dispatch(kind, body)
            if value is not _cell.NO_VALUE and value is not None:  # like the REPL: None is not shown
                reply["value"] = _cell.pack_value(value)
        except BaseException as e:  # KeyboardInterrupt and SystemExit included: the rank lives on
            if looks_like_pg_failure(e):
                self.ledger.suspect = True
            reply["ok"] = False
            reply["error"] = {"ename": type(e).__name__, "evalue": str(e), "traceback": _cell.format_exception(e),
                              "line": _cell.cell_line(e)}
        finally:
            self.interrupts.armed = False
        reply["suspect"] = self.ledger.suspect
        dist = sys.modules.get("torch.distributed")
        reply["pg_gone"] = kind != "reset_pg" and dist is not None and not dist.is_initialized()
        try:
            reply["figures"] = _cell.collect_figures()
        except Exception:
            pass
        return reply

    def _dispatch(self, kind: str, body: dict[str, Any]) -> Any:
        if kind == "exec":
            self.cells += 1
            return _cell.execute(body["code"], self.ns, _cell.cell_filename(body.get("cell", self.cells)))
        if kind == "call":
            module, _, name = body["target"].partition(":")
            fn = getattr(importlib.import_module(module), name)
            return fn(*body.get("args", ()), **body.get("kwargs", {}))
        if kind == "push":
            self.ns.update(body["values"])
            return _cell.NO_VALUE
        if kind == "pull":
            missing = [n for n in body["names"] if n not in self.ns]
            if missing:
                raise NameError(f"name(s) {', '.join(map(repr, missing))} not defined on rank {self.rank}")
            return {n: self.ns[n] for n in body["names"]}
        if kind == "reset_pg":
            return self.reset_process_group(body["prefix"])
        raise ValueError(f"unknown request {kind!r}")

    def display(self, *objs: Any) -> None:
        """`display(obj)` in a cell: shown in the notebook now, labelled with this rank (figures,
        HTML, anything with a repr), like IPython's display."""
        for obj in objs:
            sys.stdout.flush()  # keep it after the text printed before it
            self.send("display", {"id": self.ledger.request_id, "bundle": _cell.mime_bundle(obj)})

    def reset_process_group(self, prefix: str) -> str:
        """Destroy and re-create the default group on a fresh store prefix; Python state stays."""
        dist = sys.modules["torch.distributed"]
        if dist.is_initialized():
            dist.destroy_process_group()
        self.pg["init"](prefix)
        return prefix

    def _flush_output(self, request_id: int) -> None:
        # Python buffers, then C stdio buffers, then a marker on each fd: the kernel knows
        # this request's output is complete when it has read both markers.
        for stream in (sys.stdout, sys.stderr):
            try:
                stream.flush()
            except Exception:
                pass
        try:
            ctypes.CDLL(None).fflush(None)
        except Exception:
            pass
        mark = self.marker + str(request_id).encode() + b"\n"
        for fd in (1, 2):
            try:
                os.write(fd, mark)
            except OSError:
                pass


def main() -> None:
    env = os.environ
    _die_with_parent(int(env["KIT_KERNEL_PID"]), env.get("KIT_PDEATHSIG") == "1")
    key = b""
    while len(key) < KEY_BYTES:  # the key arrives on stdin: never on argv or in the environment
        chunk = os.read(0, KEY_BYTES - len(key))
        if not chunk:
            os._exit(70)
        key += chunk
    lifeline = os.dup(0)
    devnull = os.open(os.devnull, os.O_RDONLY)
    os.dup2(devnull, 0)  # cells and their children must not read or inherit the lifeline
    os.close(devnull)
    sock = socket.socket(fileno=int(env.pop("KIT_CTRL_FD")))
    sock.set_inheritable(False)
    chan = Channel(sock, key, is_kernel=False)
    threading.Thread(target=lambda: (os.read(lifeline, 1), _exit_now()), name="kit-lifeline", daemon=True).start()
    signal.signal(signal.SIGTERM, _exit_now)
    faulthandler.enable(all_threads=False)  # a segfault or abort prints the cell's line on stderr
    rank, world_size = int(env["RANK"]), int(env["WORLD_SIZE"])
    worker = Worker(chan, rank, world_size, env.pop("KIT_MARKER").encode())
    chan.send("hello", {"pid": os.getpid(), "rank": rank})
    try:
        torch_setup = setup_torch(rank, world_size, dict(env))
        worker.adopt(torch_setup, int(env["LOCAL_RANK"]))
    except BaseException as e:
        chan.send("start_failed", {"rank": rank, "traceback": "".join(traceback.format_exception(e))})
        sys.stderr.flush()
        os._exit(1)
    sys.modules["__main__"] = worker.module
    chan.send("ready", torch_setup.info)
    worker.serve()
    os._exit(0)


if __name__ == "__main__":
    main()
