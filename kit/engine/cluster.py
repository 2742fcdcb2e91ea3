"""`Cluster`: the kit's engine. Start N ranks, run code on them, get results keyed by rank.

Works from plain Python and scripts; the `%%distributed` magic is a thin skin over it.

    with Cluster(LaunchConfig(world_size=2)) as c:
        c.run("t = torch.ones(3) * (rank + 1); dist.all_reduce(t); t").values
"""
from __future__ import annotations

import atexit
import itertools
import threading
import time
import weakref
from typing import Any, Callable, Iterable

from kit.engine.recover import drain_stale
from kit.engine.frames import on_io_frame
from kit.engine.inspect import WhereBoard, cluster_status
from kit.engine.io import IOThread
from kit.engine.startup import open_ranks
from kit.engine.output import CellResult, Printer
from kit.engine.preflight import Preflight
from kit.engine.attach import AttachedRank
from kit.engine.local import LocalRanks
from kit.engine.remote import RemoteRanks
from kit.engine.requests import check_run_args, choose_ranks, send_and_collect
from kit.engine import transfer
from kit.config import LaunchConfig
from kit.engine.devices import Placement
from kit.errors import ClusterStateError, ConfigError
from kit.engine.launcher import WorkerProcess, unregister
from kit.protocol import CALL, EXEC, RELEASE_GROUP, SHUTDOWN, Channel

__all__ = ["Cluster", "CellResult"]

_LIVE: "weakref.WeakSet[Cluster]" = weakref.WeakSet()
Emit = Callable[[int, str, str], None]


