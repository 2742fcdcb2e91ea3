"""`python -m kit.rank.worker`: one rank. A fresh interpreter or a fork of the rank template
(kit/rank/template.py, itself a fresh interpreter), never a fork of the kernel.

Start-up: die with the kernel (parent-death signal and a lifeline pipe), read the session
key from stdin, say hello on the inherited control socket, import torch and join the
process group, then serve requests: cells run on the main thread in one persistent
namespace, while a control thread answers "where are you?" and pre-flight verdicts.
Never imports IPython, ipywidgets or matplotlib.
"""
from __future__ import annotations

import faulthandler
import os
import queue
import signal
import socket
import sys
import threading
import traceback
import types
from typing import Any, Callable

from kit.rank import cell as _cell
from kit.rank import attach, hooks, peers, stop_request
from kit.rank.control import ControlThread
from kit.rank.ledger import Ledger, install
from kit.rank.ledger_dtensor import install_dtensor
from kit.rank.process import Interrupts, die_with_parent, exit_now, trim_heap
from kit.rank.requests import dispatch
from kit.rank.reply import bare, error_info, format_failure, safe_str, stripped
from kit.rank.setup import TorchSetup, looks_like_pg_failure, setup_torch
from kit.rank.streams import Streams
from kit.messages import DISPLAY, DONE, EXEC, HELLO, PULL, READY, RESET_PG, SHUTDOWN, START_FAILED, Reply
from kit.protocol import KEY_BYTES, Channel

__all__ = ["main"]

