"""This CPU's matmul rate and copy bandwidth, measured on the ranks (all ranks call it at once), for
theory/local_time.py's LocalMachine. Every number returned is measured.

Why every rank at once: a run's ranks share the machine's cores, so the rate one rank reaches while the
others compute is the rate the step sees (on a machine busy with other work it is less again; the bench
calibrates between the runs it predicts, so both see the same load).

The fit t_ms = a + flops / rate over Linear forwards of growing row counts gives the matmul rate (its
slope). The fixed cost of one op as a training step pays it (Python, dispatch, autograd) is a Linear's
forward and backward at one row, over its three matmuls: small micro-batches pay that, large ones the rate.
"""
from __future__ import annotations

import statistics
import time
from typing import Any

import torch
import torch.distributed as dist

from kit.units import MIB

__all__ = ["calibrate_rank", "fit_op_rate", "handoff_rank", "blocked_call_rank"]


def fit_op_rate(points: list[tuple[float, float]]) -> tuple[float, float]:
    """Least squares t_ms = a + flops * b over (flops, t_ms): (a in us, 1/b in GFLOP/s)."""
    n = len(points)
    mx = sum(f for f, _ in points) / n
    my = sum(t for _, t in points) / n
    sxx = sum((f - mx) ** 2 for f, _ in points)
    b = sum((f - mx) * (t - my) for f, t in points) / sxx
    a = my - b * mx
    return max(a, 0.0) * 1e3, 1.0 / (b * 1e6)


def _sustained_ms(fn: Any, block_ms: float, blocks: int = 3) -> float:
    """ms per call, from blocks of back-to-back calls each lasting about `block_ms` (median of the blocks).
    Why blocks and not the median of single calls: on cores shared by more ranks (or other work) than they
    hold, a short call often runs alone between the scheduler's switches, and the median of single calls
    picks exactly those; a step runs for tens of ms and gets only its share. A block that long does too."""
    fn()
    t0 = time.perf_counter()
    fn()
    one_ms = max((time.perf_counter() - t0) * 1e3, 1e-3)
    k = max(1, int(block_ms / one_ms))
    per = []
    for _ in range(blocks):
        t0 = time.perf_counter()
        for _ in range(k):
            fn()
        per.append((time.perf_counter() - t0) * 1e3 / k)
    return statistics.median(per)


