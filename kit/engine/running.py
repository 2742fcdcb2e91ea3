"""Kernel side: the ranks of one start, while they run, and the one owner of their state.

`startup.open_ranks` builds a `Running` and returns it; the `Cluster` keeps it until shutdown. A
request (requests.py), its wait (watch.py, watch_checks.py) and recovery (recover.py) are handed it, and
read and change the ranks' state only through it; it holds inspection's parts (inspect.py's where board
and status). Its IO thread calls
`on_frame` for the frames answered at once, so no rank ever waits on the kernel's main thread:
pre-flight announcements, `where` answers, progress reports, and the bookkeeping a rank's end or death
needs at once (releasing ranks waiting in a pre-flight check, marking the group broken even between
cells). Everything else goes on to the request being collected, through `io.events`.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, Iterable, Iterator

from kit.config import LaunchConfig
from kit.engine.attach import AttachedRank
from kit.engine.deaths import describe_exit, template_death
from kit.engine.inspect import WhereBoard, cpu_s, rank_status
from kit.engine.io import IOThread
from kit.engine.launcher import WorkerProcess
from kit.engine.run_dirs import unregister
from kit.engine.whole_frames import sigint_held
from kit.engine.local import LocalRanks
from kit.engine.preflight import Preflight
from kit.engine.remote import RemoteRanks
from kit.messages import DIED, DONE, PREFLIGHT, PROGRESS, RELEASE_GROUP, RELEASED, SHUTDOWN, STOP_REQUEST, WHERE
from kit.protocol import Channel

__all__ = ["Running"]

Progress = Callable[[int, int, int], None]  # (rank, step, total)


@dataclass(eq=False)
class Running:
    """What one start of the ranks holds until they are shut down. `broken` (the first reason the
    process group became unusable) is the one fact `Cluster.state` reads."""

    config: LaunchConfig
    launcher: LocalRanks | RemoteRanks  # who started the ranks: this kernel, or torchrun
    workers: list[WorkerProcess] | list[AttachedRank]
    channels: dict[int, Channel]
    run_dir: str
    marker: bytes  # ends each request's output on the ranks' stdout and stderr
    ids: Iterator[int]  # request and question ids, the Cluster's across its starts (next() is atomic)
    io: IOThread = field(init=False)
    preflight: Preflight = field(init=False)
    answers: WhereBoard = field(default_factory=WhereBoard)  # `where` and `release_group` answers by id
    pg_generation: int = 0  # the process group was re-created this many times (its store prefix)
    abandoned: tuple[int, set[int]] | None = None  # (request id, ranks still running it): the user stopped waiting
    on_progress: Progress | None = None  # the request in flight's progress callback (called on the IO thread)
    joined: bool = False  # every rank joined the group: from now on a death breaks it
    stopping: bool = False  # shut down on purpose: deaths are expected
    broken: str | None = None

    def __post_init__(self) -> None:
        self.preflight = Preflight(self.config.world_size, self.send)
        self.io = IOThread(self.workers, self.channels, self.marker, self.on_frame)

    @property
    def ready(self) -> bool:
        """Every rank joined, the group is usable and nobody is shutting the ranks down."""
        return self.joined and self.broken is None and not self.stopping

    # -- talking to the ranks -------------------------------------------------------------
    def send(self, rank: int, kind: str, body: Any = None) -> None:
        """One frame to one rank, whole even when Ctrl-C lands meanwhile (the interrupt comes after it)."""
        with sigint_held():
            self.channels[rank].send(kind, body)

    def new_id(self) -> int:
        return next(self.ids)

    def interrupt(self, ranks: Iterable[int]) -> None:
        """Stop these ranks' cells: SIGINT to a local rank, an INTERRUPT frame to an attached one."""
        self.launcher.interrupt(ranks)

    def stop_request(self, rid: int, ranks: Iterable[int]) -> None:
        """Ask request `rid` to end early on these ranks (Stop): a STOP_REQUEST frame on each control channel,
        local or attached alike; code that asks (kit.rank.stop_request) ends at its next step boundary. A rank
        that already finished `rid` ignores it; one that died is reported by the IO thread, not here."""
        for r in ranks:
            try:
                self.send(r, STOP_REQUEST, {"id": rid})
            except OSError:
                pass

    def exit_code(self, rank: int) -> int | str | None:
        return self.launcher.exit_code(rank)

    def lost_template(self, rank: int) -> tuple[int, int | None] | None:
        """(pid, exit code or None) of the rank template this ended rank went with (its root cause)."""
        return self.launcher.lost_template(rank)

    def death_reason(self, rank: int, code: int | str | None) -> str:
        """Why the ranks are unusable after this rank died, root cause first."""
        lost = self.lost_template(rank)
        return template_death(*lost) if lost else f"rank {rank} {describe_exit(code)}"

    def mark_broken(self, reason: str) -> None:
        if self.broken is None:  # the first reason is the root cause; later deaths are its echoes
            self.broken = reason

    def next_pg_prefix(self) -> str:
        """The store prefix of a re-created process group (a fresh one each time: old keys never match)."""
        self.pg_generation += 1
        return f"pg{self.pg_generation}"

    def where_reports(self, ranks: Iterable[int] | None = None, timeout_s: float = 2.0) -> dict[int, dict[str, Any]]:
        """Each rank's `where` answer (all ranks by default) with its SIGINT handler ("kit", "ignored",
        "default", "user", None: no answer), asked on its control thread (it answers while a cell runs)."""
        chosen = range(self.config.world_size) if ranks is None else ranks
        return self.answers.ask(self.new_id(), chosen, self.send, timeout_s)

    def where(self, ranks: Iterable[int], timeout_s: float = 2.0) -> dict[int, str]:
        return {r: a["text"] for r, a in self.where_reports(ranks, timeout_s).items()}

    @property
    def backend(self) -> str | None:
        """"gloo" or "nccl" for ranks this kernel started; None for ranks attached from torchrun (their
        launcher chose it)."""
        placement = getattr(self.launcher, "placement", None)
        return placement.backend if placement is not None else None

    def cpu_s(self, ranks: Iterable[int]) -> dict[int, float]:
        """CPU seconds each local rank used so far, read from /proc (asks the ranks nothing); ranks attached
        from torchrun (their process is elsewhere) are absent."""
        chosen, out = set(ranks), {}
        for w in self.workers:
            used = cpu_s(w.pid) if w.rank in chosen and getattr(w, "proc", None) is not None else None
            if used is not None:
                out[w.rank] = used
        return out

    def release_group(self, ranks: Iterable[int]) -> dict[int, str]:
        """Close the process group of these idle ranks, so peers waiting in a collective they will never
        call fail now (kit.rank.control.ControlThread.release_group); the group is re-created after the cell."""
        answers = self.answers.ask(self.new_id(), list(ranks), self.send, 2.0, kind=RELEASE_GROUP)
        return {r: a["text"] for r, a in answers.items()}

    def rank_status(self) -> dict[int, dict[str, Any]]:
        """Each rank's pid, liveness, RSS and exit code."""
        gone = self.io.dead()
        return {w.rank: rank_status(w, w.rank in gone) for w in self.workers}

    # -- the IO thread's frames ----------------------------------------------------------------
    def on_frame(self, rank: int, kind: str, body: Any) -> bool:
        """On the IO thread: True when the frame was consumed here."""
        if kind == PREFLIGHT:
            self.preflight.announce(rank, body)
            return True
        if kind in (WHERE, RELEASED):
            self.answers.deliver(rank, body)
            return True
        if kind == PROGRESS:
            callback = self.on_progress
            if callback is not None:
                try:
                    callback(rank, body["step"], body["total"])
                except Exception:
                    pass  # a broken progress display must not stop the run
            return True
        if kind == DONE:
            err = body.get("error")
            where = f" at line {err.get('line')}" + (f" of {err['cell']}" if err.get("cell") else "") \
                if err is not None and err.get("line") else ""
            self.preflight.rank_ended(rank, "finished the cell" if err is None else f"raised {err['ename']}{where}")
        if kind == DIED:
            self.preflight.rank_ended(rank, f"died ({describe_exit(body)})")
            if not self.stopping and self.joined:
                self.mark_broken(self.death_reason(rank, body))  # noticed even between cells
        return False

    # -- the end -----------------------------------------------------------------------------------
    def stop(self) -> None:
        """Ask every rank to exit, then close (an attached rank closes its connection and exits)."""
        self.stopping = True
        for rank in list(self.channels):
            try:
                self.send(rank, SHUTDOWN)
            except OSError:
                pass
        self.close()

    def close(self) -> None:
        # Ranks first: the IO thread must see them die, so a request still waiting in another thread
        # ends with "shut down" instead of waiting forever (it treats a pipe closed under it as end of
        # file).
        self.stopping = True
        self.launcher.close()
        self.io.stop()
        if self.io.is_alive():
            self.io.join(timeout=2)
        unregister(self.run_dir)