class Cluster:
    """A group of persistent torch.distributed ranks, each a `kit.rank.worker` process (forked from the
    rank template, or a fresh interpreter)."""

    def __init__(self, config: LaunchConfig | None = None, **kwargs: Any):
        if config is not None and kwargs:
            raise ConfigError(f"pass either a LaunchConfig or keyword arguments, not both (got {sorted(kwargs)}); "
                              f"use config.replace({', '.join(f'{k}=...' for k in sorted(kwargs))})")
        if config is not None and not isinstance(config, LaunchConfig):
            raise ConfigError(f"config={config!r} must be a kit.LaunchConfig, e.g. LaunchConfig(world_size=2)")
        self.config = config if config is not None else LaunchConfig(**kwargs)
        self.placement: Placement | None = None
        self.state = "stopped"  # stopped -> ready -> (broken) -> stopped
        self.broken_reason: str | None = None
        self.reaped: list[int] = []
        self.start_s: float | None = None
        self._workers: list[WorkerProcess] | list[AttachedRank] = []
        self._ranks_of: LocalRanks | RemoteRanks | None = None  # who started the ranks: the kernel, or torchrun
        self._channels: dict[int, Channel] = {}
        self._io: IOThread | None = None
        self._preflight: Preflight | None = None
        self._run_dir: str | None = None
        self._lock = threading.RLock()
        self._where = WhereBoard()
        self._ids = itertools.count(1)  # request and question ids; next() is atomic under the GIL
        self._cells = 0
        self._pg_generation = 0
        self._stale: tuple[int, set[int]] | None = None  # an abandoned request still running
        self._stopping = False
        self._on_progress: Callable[[int, int, int], None] | None = None
        self._on_display: Callable[[int, dict[str, Any]], None] | None = None
        _LIVE.add(self)

    # -- properties -------------------------------------------------------------------
    @property
    def world_size(self) -> int:
        return self.config.world_size

    @property
    def backend(self) -> str:
        return self.placement.backend if self.placement else "gloo"

    @property
    def device_type(self) -> str:
        return self.placement.device_type if self.placement else "cpu"

    @property
    def banner(self) -> str | None:
        return self.placement.banner if self.placement else None

    @property
    def _remote(self) -> RemoteRanks | None:
        """The listener and torchrun nodes, when the ranks were started by torchrun."""
        return self._ranks_of if isinstance(self._ranks_of, RemoteRanks) else None

    @property
    def pids(self) -> dict[int, int]:
        return {w.rank: w.pid for w in self._workers}

    def __enter__(self) -> "Cluster":
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.shutdown()

    def __repr__(self) -> str:
        return f"<Cluster world_size={self.world_size} backend={self.backend} state={self.state}>"

    # -- lifecycle --------------------------------------------------------------------
    @classmethod
    def attach(cls, world_size: int, host: str = "127.0.0.1", port: int = 0, key_file: str | None = None,
               timeout_s: float = 600.0, **kwargs: Any) -> "Cluster":
        """Wait for `world_size` ranks that torchrun starts on other nodes (it prints the command to run
        there), then use them like local ranks. The listener binds `host` (loopback unless you name an
        interface's address); ranks authenticate with the 0600 `key_file` (created when missing)."""
        return cls(LaunchConfig(world_size=world_size, launcher="attach", host=host, port=port, key_file=key_file,
                                start_timeout_s=timeout_s, **kwargs)).start()

    def start(self) -> "Cluster":
        with self._lock:
            if self.state == "ready":
                return self
            if self.state == "broken":
                self.shutdown()
            self._stopping = False
            open_ranks(self)  # kit/engine/startup.py; shuts this cluster down if anything fails
            self.state, self.broken_reason, self.start_s = "ready", None, time.monotonic()
            return self

    def shutdown(self) -> None:
        """Stop every rank (SIGTERM, then SIGKILL after 2 s) and forget them. Idempotent."""
        self._stopping = True
        for ch in self._channels.values():
            try:
                ch.send(SHUTDOWN)
            except OSError:
                pass
        self._teardown()

    def restart(self) -> "Cluster":
        self.shutdown()
        return self.start()

    def _teardown(self) -> None:
        # Ranks first: the IO thread must see them die, so a request still waiting in another thread
        # ends with "shut down" instead of waiting forever (it treats a pipe closed under it as end of
        # file). Attached ranks were sent "shutdown": they close their connections and exit.
        if self._ranks_of is not None:
            self._ranks_of.close()
        if self._io is not None:
            self._io.stop()
            self._io.join(timeout=2)
        if self._run_dir:
            unregister(self._run_dir)
        self._workers, self._channels, self._io, self._run_dir, self._ranks_of = [], {}, None, None, None
        self._stale, self.state = None, "stopped"

    # -- IO thread callbacks ------------------------------------------------------------
    def _send(self, rank: int, kind: str, body: Any) -> None:
        self._channels[rank].send(kind, body)

    def _on_frame(self, rank: int, kind: str, body: Any) -> bool:
        return on_io_frame(self, rank, kind, body)  # on the IO thread

    # -- requests -----------------------------------------------------------------------
    def run(self, code: str, ranks: Iterable[int] | None = None, *, on_output: Emit | None = None,
            timeout_s: float | None = None, check: bool | None = None,
            on_display: Callable[[int, dict[str, Any]], None] | None = None, label: str | None = None) -> CellResult:
        """Run `code` on the ranks (all by default). Returns a CellResult; never raises for cell errors.

        `on_display(rank, mime_bundle)` receives what the cell passes to `display(...)` on a rank,
        on the calling thread, while the cell runs; without it the bundles land in `result.displays`.
        `label` names the cell in tracebacks, error headlines and the collective ledger (the magic
        passes Jupyter's "In [7]"); by default the kit counts cells itself ("cell 5").
        """
        check_run_args(code, timeout_s, check, label)
        self._cells += 1
        self._on_display = on_display
        try:
            return self._request(EXEC, {"code": code, "cell": self._cells, "label": label}, ranks, on_output,
                                 timeout_s, check)
        finally:
            self._on_display = None

    def call(self, target: str, *args: Any, ranks: Iterable[int] | None = None, on_output: Emit | None = None,
             on_progress: Callable[[int, int, int], None] | None = None, **kwargs: Any) -> dict[int, Any]:
        """Call `module:function` on every rank with pickled arguments; return values by rank.

        `on_progress(rank, step, total)` is called (from the kit's IO thread) whenever the
        function reports progress with `kit.rank.hooks.progress(step, total)` on a rank.
        """
        if ":" not in target:
            raise ConfigError(f"target={target!r} must look like 'package.module:function'")
        res = self._request(CALL, {"target": target, "args": args, "kwargs": kwargs}, ranks, on_output, None,
                            False, on_progress)
        return res.raise_for_error().values

    def push(self, values: dict[str, Any], ranks: Iterable[int] | None = None) -> None:
        """Copy kernel objects into the ranks' namespaces (pickled one by one, by value where possible).

        All chosen ranks or none: each rank keeps the values apart until every one has them, so an
        interrupt (KeyboardInterrupt, saying which ranks had received them) or a rank that cannot
        rebuild a value leaves every namespace as it was. Raises TypeError, naming the object, for one
        the ranks could not rebuild (a function or class defined in the notebook, without cloudpickle
        installed); nothing is sent then.
        """
        transfer.push(self, values, ranks)

    def pull(self, names: str | Iterable[str], ranks: Iterable[int] | None = None, *,
             on_output: Emit | None = None) -> dict[int, dict[str, Any]]:
        """Copy objects out of the ranks' namespaces: {rank: {name: value}}.

        Unpickles rank data in the kernel: the ranks run your code as you, so this trusts them
        as much as the cells you run. A value that cannot travel (unpicklable, a class defined in
        a cell, over 64 MiB) arrives as its repr string, with a note on `on_output`.
        """
        return transfer.pull(self, names, ranks, on_output)

    def _ranks(self, ranks: Iterable[int] | None) -> tuple[int, ...]:
        return choose_ranks(ranks, self.world_size)

    def _ready(self) -> IOThread:
        if self.state == "stopped":
            self.start()
        if self.state == "broken":
            raise ClusterStateError(f"the ranks are unusable: {self.broken_reason}. "
                                    "Run `%dist restart` (or Cluster.restart()) to start fresh ranks; state is lost.")
        assert self._io is not None
        return self._io

    def _request(self, kind: str, body: dict[str, Any], ranks: Iterable[int] | None, on_output: Emit | None,
                 timeout_s: float | None, check: bool | None,
                 on_progress: Callable[[int, int, int], None] | None = None) -> CellResult:
        chosen = self._ranks(ranks)
        emit = on_output or Printer()
        if not self._lock.acquire(timeout=0.5):  # another thread (the lab bench) is using the ranks
            emit(-1, "stderr", "the ranks are busy with another request (a lab bench run?); "
                               "this one starts as soon as it finishes (interrupt to give up)")
            self._lock.acquire()
        with self._lock:
            self._lock.release()  # re-entrant: the `with` holds it once more, the acquire above once
            io = self._ready()
            try:
                if self._stale:
                    drain_stale(self, io.events, emit)
                self._on_progress = on_progress  # before sending: a rank may report at once
                return send_and_collect(self, io.events, kind, body, chosen, emit, timeout_s, check)
            finally:
                self._on_progress = None
                if isinstance(emit, Printer):  # what waits for its batch is shown before the result
                    emit.flush()

    def _next_pg_prefix(self) -> str:
        self._pg_generation += 1
        return f"pg{self._pg_generation}"

    def _new_id(self) -> int:
        return next(self._ids)

    def _interrupt(self, ranks: Iterable[int]) -> None:
        """Stop these ranks' cells: SIGINT to a local rank, an "interrupt" message to an attached one."""
        if self._ranks_of is not None:
            self._ranks_of.interrupt(ranks)

    def _release_group(self, ranks: Iterable[int]) -> dict[int, str]:
        """Close the process group of these idle ranks, so peers waiting in a collective they will never
        call fail now (kit.rank.worker.Worker.release_group); the group is re-created after the cell."""
        answers = self._where.ask(self._new_id(), list(ranks), self._send, 2.0, kind=RELEASE_GROUP)
        return {r: a["text"] for r, a in answers.items()}

    def _exit_code(self, rank: int) -> int | str | None:
        return self._ranks_of.exit_code(rank) if self._ranks_of is not None else None

    def _mark_broken(self, reason: str) -> None:
        if self.state != "broken":  # the first reason is the root cause; later deaths are its echoes
            self.state, self.broken_reason = "broken", reason

    # -- inspection -----------------------------------------------------------------------
    def where(self, ranks: Iterable[int] | None = None, timeout_s: float = 2.0) -> dict[int, str]:
        """What each rank is doing right now: cell line, stack, recent collectives (the hang doctor)."""
        return {r: a["text"] for r, a in self._where_reports(ranks, timeout_s).items()}

    def _where_reports(self, ranks: Iterable[int] | None = None, timeout_s: float = 2.0) -> dict[int, dict[str, Any]]:
        """`where` with each rank's SIGINT handler ("kit", "ignored", "default", "user", None: no answer)."""
        chosen = self._ranks(ranks)
        if self.state == "stopped":
            return {r: {"text": "not started", "sigint": None} for r in chosen}
        return self._where.ask(self._new_id(), chosen, self._send, timeout_s)

    def status(self) -> dict[str, Any]:
        """State, placement, uptime and each rank's pid, liveness, RSS and exit code."""
        return cluster_status(self)

@atexit.register
def _shutdown_all() -> None:
    for cluster in list(_LIVE):
        try:
            cluster.shutdown()
        except Exception:
            pass