def calibrate_rank(width: int = 128, rows: tuple[int, ...] = (16, 64, 256, 1024, 4096), block_ms: float = 60.0,
                   copy_mib: int = 64, threads: int | None = None) -> dict[str, Any]:
    """Every rank: the Linear(width, 4 width) forward at each row count, fitted; one op's fixed cost; a copy
    of `copy_mib` MiB."""
    before = torch.get_num_threads()
    if threads:
        torch.set_num_threads(threads)
    try:
        lin = torch.nn.Linear(width, 4 * width)
        pts = []
        with torch.no_grad():
            for r in rows:
                x = torch.randn(r, width)
                if dist.is_initialized():
                    dist.barrier()   # every rank computes at the same time, as in a step
                pts.append((2.0 * r * width * 4 * width, _sustained_ms(lambda: lin(x), block_ms)))
        # one op's fixed cost as a training step pays it: a Linear's forward and backward at one row (three
        # matmuls, FLOPs negligible) through autograd, over three
        x1 = torch.randn(1, width, requires_grad=True)
        one_row_ms = _sustained_ms(lambda: lin(x1).sum().backward(), block_ms)
        src = torch.empty(int(copy_mib * MIB) // 4)
        dst = torch.empty_like(src)
        copy_ms = _sustained_ms(lambda: dst.copy_(src), block_ms)
    finally:
        torch.set_num_threads(before)
    _, gflops = fit_op_rate(pts)
    op_us = one_row_ms * 1e3 / 3
    return {"measured": True, "op_us": op_us, "matmul_gflops": gflops,
            "mem_gbps": 2 * copy_mib * MIB / (copy_ms * 1e-3) / 1e9, "points": pts,
            "threads": torch.get_num_threads() if not threads else threads}


def handoff_rank(nbytes: list[int], reps: int = 15, busy_ms: float = 10.0) -> dict[int, float]:
    """One hand-off between ranks 0 and 1 as a pipeline stage sees it, measured (median ms per size): rank 0
    computes for about `busy_ms` (a stage's micro-batch), then sends; rank 1 has waited in recv all that time.
    The time from the send's start on rank 0 to the recv's return on rank 1, on the clock both processes
    share (CLOCK_MONOTONIC): the bytes, and waking a rank that has been blocked (on a busy machine, waiting
    for a core), which the collective benchmark's back-to-back loop never pays. Other ranks idle."""
    r = dist.get_rank()
    out: dict[int, float] = {}
    a, b = torch.randn(128, 128), torch.randn(128, 128)
    for n in nbytes:
        buf = torch.zeros(max(2, n // 8), dtype=torch.float64)
        got = []
        for _ in range(reps):
            dist.barrier()
            if r == 0:
                t_end = time.perf_counter() + busy_ms / 1e3
                while time.perf_counter() < t_end:
                    a @ b
                buf[0] = time.perf_counter()
                dist.send(buf, 1)
            elif r == 1:
                dist.recv(buf, 0)
                got.append((time.perf_counter() - float(buf[0])) * 1e3)
        t = torch.tensor([statistics.median(got) if got else 0.0], dtype=torch.float64)
        dist.broadcast(t, src=1)
        out[n] = float(t)
    return out


def blocked_call_rank(nbytes: int = 4096, busy_ms: float = 8.0, iters: int = 12, op: str = "all_reduce"
                      ) -> dict[str, float]:
    """One blocking call as a step meets it, measured: every rank computes for about `busy_ms` (a layer's
    work), then calls and waits. `op` "all_reduce": an all-reduce of `nbytes` over every rank, as tp's
    all-reduces and FSDP2's gathers and reduce-scatters do on CPU ranks; "ring": a send of `nbytes` to the
    next rank and a receive from the previous one, both waited, as cp's ring attention exchanges its K/V
    chunks (it waits for one neighbour, not for every rank). Per rank, the mean ms from the call to its
    return over `iters` calls, the wait for a later rank included (a step pays both; a sum of calls needs the
    mean, not the median); also `back_to_back_ms`, the same call right after a barrier, the collective
    benchmark's condition.

    Why both: on a machine whose cores are shared with other jobs, a rank that has computed up to the call
    and then blocks waits for a core when the peer's data arrives, behind jobs that ran less recently; the
    back-to-back loop rarely pays that (measured here at load 9-13: 5-11 ms per call after compute, 0.2-2.9
    ms back to back, at 4 KiB and 512 KiB alike). A rank that has been idle (a pipeline stage in its bubble)
    is woken sooner: handoff_rank measures that case. Why, by the scheduler's documented policy (not measured
    here): Linux 6.6 and later (EEVDF, docs.kernel.org/scheduler/sched-eevdf.html) runs first the tasks that
    have received less than their share of the CPU; a rank that computed up to the call has had its share,
    one that idled has not."""
    if op not in ("all_reduce", "ring"):
        raise ValueError(f"op={op!r}: choose 'all_reduce' or 'ring'")
    buf, got = torch.ones(max(1, nbytes // 4)), torch.empty(max(1, nbytes // 4))
    a, b = torch.randn(128, 128), torch.randn(128, 128)
    r, p = dist.get_rank(), dist.get_world_size()

    def call() -> None:
        if op == "all_reduce":
            dist.all_reduce(buf)
        else:
            for work in (dist.isend(buf, (r + 1) % p), dist.irecv(got, (r - 1) % p)):
                work.wait()
    call()   # the first call sets up gloo's pairs: not timed

    def timed(before: Any) -> float:
        ms = []
        for _ in range(iters):
            before()
            t0 = time.perf_counter()
            call()
            ms.append((time.perf_counter() - t0) * 1e3)
        return statistics.mean(ms)

    def compute() -> None:
        t_end = time.perf_counter() + busy_ms / 1e3
        while time.perf_counter() < t_end:
            a @ b
    return {"measured": True, "after_compute_ms": timed(compute), "back_to_back_ms": timed(dist.barrier)}