class Worker:
    """One rank: cells and calls served on the main thread (`serve`), in one persistent namespace;
    the kernel's control frames read on a daemon thread (`control`, kit/rank/control.py)."""

    def __init__(self, chan: Channel, rank: int, world_size: int, marker: bytes):
        self.chan, self.rank, self.world_size = chan, rank, world_size
        self.streams = Streams(marker)
        self.requests: queue.Queue[tuple[str, Any]] = queue.Queue()
        self.interrupts = Interrupts()
        self.ledger = Ledger(rank)
        self.main_ident = threading.get_ident()
        self.module = types.ModuleType("__main__")  # a real module, so cell classes pickle
        self.ns: dict[str, Any] = self.module.__dict__
        self.cells = 0
        self.init_group: Callable[[str], None] | None = None  # joins the default group on a store prefix (adopt)
        self.staged: tuple[int, dict[str, Any]] | None = None  # a push not yet kept (all ranks or none)
        self.group_sockets: dict[int, str] = {}  # the process group's connections (kit.rank.peers)
        self.display_bytes = 0  # display() output sent in this request (capped)
        self.busy: str | None = None  # what the main thread is serving, for `where` ("running In [7]")
        self.forked = False
        self.remote = False  # attached over TCP (torchrun), not a child of the kernel
        self._labels: set[str] = set()
        self.control = ControlThread(chan, rank, self.streams, self.ledger, self.interrupts, self.requests,
                                     self.main_ident, lambda: self.busy, lambda: self.group_sockets)
        os.register_at_fork(after_in_child=self._after_fork)

    def _after_fork(self) -> None:
        # A cell's os.fork() child shares our socket: one frame from it would break the MAC
        # sequence, and the kernel would declare this live rank dead. The child stays silent.
        self.forked = True
        self.chan.disown()
        hooks._send = None

    def adopt(self, setup: TorchSetup, local_rank: int) -> None:
        """Torch is up: keep the group's re-init, wrap the collectives, predefine the cell names."""
        torch, dist = sys.modules["torch"], sys.modules["torch.distributed"]
        port = os.environ.get("MASTER_PORT", "")
        store_port = int(port) if self.remote and port.isdigit() else None  # torchrun's store stays connected
        self.group_sockets = peers.socket_fds({self.chan.fileno()}, store_port)

        def init(prefix: str) -> None:  # a re-created group: its sockets are the ones it opened
            before = peers.socket_fds()
            setup.init(prefix)
            self.group_sockets = {fd: t for fd, t in peers.socket_fds().items() if before.get(fd) != t}

        self.init_group = init  # it holds `setup`, and so the store, for the rank's life
        install(self.ledger, self.send)
        install_dtensor(self.ledger)
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

    def serve(self) -> None:
        self.interrupts.shielded |= {Worker.serve.__code__, Worker.handle.__code__}
        threading.Thread(target=self.control.loop, name="kit-control", daemon=True).start()
        while True:
            try:
                kind, body = self.requests.get()
            except KeyboardInterrupt:
                continue  # a late interrupt between cells is harmless
            if kind == SHUTDOWN:
                return
            try:
                reply = self.handle(kind, body)
            except BaseException as e:  # noqa: B036 - a kit bug here must cost one request, not the rank
                reply = bare({"id": body["id"], "ok": False, "error": True}, f"{type(e).__name__}: {safe_str(e)}")
            extra = [f"[kit] rank {self.rank}: the cell replaced the SIGINT handler; the kit put its own back, so "
                     f"interrupts work in the next cells"] if self.interrupts.restore() else []  # not past this cell
            notes = self.streams.end_request(body["id"], extra)
            if notes:
                reply["notes"] = notes
            self.busy = None
            trim_heap()  # before the reply: once a cell is done, what it freed is no longer resident
            self._send_done(reply)

    def _send_done(self, reply: Reply) -> None:
        """The kernel waits for this frame: it must go, whatever the reply holds. Encoding fails
        before a byte is written (the channel stays in step), so a reply that does not pickle or
        is over the frame limit is sent again stripped to text, and at worst as a bare error."""
        why = ""
        for build in (lambda: reply, lambda: stripped(reply, why), lambda: bare(reply, why)):
            try:
                self.send(DONE, build())
                return
            except OSError:
                exit_now()  # the channel is closed: the kernel is gone
            except BaseException as e:  # noqa: B036 - a __reduce__ may raise anything
                why = f"{type(e).__name__}: {safe_str(e)[:300]}"

    def _filename(self, kind: str, body: dict[str, Any]) -> str:
        """`<cell In [7]>` (the notebook's label) or `<cell 5>` (the kit's counter); unique per
        rank, so an older cell's functions keep their own source lines in tracebacks."""
        if kind != EXEC:
            return f"<{kind}>"
        label = body.get("label")
        base = _cell.cell_filename(label if isinstance(label, str) and label else body.get("cell", self.cells + 1))
        name, n = base, 1
        while name in self._labels:
            n += 1
            name = f"{base[:-1]} #{n}>"
        self._labels.add(name)
        return name

    def handle(self, kind: str, body: dict[str, Any]) -> Reply:
        reply: Reply = {"id": body["id"], "ok": True, "value": None, "error": None, "figures": []}
        filename = self._filename(kind, body)
        self.busy = _cell.cell_label(filename) if kind == EXEC else f"a {kind!r} request"
        self.ledger.begin_request(body["id"], bool(body.get("check", False)), filename)
        stop_request.serving(body["id"])  # before arming: an interrupt landing in its frame would escape handle()
        self.interrupts.pending, self.interrupts.handled, self.interrupts.armed = False, 0, True
        self.display_bytes = 0
        error: BaseException | None = None
        try:
            value = dispatch(self, kind, body, filename)
            if kind == PULL:
                reply["value"] = value
            elif value is not _cell.NO_VALUE and value is not None:  # like the REPL: None is not shown
                reply["value"] = _cell.pack_value(value)
        except BaseException as e:  # noqa: B036 - KeyboardInterrupt and SystemExit too: the rank lives on
            self.interrupts.armed = False  # first: nothing below (formatting the error) may be interrupted
            error = e
        finally:
            self.interrupts.armed = False
            stop_request.serving(None)  # a Stop that comes later is stale: it never stops the next request
        if self.forked:
            self._leave_fork(error)
        if error is not None:
            if looks_like_pg_failure(error):
                self.ledger.suspect = True
            reply["ok"] = False
            label, line = _cell.cell_frame(error)
            reply["error"] = error_info(error, format_failure(error, _cell.format_exception), line, label)
            _cell.release_frames(error)
        reply["suspect"] = self.ledger.suspect
        dist = sys.modules.get("torch.distributed")
        reply["pg_gone"] = kind != RESET_PG and dist is not None and not dist.is_initialized()
        try:
            reply["figures"] = _cell.collect_figures()
        except Exception:
            pass
        return reply

    def _leave_fork(self, error: BaseException | None) -> None:
        """A child forked by a cell came back out of the cell into the kit: end it here, before it
        writes markers or replies that belong to the parent."""
        if isinstance(error, SystemExit):  # sys.exit() in the child: its own way out
            code = error.code
            os._exit(code if isinstance(code, int) else (0 if code is None else 1))
        self.streams.note(f"[kit] a child (pid {os.getpid()}) forked by rank {self.rank}'s cell returned into the "
                          f"kit, so the kit ended it; call os._exit() in forked children")
        os._exit(0 if error is None else 1)

    def display(self, *objs: Any) -> None:
        """`display(obj)` in a cell: shown in the notebook now, labelled with this rank (figures,
        HTML, anything with a repr), like IPython's display."""
        for obj in objs:
            sys.stdout.flush()  # keep it after the text printed before it
            bundle, self.display_bytes = _cell.capped_bundle(_cell.mime_bundle(obj), self.display_bytes, self.rank)
            if bundle is not None:
                self.send(DISPLAY, {"id": self.ledger.request_id, "bundle": bundle})


