"""Kernel side: the checks a request's wait runs after every step (kit/engine/watch.py's collector
owns the wait: replies, output, deaths; `WaitChecks` owns what the checks found and did).

Each looks at the ranks still busy and, past its grace time, says what is wrong or acts: a failure
elsewhere or an interrupt explained (who waits where), a rank that finished (or that the interrupt
stopped) while others sit in a collective (its group closed so theirs fails now), survivors of a death
interrupted and then left behind, the cell's --timeout enforced.
"""
from __future__ import annotations

import time
from typing import Callable

from kit.engine.output import CellResult
from kit.engine.running import Running
from kit.engine.stuck import IDLE_CPU_SHARE, MIN_WINDOW_S, TorchWaits, apart_note, names, stuck_report, uneven_note
from kit.errors import RankFailure

__all__ = ["WaitChecks"]

HANG_GRACE_S = 2.0  # a failure elsewhere, then this long with ranks still busy: say who waits where
INTERRUPT_GRACE_S = 0.5  # after an interrupt, ranks still busy this long are explained
DEATH_SIGINT_S = 0.3  # a rank died: survivors still busy this long later get SIGINT
DEATH_GRACE_S = 1.3  # ... and ranks still busy this long after the death are left behind (the group is broken)
STOPPED_GRACE_S = 4.0  # after an interrupt, ranks still blocked this long in a collective the stopped ranks never join
IDLE_WINDOW_S = 2.0  # every busy rank used (almost) no CPU over this long: ask once where they wait
IDLE_ASK_AGAIN_S = 5.0  # ... and, when that found nothing to say (a sleep, input), not again before this


