"""Kernel side: the checks a request's wait runs after every step (kit/engine/watch.py's collector).

Each looks at the ranks still busy and, past its grace time, says what is wrong or acts: a failure
elsewhere or an interrupt explained (who waits where), a rank that finished while others sit in a
collective (its group closed so theirs fails now), survivors of a death interrupted and then left
behind, the cell's --timeout enforced.
"""
from __future__ import annotations

import time
from typing import Any, Callable, Iterable, Protocol

from kit.config import LaunchConfig
from kit.engine.output import CellResult
from kit.engine.preflight import Preflight
from kit.engine.stuck import TorchWaits, names, stuck_report, uneven_note
from kit.errors import RankFailure

__all__ = ["WaitChecks", "Cluster"]

HANG_GRACE_S = 2.0  # a failure elsewhere, then this long with ranks still busy: say who waits where
INTERRUPT_GRACE_S = 0.5  # after an interrupt, ranks still busy this long are explained
DEATH_SIGINT_S = 0.3  # a rank died: survivors still busy this long later get SIGINT
DEATH_GRACE_S = 1.3  # ... and ranks still busy this long after the death are left behind (the group is broken)


class Cluster(Protocol):
    """What waiting needs from kit.engine.cluster.Cluster (a Protocol, so this module never imports it)."""

    config: LaunchConfig
    state: str
    _stale: tuple[int, set[int]] | None
    _stopping: bool
    _preflight: Preflight | None
    _on_display: Callable[[int, dict[str, Any]], None] | None

    @property
    def world_size(self) -> int: ...
    def where(self, ranks: Any = None, timeout_s: float = 2.0) -> dict[int, str]: ...
    def _where_reports(self, ranks: Any = None, timeout_s: float = 2.0) -> dict[int, dict[str, Any]]: ...
    def _interrupt(self, ranks: Iterable[int]) -> None: ...
    def _exit_code(self, rank: int) -> int | str | None: ...
    def _mark_broken(self, reason: str) -> None: ...
    def _ready(self) -> Any: ...
    def _new_id(self) -> int: ...
    def _next_pg_prefix(self) -> str: ...
    def _send(self, rank: int, kind: str, body: Any) -> None: ...
    def _release_group(self, ranks: Iterable[int]) -> dict[int, str]: ...


class WaitChecks:
    """Mixed into the collector: the state these checks read and set is the collector's own."""

    cluster: Cluster
    result: CellResult
    t0: float
    timeout_s: float | None
    done: set[int]
    dead: set[int]
    interrupted_s: float
    explained: bool
    hang_noted: bool
    timed_out: bool
    done_s: float
    checked_s: float
    death: RankFailure | None
    after_death: set[int]
    torch_waits: TorchWaits
    released: tuple[list[int], dict[int, str]] | None

    def running(self) -> list[int]:
        raise NotImplementedError

    def note(self, text: str) -> None:
        raise NotImplementedError

    def explain_interrupt(self, now: float, busy: list[int]) -> None:
        if self.interrupted_s and not self.explained and now - self.interrupted_s > INTERRUPT_GRACE_S:
            self.explained = True
            for line in stuck_report(self.cluster, busy, interrupted=True):
                self.note(line)

    def explain_failure_elsewhere(self, now: float, busy: list[int]) -> None:
        failed_s = min((f.time_s for f in self.result.failures.values()), default=None)
        if failed_s and not self.hang_noted and now - failed_s > HANG_GRACE_S and not self.interrupted_s:
            self.hang_noted = True
            first = min(self.result.failures.values(), key=lambda f: f.time_s)
            stuck = stuck_report(self.cluster, busy)
            self.note(first.summary() + "; " + "; ".join(stuck[:-1]))
            self.note(stuck[-1])

    def explain_finished_elsewhere(self, now: float, busy: list[int]) -> None:
        """A rank finished while others sit in a collective: one the kit saw them enter (a skipped
        collective), or one torch issued for them (DDP's reducer with uneven inputs): then the kit
        closes the finished ranks' group, so the waiting ranks' collective fails now."""
        finished = [r for r in self.done if r not in self.result.failures]
        quiet_s = now - max(self.done_s, self.checked_s)
        if not finished or self.hang_noted or self.interrupted_s or quiet_s <= HANG_GRACE_S:
            return
        self.checked_s = now
        reports = self.cluster._where_reports(busy, timeout_s=1.0)
        firsts = {r: a["text"].splitlines()[0] for r, a in reports.items() if a["text"]}
        blocked = {r: t for r, t in firsts.items() if t.startswith(("blocked inside", "waiting at"))}
        if blocked:
            self.hang_noted = True
            self.note(f"rank(s) {names(finished)} finished the cell; " + "; ".join(
                f"rank {r} is {t}" for r, t in blocked.items()) + ". A collective that only some ranks call "
                "can never complete.")
            self.note(stuck_report(self.cluster, busy)[-1])
            return
        waits = self.torch_waits.waiting(reports)
        if waits:
            self.hang_noted = True
            self.note(uneven_note(sorted(finished), waits, reports, self.cluster.config.pg_timeout_s))
            self.released = (sorted(finished), waits)
            self.cluster._release_group(finished)

    def interrupt_after_death(self, now: float, busy: list[int]) -> None:
        death = self.death
        if death is not None and not self.after_death and now - death.time_s > DEATH_SIGINT_S:
            # Ranks blocked in gloo learn of the death by themselves within milliseconds (connection reset);
            # the short delay spares them a SIGINT landing while they report that error.
            self.after_death = set(busy)
            self.note(f"interrupting rank(s) {names(busy)} because rank {death.rank} died; the cell ends now")
            self.cluster._interrupt(busy)

    def enforce_timeout(self, now: float, busy: list[int]) -> None:
        if self.timeout_s is not None and not self.timed_out and now - self.t0 > self.timeout_s:
            self.timed_out = True
            self.result.notes.append(f"[kit] the cell ran past its --timeout of {self.timeout_s:g} s, so the kit "
                                     f"interrupted it.")
            self.note(f"timeout: {self.timeout_s:g} s passed; interrupting rank(s) {names(busy)}")
            self.cluster._interrupt(busy)
            self.interrupted_s, self.explained = now, False

    def leave_behind_after_death(self) -> None:
        death = self.death
        if death is None or time.monotonic() - death.time_s <= DEATH_GRACE_S or not self.running():
            return
        now = time.monotonic()
        for r in self.running():  # it ignored the interrupt: the cell ends without it (the group is broken anyway)
            self.result.failures[r] = RankFailure(
                r, "StillRunning", f"interrupted by the kit because rank {death.rank} died, but it ignored the "
                f"interrupt and still runs, so the kit stopped waiting for it (a consequence, not a cause). Run "
                f"`%dist restart` for fresh ranks.", time_s=now)
            self.dead.add(r)