def main() -> None:
    if "--attach" in sys.argv[1:]:
        return main_attached(sys.argv[1:])
    env = os.environ
    # A rank forked by the template (kit/rank/template.py) is the template's child, not the kernel's.
    die_with_parent(int(env.pop("KIT_PARENT_PID", "") or env["KIT_KERNEL_PID"]), env.get("KIT_PDEATHSIG") == "1")
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
    threading.Thread(target=lambda: (os.read(lifeline, 1), exit_now()), name="kit-lifeline", daemon=True).start()
    signal.signal(signal.SIGTERM, exit_now)
    rank, world_size = int(env["RANK"]), int(env["WORLD_SIZE"])
    worker = Worker(chan, rank, world_size, env.pop("KIT_MARKER").encode())
    # A segfault or abort prints the cell's line on the real stderr pipe, even after a cell closed fd 2.
    faulthandler.enable(file=worker.streams.saved[2], all_threads=False)
    chan.send(HELLO, {"pid": os.getpid(), "rank": rank})
    _join_and_serve(worker, chan, dict(env))


def main_attached(argv: list[str]) -> None:
    """Under torchrun: attach to the notebook's listener, then serve like a local rank."""
    env = os.environ
    die_with_parent(os.getppid(), True)  # torchrun's agent gone: so are we (it cannot stop us any more)
    chan, welcome = attach.connect(argv)
    node_stderr = attach.pump_output(chan)  # before the Worker: its private marker fds are then the pipes
    signal.signal(signal.SIGTERM, exit_now)  # torchrun stopping the job
    worker = Worker(chan, int(env["RANK"]), int(env["WORLD_SIZE"]), str(welcome["marker"]).encode())
    worker.remote = True
    faulthandler.enable(file=node_stderr, all_threads=False)  # torchrun's log on the node keeps a crash's stack
    options = {"KIT_BACKEND": str(welcome.get("backend", "auto")), "KIT_PG_TIMEOUT_S": str(welcome["pg_timeout_s"]),
               "KIT_RENDEZVOUS": "env", "KIT_GPU_ID": env.get("LOCAL_RANK", "0")}
    if welcome.get("threads"):
        options["KIT_THREADS"] = str(welcome["threads"])
    _join_and_serve(worker, chan, dict(env, **options))


def _join_and_serve(worker: Worker, chan: Channel, env: dict[str, str]) -> None:
    try:
        torch_setup = setup_torch(worker.rank, worker.world_size, env)
        worker.adopt(torch_setup, int(env["LOCAL_RANK"]))
    except BaseException as e:
        chan.send(START_FAILED, {"rank": worker.rank, "traceback": "".join(traceback.format_exception(e))})
        sys.stderr.flush()
        os._exit(1)
    sys.modules["__main__"] = worker.module
    chan.send(READY, torch_setup.info)
    worker.serve()
    sys.stdout.flush()
    os._exit(0)


if __name__ == "__main__":
    main()
