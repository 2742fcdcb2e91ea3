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

from kit.engine.recover import drain_abandoned
from kit.engine.startup import open_ranks, place_locally
from kit.engine.output import CellResult, Printer
from kit.engine.remote import RemoteRanks
from kit.engine.requests import check_run_args, choose_ranks, send_and_collect
from kit.engine.running import Running
from kit.engine import transfer
from kit.config import LaunchConfig
from kit.engine.devices import Placement
from kit.errors import ClusterStateError, ConfigError
from kit.keywords import passes_keywords_to
from kit.messages import CALL, EXEC

__all__ = ["Cluster", "CellResult", "live_clusters"]

_LIVE: "weakref.WeakSet[Cluster]" = weakref.WeakSet()
Emit = Callable[[int, str, str], None]
Progress = Callable[[int, int, int], None]
Display = Callable[[int, dict[str, Any]], None]


class Cluster:
    """A group of persistent torch.distributed ranks, each a `kit.rank.worker` process (forked from the
    rank template, or a fresh interpreter). The ranks of one start, while they run, are a `Running`
    (engine/running.py): this class owns their lifecycle and the one-request-at-a-time lock."""

    @passes_keywords_to(LaunchConfig)  # help(Cluster) and completion list LaunchConfig's fields, not **kwargs
    def __init__(self, config: LaunchConfig | None = None, **kwargs: Any):
        if config is not None and kwargs:
            raise ConfigError(f"pass either a LaunchConfig or keyword arguments, not both (got {sorted(kwargs)}); "
                              f"use config.replace({', '.join(f'{k}=...' for k in sorted(kwargs))})")
        if config is not None and not isinstance(config, LaunchConfig):
            raise ConfigError(f"config={config!r} must be a kit.LaunchConfig, e.g. LaunchConfig(world_size=2)")
        self.config = config if config is not None else LaunchConfig(**kwargs)
        self.placement: Placement | None = None
        self.reaped: list[int] = []
        self.start_s: float | None = None
        self._running: Running | None = None  # the ranks of this start, from start-up to shutdown
        self._lock = threading.RLock()  # one request at a time
        self._ids = itertools.count(1)  # request and question ids, across starts; next() is atomic under the GIL
        self._cells = 0
        _LIVE.add(self)

    # -- properties -------------------------------------------------------------------
    @property
    def state(self) -> str:
        """"stopped" -> "ready" -> ("broken": the process group is unusable) -> "stopped"."""
        running = self._running
        return "stopped" if running is None else "broken" if running.broken else "ready"

    @property
    def broken_reason(self) -> str | None:
        """Why the ranks are unusable: the first cause, not its echoes."""
        return self._running.broken if self._running is not None else None

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
    def pids(self) -> dict[int, int]:
        return {w.rank: w.pid for w in self._running.workers} if self._running is not None else {}

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
            if self.config.launcher == "local":
                self.placement, self.reaped = place_locally(self.config)
            self._running = open_ranks(self.config, self.placement, self._ids)  # leaves nothing running on failure
            self.start_s = time.monotonic()
            return self

    def shutdown(self) -> None:
        """Stop every rank (SIGTERM, then SIGKILL after 2 s) and forget them. Idempotent."""
        running, self._running = self._running, None
        if running is not None:
            running.stop()

    def restart(self) -> "Cluster":
        self.shutdown()
        return self.start()

    # -- requests -----------------------------------------------------------------------
    def run(self, code: str, ranks: Iterable[int] | None = None, *, on_output: Emit | None = None,
            timeout_s: float | None = None, check: bool | None = None,
            on_display: Display | None = None, label: str | None = None) -> CellResult:
        """Run `code` on the ranks (all by default). Returns a CellResult; never raises for cell errors.

        `on_display(rank, mime_bundle)` receives what the cell passes to `display(...)` on a rank,
        on the calling thread, while the cell runs; without it the bundles land in `result.displays`.
        `label` names the cell in tracebacks, error headlines and the collective ledger (the magic
        passes Jupyter's "In [7]"); by default the kit counts cells itself ("cell 5").
        """
        check_run_args(code, timeout_s, check, label)
        self._cells += 1
        return self._request(EXEC, {"code": code, "cell": self._cells, "label": label}, ranks, on_output, timeout_s,
                             check, on_display=on_display)

    def call(self, target: str, *args: Any, ranks: Iterable[int] | None = None, on_output: Emit | None = None,
             on_progress: Progress | None = None, stop: threading.Event | None = None,
             **kwargs: Any) -> dict[int, Any]:
        """Call `module:function` on every rank with pickled arguments; return values by rank.

        `on_progress(rank, step, total)` is called (from the kit's IO thread) whenever the
        function reports progress with `kit.rank.hooks.progress(step, total)` on a rank.
        `stop`: once the event is set, the ranks still running this call are told so on their control
        channel (the same for ranks attached from other hosts); a function that asks
        `kit.rank.stop_request.asked()` between steps can end early, one that does not runs to its end.
        """
        if ":" not in target:
            raise ConfigError(f"target={target!r} must look like 'package.module:function'")
        res = self._request(CALL, {"target": target, "args": args, "kwargs": kwargs}, ranks, on_output, None,
                            False, on_progress=on_progress, stop=stop)
        return res.raise_for_error().values

    def push(self, values: dict[str, Any], ranks: Iterable[int] | None = None) -> None:
        """Copy kernel objects into the ranks' namespaces (pickled one by one, by value where possible).

        All chosen ranks or none: each rank keeps the values apart until every one has them, so an
        interrupt (KeyboardInterrupt, saying which ranks had received them) or a rank that cannot
        rebuild a value leaves every namespace as it was; only a commit that fails on a rank (a death, or no
        answer within 60 s) leaves some ranks with the values, and raises TransferError saying which. Raises
        TypeError, naming the object, for one
        the ranks could not rebuild (a function or class defined in the notebook, without cloudpickle
        installed); nothing is sent then.
        """
        transfer.push(self._request, values, ranks)

    def pull(self, names: str | Iterable[str], ranks: Iterable[int] | None = None, *,
             on_output: Emit | None = None, whole: bool = False) -> dict[int, dict[str, Any]]:
        """Copy objects out of the ranks' namespaces: {rank: {name: value}}.

        Unpickles rank data in the kernel: the ranks run your code as you, so this trusts them
        as much as the cells you run. A value that cannot travel (unpicklable, a class defined in
        a cell, over 64 MiB) arrives as its repr string, with a note on `on_output`; with
        `whole=True` (what `%dist pull` uses) every value arrives whole or nothing is returned:
        TransferError or KeyboardInterrupt, in one line naming what stays as it was.
        """
        if whole:
            return transfer.pull_whole(self._request, [names] if isinstance(names, str) else list(names), ranks,
                                       on_output)
        return transfer.pull(self._request, names, ranks, on_output)

    def _ranks(self, ranks: Iterable[int] | None) -> tuple[int, ...]:
        return choose_ranks(ranks, self.world_size)

    def _ready(self) -> Running:
        if self._running is None:
            self.start()
        running = self._running
        assert running is not None
        if running.broken:
            raise ClusterStateError(f"the ranks are unusable: {running.broken}. "
                                    "Run `%dist restart` (or Cluster.restart()) to start fresh ranks; state is lost.")
        return running

    def _request(self, kind: str, body: dict[str, Any], ranks: Iterable[int] | None, on_output: Emit | None,
                 timeout_s: float | None, check: bool | None, *, on_progress: Progress | None = None,
                 on_display: Display | None = None, stop: threading.Event | None = None) -> CellResult:
        """One request on the chosen ranks (engine/requests.py), after the lock and the ranks' readiness."""
        chosen = self._ranks(ranks)
        emit = on_output or Printer()
        if not self._lock.acquire(timeout=0.5):  # another thread (the lab bench) is using the ranks
            emit(-1, "stderr", "the ranks are busy with another request (a lab bench run?); "
                               "this one starts as soon as it finishes (interrupt to give up)")
            self._lock.acquire()
        with self._lock:
            self._lock.release()  # re-entrant: the `with` holds it once more, the acquire above once
            running = self._ready()
            try:
                if running.abandoned:
                    drain_abandoned(running, emit)
                    running = self._ready()  # raises ClusterStateError with the fix when the ranks broke meanwhile
                return send_and_collect(running, kind, body, chosen, emit, timeout_s, check, on_progress, on_display,
                                        stop)
            finally:
                if isinstance(emit, Printer):  # what waits for its batch is shown before the result
                    emit.flush()

    # -- inspection -----------------------------------------------------------------------
    def where(self, ranks: Iterable[int] | None = None, timeout_s: float = 2.0) -> dict[int, str]:
        """What each rank is doing right now: cell line, stack, recent collectives (the hang doctor).
        Takes no request lock: it must answer while a cell runs, which is exactly when it is needed."""
        chosen, running = self._ranks(ranks), self._running
        return running.where(chosen, timeout_s) if running is not None else {r: "not started" for r in chosen}

    def where_reports(self, ranks: Iterable[int] | None = None, timeout_s: float = 2.0) -> dict[int, dict[str, Any]]:
        """`where` as data, per rank: "text" (what `where` says), "sigint" (who handles SIGINT now: "kit",
        "ignored", "default", "user"; None: no answer), "sigints" (SIGINTs the kit's handler ran for since
        the last request), "cpu_s" (the rank's CPU time) and "innermost" (its main thread's innermost frame).
        Takes no request lock, like `where`."""
        chosen, running = self._ranks(ranks), self._running
        if running is None:
            return {r: {"text": "not started", "sigint": None} for r in chosen}
        return running.where_reports(chosen, timeout_s)

    def status(self) -> dict[str, Any]:
        """State, placement, uptime, the run directory (private, 0700; removed at shutdown), each rank's
        pid, liveness, RSS, exit code and how it was started (kit.engine.inspect.rank_status); for ranks
        that attach (launcher "attach" or "torchrun"), `attach`: the address, key file, command, the
        torchrun agents' pids this kernel started, and the refused attachers (else None)."""
        running = self._running
        launcher = running.launcher if running is not None else None
        return {"state": self.state, "world_size": self.world_size, "backend": self.backend,
                "device_type": self.device_type, "threads_per_rank": self.config.threads,
                "uptime_s": time.monotonic() - self.start_s if running is not None and self.start_s else 0.0,
                "broken_reason": self.broken_reason, "banner": self.banner,
                "run_dir": running.run_dir if running is not None else None,
                "attach": launcher.describe() if isinstance(launcher, RemoteRanks) else None,
                "ranks": running.rank_status() if running is not None else {}}


def live_clusters() -> list[Cluster]:
    """Every Cluster of this process whose ranks run (ready or broken): `%dist status` and `shutdown` name
    and stop the ones `%%distributed` did not start (kit.experiments' own, the lab bench's, a user's)."""
    return [c for c in list(_LIVE) if c.state != "stopped"]


@atexit.register
def _shutdown_all() -> None:
    for cluster in list(_LIVE):
        try:
            cluster.shutdown()
        except Exception:
            pass
