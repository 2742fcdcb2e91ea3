"""Kernel side: the frames the IO thread answers itself, so no rank ever waits on the kernel's main
thread: pre-flight announcements, `where` answers, progress reports; and the bookkeeping a rank's
end or death needs at once (releasing ranks waiting in a pre-flight check, marking the group broken
even between cells). Everything else goes on to the request being collected."""
from __future__ import annotations

from typing import Any, Callable, Protocol

from kit.engine.deaths import describe_exit
from kit.engine.inspect import WhereBoard
from kit.engine.preflight import Preflight
from kit.protocol import DIED, DONE, PREFLIGHT, PROGRESS, RELEASED, WHERE

__all__ = ["on_io_frame"]


class Cluster(Protocol):
    """What the IO thread's frames need from kit.engine.cluster.Cluster."""

    state: str
    _stopping: bool
    _preflight: Preflight | None
    _where: WhereBoard
    _on_progress: Callable[[int, int, int], None] | None

    def _mark_broken(self, reason: str) -> None: ...


def on_io_frame(cluster: Cluster, rank: int, kind: str, body: Any) -> bool:
    """True when the frame was consumed here."""
    preflight = cluster._preflight
    if kind == PREFLIGHT and preflight:
        preflight.announce(rank, body)
        return True
    if kind in (WHERE, RELEASED):
        cluster._where.deliver(rank, body)
        return True
    if kind == PROGRESS:
        callback = cluster._on_progress
        if callback is not None:
            try:
                callback(rank, body["step"], body["total"])
            except Exception:
                pass  # a broken progress display must not stop the run
        return True
    if kind == DONE and preflight:
        err = body.get("error")
        where = f" at line {err.get('line')}" + (f" of {err['cell']}" if err.get("cell") else "") \
            if err is not None and err.get("line") else ""
        preflight.rank_ended(rank, "finished the cell" if err is None else f"raised {err['ename']}{where}")
    if kind == DIED and preflight:
        preflight.rank_ended(rank, f"died ({describe_exit(body)})")
    if kind == DIED and not cluster._stopping and cluster.state == "ready":
        cluster._mark_broken(f"rank {rank} {describe_exit(body)}")  # noticed even between cells
    return False
