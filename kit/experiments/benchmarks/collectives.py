"""Collective benchmark: time all_reduce, all_gather, reduce_scatter, broadcast over sizes.

Bandwidths follow nccl-tests (NVIDIA/nccl-tests doc/PERFORMANCE.md; docs/hardware.md):
  algbw = S / t, with S the *total* array size in bytes (for all_gather / reduce_scatter the
  size of the gathered array, i.e. count * world_size);
  busbw = algbw * factor: all_reduce 2(n-1)/n, all_gather and reduce_scatter (n-1)/n,
  broadcast 1. busbw is comparable to a link's per-direction peak at any rank count.
Then a least-squares alpha-beta fit t = alpha + S / beta, with residuals in percent (kept in
the record and drawn under the bandwidth plot: a straight line is a model, and the residuals
say where it fails). For the ring collectives the fitted alpha is split per ring step:
all_reduce pays 2(p-1) step latencies, all_gather and reduce_scatter p-1.

Sizes run to 64 MiB: on gloo busbw is still rising at 4 MiB. Memory per rank at the largest
size: the full array (64 MiB) + one shard + gloo's scratch; measured peak RSS about 500 MiB
per rank on 2 gloo ranks, of which about 220 MiB is torch itself (docs/measuring.md).

`bench_rank` is worker side (torch); the formulas and the fit are pure Python.
"""
from __future__ import annotations

import time
from typing import Any

from kit.experiments.theory.links import RING_STEPS, ring_factor, ring_steps

__all__ = ["latency_steps", "bus_factor", "make_records", "algbw_gbps", "busbw_gbps", "fit_alpha_beta", "bench_rank", "collective_benchmark",
           "DEFAULT_SIZES", "OPS"]

OPS = ("all_reduce", "all_gather", "reduce_scatter", "broadcast")
DEFAULT_SIZES = tuple(2**k for k in range(10, 27, 2))  # 1 KiB .. 64 MiB, bytes


def latency_steps(op: str, n: int) -> int | None:
    """How many ring steps pay the latency alpha (None: not a ring algorithm)."""
    return ring_steps(op, n) if op in RING_STEPS else None


def bus_factor(op: str, n: int) -> float:
    """nccl-tests' bus bandwidth factor: the ring's bytes per payload byte, 1 for a broadcast."""
    return 1.0 if op == "broadcast" else ring_factor(op, n)


def algbw_gbps(nbytes: int, time_ms: float) -> float:
    return nbytes / (time_ms * 1e-3) / 1e9


def busbw_gbps(op: str, nbytes: int, time_ms: float, world_size: int) -> float:
    return algbw_gbps(nbytes, time_ms) * bus_factor(op, world_size)


def fit_alpha_beta(points: list[tuple[int, float]]) -> dict[str, Any]:
    """Fit t_ms = a + b * bytes; alpha = a (us), beta = 1/b (GB/s); residuals in % of t.

    Weighted least squares with weights 1/t^2, i.e. minimising *relative* error: sizes span
    several decades, and plain least squares would let the largest message decide alone.
    """
    w = [1.0 / (t * t) if t > 0 else 0.0 for _, t in points]
    xs, ys = [float(p[0]) for p in points], [float(p[1]) for p in points]
    sw = sum(w)
    mx, my = sum(wi * x for wi, x in zip(w, xs)) / sw, sum(wi * y for wi, y in zip(w, ys)) / sw
    sxx = sum(wi * (x - mx) ** 2 for wi, x in zip(w, xs))
    b = sum(wi * (x - mx) * (y - my) for wi, x, y in zip(w, xs, ys)) / sxx if sxx else 0.0
    a = my - b * mx
    res = [100.0 * (y - (a + b * x)) / y if y else 0.0 for x, y in zip(xs, ys)]
    beta = (1.0 / b) * 1e3 / 1e9 if b > 0 else 0.0  # bytes per ms -> GB/s (0: no bandwidth term fitted)
    return {"alpha_us": max(a, 0.0) * 1e3, "beta_gbps": beta, "residuals_pct": res,
            "max_abs_residual_pct": max((abs(r) for r in res), default=0.0)}


