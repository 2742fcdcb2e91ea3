"""One clock for all ranks: a common time origin agreed at the start of a run.

Why: each rank stamps with its own perf_counter; to draw ranks on one time axis (and to see
that a send precedes its receive) every rank needs the same origin and, across hosts, the
offset between its clock and rank 0's.

- Same host (same kernel boot id): perf_counter is CLOCK_MONOTONIC, one clock for every
  process, so the offset is exactly 0 and rank 0 simply broadcasts its origin.
- Across hosts: a ping-pong with rank 0 (Cristian's algorithm): rank 0 sends, rank r replies
  with its clock, rank 0 takes the round trip with the smallest RTT; offset = t_r - midpoint,
  error bound = RTT/2. The record keeps the bound so a reader knows how far to trust
  cross-host alignment.

All ranks must call `agree` together (it uses collectives).
"""
from __future__ import annotations

import time
from dataclasses import asdict, dataclass
from typing import Any

import torch
import torch.distributed as dist

from kit.rank.profile import boot_id  # the profiler's merge asks the same question

__all__ = ["ClockSync", "agree", "boot_id", "selftest_ping_pong"]


@dataclass
class ClockSync:
    origin_ms: float   # the run's origin in *this* rank's clock
    offset_ms: float   # this clock minus rank 0's clock
    error_ms: float    # bound on |offset error| (0 on one host)
    method: str        # "shared monotonic clock" or "ping-pong"

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def _now_ms() -> float:
    return time.perf_counter() * 1e3


def agree(device: torch.device, force_ping_pong: bool = False, rounds: int = 8) -> ClockSync:
    """The common origin and this rank's offset to rank 0 (see the module doc)."""
    if not dist.is_initialized() or dist.get_world_size() == 1:
        return ClockSync(_now_ms(), 0.0, 0.0, "one process")
    rank, world = dist.get_rank(), dist.get_world_size()
    ids: list[Any] = [None] * world
    dist.all_gather_object(ids, boot_id())
    one_host = len(set(ids)) == 1 and not force_ping_pong
    offset = err = 0.0
    if not one_host:
        offset, err = _ping_pong(rank, world, device, rounds)
    # float64: perf_counter in ms since boot needs more than float32's 7 digits.
    t = torch.tensor([_now_ms() - offset], dtype=torch.float64, device=device)
    dist.broadcast(t, src=0)  # rank 0's "now", in rank 0's clock
    origin_local = float(t.item()) + offset
    return ClockSync(origin_local, offset, err, "shared monotonic clock" if one_host else "ping-pong")


def _ping_pong(rank: int, world: int, device: torch.device, rounds: int) -> tuple[float, float]:
    """Offset of this rank's clock to rank 0's, and its error bound (ms). Rank 0 gets (0, 0)."""
    buf = torch.zeros(1, dtype=torch.float64, device=device)

    def arrived() -> None:
        # NCCL's recv returns to the host at enqueue; a stamp must wait for the data.
        if device.type == "cuda":
            torch.cuda.synchronize()

    result = torch.zeros(world, 2, dtype=torch.float64, device=device)
    if rank == 0:
        for r in range(1, world):
            best = (float("inf"), 0.0)
            for _ in range(rounds):
                t_send = _now_ms()
                dist.send(buf, r)
                dist.recv(buf, r)
                arrived()
                t_back = _now_ms()
                rtt = t_back - t_send
                if rtt < best[0]:  # the shortest round trip has the tightest bound
                    best = (rtt, float(buf.item()) - (t_send + t_back) / 2)
            result[r, 0], result[r, 1] = best[1], best[0] / 2
    else:
        for _ in range(rounds):
            dist.recv(buf, 0)
            arrived()
            buf.fill_(_now_ms())
            dist.send(buf, 0)
    dist.broadcast(result, src=0)
    return float(result[rank, 0]), float(result[rank, 1])


def selftest_ping_pong() -> dict[str, Any]:
    """The cross-host method run on one host (where the true offset is 0): tests and benches."""
    return agree(torch.device("cpu"), force_ping_pong=True).to_dict()
