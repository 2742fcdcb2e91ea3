"""Kernel side: recovery between cells. Re-create a failed process group keeping every variable,
and deal with ranks still busy with a cell the user stopped waiting for."""
from __future__ import annotations

import queue
import time
from kit.engine.io import OUT
from kit.engine.output import CellResult, LineSplitter
from kit.engine.running import Running
from kit.engine.watch import Emit, collect
from kit.errors import ClusterStateError
from kit.messages import DIED, DONE, RESET_PG

__all__ = ["drain_abandoned", "soft_reset"]


ABANDONED_GRACE_S = 3.0  # ranks running Python that still have not stopped this long after a fresh SIGINT never will


def drain_abandoned(running: Running, emit: Emit) -> None:
    """Before a new request: ranks still busy with a cell the user stopped waiting for.

    A rank blocked inside a gloo collective ends at the process-group timeout, so that wait is
    bounded and said. A rank running Python that ignored three interrupts will not stop by
    itself: it gets one more SIGINT and a few seconds, then the cell is refused with the choice
    (wait and re-run, or `%dist restart`) instead of waiting blind. The caller checks the ranks are
    still usable afterwards.
    """
    assert running.abandoned is not None
    rid, waiting = running.abandoned
    events, pg_timeout_s = running.io.events, running.config.pg_timeout_s
    report = running.where(sorted(waiting), timeout_s=1.0)
    blocked = [r for r, text in report.items() if text.startswith("blocked inside")]
    limit_s = pg_timeout_s + 5 if blocked else ABANDONED_GRACE_S
    what = (f"rank(s) {sorted(blocked)} to leave a gloo collective (it raises at the {pg_timeout_s:g} s "
            f"process-group timeout)" if blocked else f"rank(s) {sorted(waiting)} to stop the cell you stopped "
            f"waiting for (interrupted once more)")
    if not blocked:
        running.interrupt(sorted(waiting))
    emit(-1, "stderr", f"waiting up to {limit_s:.0f} s for {what}; interrupt to stop waiting, or run "
                       f"`%dist restart` for fresh ranks (variables are lost)")
    deadline, suspect = time.monotonic() + limit_s, False
    try:
        while waiting and time.monotonic() < deadline:
            try:
                ev = events.get(timeout=0.2)
            except queue.Empty:
                continue
            if ev.kind == OUT:
                emit(ev.rank, ev.stream, ev.body.decode("utf-8", "replace").rstrip("\n"))
            elif ev.kind == DONE and ev.body["id"] == rid:
                waiting.discard(ev.rank)
                suspect = suspect or bool(ev.body.get("suspect"))
            elif ev.kind == DIED:
                running.mark_broken(running.death_reason(ev.rank, ev.body))
                break
    except KeyboardInterrupt:
        pass  # the user chose not to wait: say what is still running, below
    if waiting and running.ready:
        busy = ", ".join(f"rank {r}: {report.get(r, 'busy').splitlines()[0]}" for r in sorted(waiting))
        raise ClusterStateError(
            f"rank(s) {sorted(waiting)} are still running an earlier cell ({busy}); it ignores interrupts"
            f"{' or is inside a collective' if blocked else ''}. This cell did not run. Either run "
            f"`%dist restart` for fresh ranks (every variable is lost), or let it finish and run this cell again "
            f"(`%dist where` shows what it is doing).")
    running.abandoned = None
    if running.ready and suspect:
        soft_reset(running, None)


def soft_reset(running: Running, result: CellResult | None, why: str = "failed") -> None:
    """Re-create the process group on a fresh store prefix; every rank keeps its Python state."""
    everyone = tuple(range(running.config.world_size))
    rid, prefix = running.new_id(), running.next_pg_prefix()
    running.preflight.begin(rid, frozenset(everyone))
    for r in everyone:
        running.send(r, RESET_PG, {"id": rid, "prefix": prefix, "check": False})
    res = collect(running, rid, everyone, LineSplitter(lambda *a: None), lambda *a: None, None)
    if res.ok and why == "destroyed":
        # torch resets its group counter when the default group is destroyed, so the new one is named "0" as
        # the old one was; a DeviceMesh keeps group names, not groups (the same under torchrun with a re-init)
        text = ("[kit] the cell called destroy_process_group(), so the kit re-created the default group for the "
                "next cells (`dist` works as before; `%dist export` writes the same into the script). Objects "
                "that hold the old group (DDP models, `new_group()` groups) must be rebuilt. A DeviceMesh and the "
                "DTensor modules on it find their groups by name, and torch named the new default group \"0\" "
                "again: a 1-D mesh over every rank keeps working, on the new group, where a script that does not "
                "re-create the group fails (\"Could not resolve the process group registered under the name 0\").")
    elif res.ok and why == "released":
        text = ("[kit] the kit closed group connections to end that wait, so it re-created the process group (destroy "
                "+ init on a fresh store prefix). Your variables are kept; objects built on the old group (DDP models, "
                "subgroups) must be rebuilt.")
    elif res.ok:
        text = ("[kit] a collective failed, so the kit re-created the process group (destroy + init on a fresh "
                "store prefix). Your variables are kept; objects built on the old group (DDP models, subgroups) "
                "must be rebuilt.")
    else:
        running.mark_broken("the process group could not be re-created after a collective failed")
        text = f"[kit] re-creating the process group failed: {next(iter(res.failures.values())).summary()}"
    if result is not None:
        result.notes.append(text)