def bench_rank(ops: list[str], sizes: list[int], iters: int = 10, warmup: int = 3) -> dict[str, list[tuple[int, float]]]:
    """Worker side: mean time (ms) per op and size; the slowest rank's time (a MAX all-reduce)."""
    import torch
    import torch.distributed as dist
    from kit.experiments.measure.group_device import group_device
    dev = group_device()  # NCCL reduces GPU tensors only
    n = dist.get_world_size()
    # torch 2.13 deprecates *_tensor in favour of *_single (same semantics).
    reduce_scatter = getattr(dist, "reduce_scatter_single", None) or dist.reduce_scatter_tensor
    all_gather = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor
    out: dict[str, list[tuple[int, float]]] = {}
    for op in ops:
        pts = []
        for size in sizes:
            numel = max(n, size // 4 // n * n)  # float32, divisible by n for the sharded ops
            full = torch.ones(numel, device=dev)
            # the shard only where the op uses one: at 64 MiB every buffer counts on Binder
            shard = torch.ones(numel // n, device=dev) if op in ("all_gather", "reduce_scatter") else full

            def once() -> None:
                if op == "all_reduce":
                    dist.all_reduce(full)
                elif op == "all_gather":
                    all_gather(full, shard)
                elif op == "reduce_scatter":
                    reduce_scatter(shard, full)
                else:
                    dist.broadcast(full, src=0)
            for _ in range(warmup):
                once()
            times = []
            for _ in range(iters):
                dist.barrier()  # start together, so one rank's lateness is not timed as the op
                if dev.type == "cuda":
                    torch.cuda.synchronize()
                t0 = time.perf_counter()
                once()
                if dev.type == "cuda":
                    torch.cuda.synchronize()
                times.append((time.perf_counter() - t0) * 1e3)
            # Median over iterations (robust to a descheduled iteration on a busy machine), then
            # the slowest rank: a collective is finished when its last rank is.
            t = torch.tensor([sorted(times)[len(times) // 2]], device=dev)  # NCCL reduces GPU tensors only
            dist.all_reduce(t, op=dist.ReduceOp.MAX)
            pts.append((numel * 4, float(t.item())))
        out[op] = pts
    return out


def _fit(op: str, pts: list[tuple[int, float]], world_size: int) -> dict[str, Any]:
    fit = fit_alpha_beta(pts)
    steps = latency_steps(op, world_size)
    fit["latency_steps"] = steps
    fit["alpha_per_step_us"] = fit["alpha_us"] / steps if steps else None
    return fit


def make_records(raw: dict[str, list[tuple[int, float]]], world_size: int, backend: str, device_type: str,
                 emulated: bool = False) -> list[dict[str, Any]]:
    """One "kit.collectives/1" record per op."""
    recs = []
    for op, pts in raw.items():
        recs.append({"schema": "kit.collectives/1", "op": op, "world_size": world_size, "backend": backend,
                     "device_type": device_type, "emulated": emulated,
                     "points": [{"bytes": b, "time_ms": t, "algbw_gbps": algbw_gbps(b, t),
                                 "busbw_gbps": busbw_gbps(op, b, t, world_size)} for b, t in pts],
                     "fit": _fit(op, pts, world_size)})
    return recs


def collective_benchmark(cluster: Any = None, ops: list[str] | tuple[str, ...] = OPS,
                         sizes: list[int] | tuple[int, ...] = DEFAULT_SIZES, iters: int = 10,
                         world_size: int = 2, results_path: str | None = None) -> list[dict[str, Any]]:
    """Kernel side: run the sweep on the cluster's ranks (or ranks this module starts)."""
    from kit.experiments.api import cluster_for
    from kit.experiments.records import append_jsonl
    bad = [o for o in ops if o not in OPS]
    if bad:
        raise ValueError(f"unknown collective(s) {bad}; choose from {list(OPS)}")
    c = cluster_for(world_size, cluster, "cpu")
    raw = c.call("kit.experiments.benchmarks.collectives:bench_rank", list(ops), list(sizes), iters)[0]
    recs = make_records(raw, c.world_size, c.backend, c.device_type)
    if results_path:
        for r in recs:
            append_jsonl(results_path, r)
    return recs