class WaitChecks:
    """One request's checks: given the ranks still busy, past each grace time, say what is wrong or act."""

    def __init__(self, running: Running, result: CellResult, note: Callable[[str], None], t0: float,
                 timeout_s: float | None):
        self.running, self.result, self.note, self.t0, self.timeout_s = running, result, note, t0, timeout_s
        self.interrupted_s, self.explained = 0.0, False  # the last interrupt (the user's or the timeout's)
        self.hang_noted = self.timed_out = False
        self.checked_s = 0.0  # when we last asked who waits where
        self.release_checked_s = 0.0  # the same, for ranks left waiting by the interrupt (release_after_interrupt)
        self.death: RankFailure | None = None  # the first death while others still ran: the root cause
        self.after_death: set[int] = set()  # the survivors the kit interrupted because of it
        self.torch_waits = TorchWaits()
        self.released: tuple[list[int], dict[int, str]] | None = None  # (finished ranks, {waiting rank: where})
        self.stopped: tuple[list[int], dict[int, str]] | None = None  # the same, for ranks the interrupt stopped
        self.cpu_seen: tuple[float, dict[int, float]] | None = None  # (when, {rank: CPU s}) for explain_apart
        self.asked_idle_s, self.apart_noted = 0.0, False

    def check(self, now: float, busy: list[int], done: set[int], done_s: float) -> None:
        """After a step, with ranks still `busy`; `done` finished the cell, the last of them at `done_s`."""
        self.explain_interrupt(now, busy)
        self.explain_failure_elsewhere(now, busy)
        self.explain_finished_elsewhere(now, busy, done, done_s)
        self.release_after_interrupt(now, busy, done)
        self.explain_apart(now, busy, done)
        self.interrupt_after_death(now, busy)
        self.enforce_timeout(now, busy)

    def interrupted(self) -> None:
        """The user interrupted the ranks: explain the busy ones if they are still busy after a grace time."""
        self.interrupted_s, self.explained = time.monotonic(), False

    def died(self, failure: RankFailure) -> None:
        """A rank died while others still run: nothing they do can complete (`interrupt_after_death`)."""
        if self.death is None:
            self.death = failure

    def explain(self, rank: int, failure: RankFailure) -> None:
        """A failure the kit caused by acting (interrupting survivors, closing a finished rank's group)
        says so, and what to do."""
        death = self.death
        if death is not None and rank in self.after_death and failure.ename == "KeyboardInterrupt":
            failure.evalue = (f"interrupted by the kit because rank {death.rank} died (a consequence, not a "
                              f"cause); run `%dist restart` for fresh ranks")
        if self.stopped is not None and rank in self.stopped[1]:
            failure.evalue = (f"was blocked in a collective that rank(s) {names(self.stopped[0])}, stopped by the "
                              f"interrupt, never joined, so the kit closed their connections of the group to end the "
                              f"wait. Your variables are kept.{_torch_said(failure)}")
        if self.released is not None and rank in self.released[1]:
            finished, waits = self.released
            failure.evalue = (f"waited inside {waits[rank]} in a collective torch issued that rank(s) "
                              f"{names(finished)} never called (they had finished the cell: uneven inputs?), so the "
                              f"kit closed their connections of the group to end the wait. Fix: equal batches per "
                              f"rank, `with ddp.join():`, or `with ddp.no_sync():` for the extra steps. Your variables "
                              f"are kept.{_torch_said(failure)}")

    def explain_interrupt(self, now: float, busy: list[int]) -> None:
        if self.interrupted_s and not self.explained and now - self.interrupted_s > INTERRUPT_GRACE_S:
            self.explained = True
            finished = [r for r in range(self.running.config.world_size) if r not in busy]
            for line in stuck_report(self.running.where_reports(busy, 1.0), self.running.config.pg_timeout_s,
                                     interrupted=True, finished=finished):
                self.note(line)

    def explain_failure_elsewhere(self, now: float, busy: list[int]) -> None:
        failed_s = min((f.time_s for f in self.result.failures.values()), default=None)
        if failed_s and not self.hang_noted and now - failed_s > HANG_GRACE_S and not self.interrupted_s:
            self.hang_noted = True
            first = min(self.result.failures.values(), key=lambda f: f.time_s)
            stuck = stuck_report(self.running.where_reports(busy, 1.0), self.running.config.pg_timeout_s)
            self.note(first.summary() + "; " + "; ".join(stuck[:-1]))
            self.note(stuck[-1])

    def explain_finished_elsewhere(self, now: float, busy: list[int], done: set[int], done_s: float) -> None:
        """A rank finished while others sit in a collective: one the kit saw them enter (a skipped
        collective), or one torch issued for them (DDP's reducer with uneven inputs): then the kit
        closes the finished ranks' group, so the waiting ranks' collective fails now."""
        finished = [r for r in done if r not in self.result.failures]
        quiet_s = now - max(done_s, self.checked_s)
        if not finished or self.hang_noted or self.interrupted_s or quiet_s <= HANG_GRACE_S:
            return
        self.checked_s = now
        reports = self.running.where_reports(busy, timeout_s=1.0)
        firsts = {r: a["text"].splitlines()[0] for r, a in reports.items() if a["text"]}
        blocked = {r: t for r, t in firsts.items() if t.startswith(("blocked inside", "waiting at"))}
        pg_timeout_s = self.running.config.pg_timeout_s
        if blocked:
            self.hang_noted = True
            self.note(f"rank(s) {names(finished)} finished the cell; " + "; ".join(
                f"rank {r} is {t}" for r, t in blocked.items()) + ". A collective that only some ranks call "
                "can never complete.")
            self.note(stuck_report(self.running.where_reports(busy, 1.0), pg_timeout_s)[-1])
            return
        waits = self.torch_waits.waiting(reports)
        if waits:
            self.hang_noted = True
            self.note(uneven_note(sorted(finished), waits, reports, pg_timeout_s))
            self.released = (sorted(finished), waits)
            self.result.group_closed = True
            self.running.release_group(finished)

    def explain_apart(self, now: float, busy: list[int], done: set[int]) -> None:
        """Every rank blocked in a collective that cannot match another's (under --no-check: rank 0 in
        all_reduce, rank 1 in broadcast) waits out the process-group timeout in silence: say so once, as
        soon as it is seen. Nothing is asked of the ranks until every one has used (almost) no CPU for
        IDLE_WINDOW_S (read from /proc: gloo waits without spinning, so a computing cell is never asked);
        then one `where` gives the collectives, which the kit's ledger records with or without the check.
        Gloo ranks only: what it says next (the timeout is raised, the group re-created, variables kept) is
        gloo's behaviour; NCCL's watchdog tears a timed-out rank down instead, and its host calls do not block."""
        if (self.apart_noted or self.interrupted_s or self.hang_noted or self.death is not None or done or len(busy) < 2
                or now - self.t0 < IDLE_WINDOW_S  # from then on a blocked rank has waited long enough for apart_note
                or self.running.backend != "gloo"):
            return
        last = self.cpu_seen
        if last is not None and now - last[0] < IDLE_WINDOW_S:
            return
        cpu = self.running.cpu_s(busy)
        self.cpu_seen = (now, cpu)
        if last is None or set(cpu) != set(busy) or now - self.asked_idle_s < IDLE_ASK_AGAIN_S or any(
                r not in last[1] or cpu[r] - last[1][r] >= IDLE_CPU_SHARE * (now - last[0]) for r in busy):
            return  # a rank computes, one is attached from torchrun (no /proc here: the interrupt says it, N6)
        self.asked_idle_s = now
        reports = self.running.where_reports(busy, timeout_s=1.0)
        pg_timeout_s = self.running.config.pg_timeout_s
        apart = apart_note({r: a["text"] for r, a in reports.items()}, pg_timeout_s)
        if apart:
            self.apart_noted = True
            self.note(apart[0])
            self.note(f"gloo cannot be interrupted inside a collective: each rank raises when the {pg_timeout_s:g} s "
                      f"process-group timeout, counted from when it entered, expires; then the kit re-creates the "
                      f"group and keeps your variables. To stop waiting sooner: interrupt three times, then "
                      f"`%dist restart` (variables are lost).")

    def release_after_interrupt(self, now: float, busy: list[int], done: set[int]) -> None:
        """The interrupt stopped some ranks while the others sit in a collective those will never join (a
        loop of dist.* calls stops on one rank after collective k while another entered k+1; a rank that
        slept while its peer waited): close the stopped ranks' group as explain_finished_elsewhere does,
        so the wait fails now, not at the process-group timeout. Again for a rank that release freed, when
        others still wait on it (a parameter server: rank 0 waited on the stopped rank 1, rank 2 on rank 0:
        lesson 08 waited out the 60 s timeout after saying the wait ended)."""
        closed = set(self.stopped[0]) if self.stopped is not None else set()
        fresh = sorted(r for r in done if r in self.result.failures and r not in closed)
        if (not self.interrupted_s or self.released is not None or self.death is not None
                or not fresh or now - self.interrupted_s <= STOPPED_GRACE_S
                or now - self.release_checked_s < MIN_WINDOW_S):  # TorchWaits compares answers >= 1 s apart
            return
        self.release_checked_s = now
        reports = self.running.where_reports(busy, timeout_s=1.0)
        blocked = {r: a["text"].splitlines()[0] for r, a in reports.items() if a["text"].startswith("blocked inside")}
        # or inside a collective torch issued (DDP's reducer during backward, FSDP): the ledger never saw it, so
        # no "blocked inside"; seen twice at the same place using no CPU (TorchWaits), as for a finished peer.
        # Interrupting a DDP run of kit.experiments waited out the 60 s timeout in 3 of 8 tries before.
        waits = self.torch_waits.waiting({r: a for r, a in reports.items() if r not in blocked})
        blocked.update({r: f"waiting inside {place}, a collective torch issued (DDP's gradient all-reduce, FSDP)"
                        for r, place in waits.items()})
        if not blocked or set(blocked) != set(busy):
            return
        waiting = "; ".join(f"rank {r} is {t}" for r, t in sorted(blocked.items()))
        if self.stopped is None:
            self.note(f"rank(s) {names(fresh)} stopped at the interrupt; {waiting}, a collective the stopped rank(s) "
                      f"will never join. The kit closes rank(s) {names(fresh)}'s connections of the group (as their "
                      f"exit would under torchrun), so the wait ends now instead of at the "
                      f"{self.running.config.pg_timeout_s:g} s timeout; it re-creates the group after the cell and your "
                      f"variables are kept.")
        else:
            self.note(f"rank(s) {names(fresh)} ended once freed; {waiting}, which rank(s) {names(fresh)} will never "
                      f"join now: the kit closes their connections of the group too.")
        self.stopped = (sorted(closed | set(fresh)), {**(self.stopped[1] if self.stopped else {}), **blocked})
        self.result.group_closed = True  # the waiting rank may raise the interrupt, not gloo's error: no "suspect"
        self.running.release_group(fresh)

    def interrupt_after_death(self, now: float, busy: list[int]) -> None:
        death = self.death
        if death is not None and not self.after_death and now - death.time_s > DEATH_SIGINT_S:
            # Ranks blocked in gloo learn of the death by themselves within milliseconds (connection reset);
            # the short delay spares them a SIGINT landing while they report that error.
            self.after_death = set(busy)
            self.note(f"interrupting rank(s) {names(busy)} because rank {death.rank} died; the cell ends now")
            self.running.interrupt(busy)

    def enforce_timeout(self, now: float, busy: list[int]) -> None:
        if self.timeout_s is not None and not self.timed_out and now - self.t0 > self.timeout_s:
            self.timed_out = True
            self.result.notes.append(f"[kit] the cell ran past its --timeout of {self.timeout_s:g} s, so the kit "
                                     f"interrupted it.")
            self.note(f"timeout: {self.timeout_s:g} s passed; interrupting rank(s) {names(busy)}")
            self.running.interrupt(busy)
            self.interrupted_s, self.explained = now, False

    def left_behind(self, busy: list[int]) -> list[int]:
        """Ranks still busy past the grace time after a death: the cell ends without them (each gets a
        failure saying so); the group is broken anyway."""
        death = self.death
        if death is None or time.monotonic() - death.time_s <= DEATH_GRACE_S or not busy:
            return []
        now = time.monotonic()
        for r in busy:  # it ignored the interrupt
            self.result.failures[r] = RankFailure(
                r, "StillRunning", f"interrupted by the kit because rank {death.rank} died, but it ignored the "
                f"interrupt and still runs, so the kit stopped waiting for it (a consequence, not a cause). Run "
                f"`%dist restart` for fresh ranks.", time_s=now)
        return list(busy)


def _torch_said(failure: RankFailure) -> str:
    """torch's own words after the kit's, when it had any (an interrupt's KeyboardInterrupt has none: it read
    "(torch said: )")."""
    return f" (torch said: {failure.evalue[:300]})" if failure.evalue.strip() else ""
