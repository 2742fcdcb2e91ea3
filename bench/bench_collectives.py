"""Kit collective benchmark busbw vs a bare torch.distributed loop measuring the same thing.

    python bench/bench_collectives.py

Both run in one 2-rank gloo group, alternating, for all_reduce at a few sizes. The bare loop
is the textbook one: barrier, time `iters` back-to-back all_reduces, mean, busbw = 2(n-1)/n * S/t.
Target: the kit's busbw within 5% of the bare loop's.
"""
from __future__ import annotations

import statistics
import time

SIZES = [1 << 16, 1 << 20, 1 << 22]
ITERS, ROUNDS = 20, 3


def bare(sizes: list[int], iters: int) -> dict[int, float]:
    import torch
    import torch.distributed as dist
    n = dist.get_world_size()
    out = {}
    for s in sizes:
        t = torch.ones(s // 4)
        for _ in range(3):
            dist.all_reduce(t)
        dist.barrier()
        t0 = time.perf_counter()
        for _ in range(iters):
            dist.all_reduce(t)
        dt = torch.tensor([(time.perf_counter() - t0) / iters])
        dist.all_reduce(dt, op=dist.ReduceOp.MAX)
        out[s] = s / dt.item() / 1e9 * 2 * (n - 1) / n
    return out


def both(sizes: list[int], iters: int, rounds: int) -> dict[str, list[dict[int, float]]]:
    from kit.experiments.collectives import bench_rank, busbw_gbps
    res: dict[str, list[dict[int, float]]] = {"kit": [], "bare": []}
    for _ in range(rounds):
        raw = bench_rank(["all_reduce"], sizes, iters)["all_reduce"]
        res["kit"].append({b: busbw_gbps("all_reduce", b, t, 2) for b, t in raw})
        res["bare"].append(bare(sizes, iters))
    return res


def main() -> None:
    from kit.experiments.local import run_local
    res = run_local("bench_collectives:both", 2, SIZES, ITERS, ROUNDS)[0]
    print("all_reduce busbw GB/s, 2 gloo ranks (median of rounds)")
    for s in SIZES:
        k = statistics.median(r[s] for r in res["kit"])
        b = statistics.median(r[s] for r in res["bare"])
        print(f"  {s:>9} B: kit {k:6.3f}  bare loop {b:6.3f}  ratio kit/bare = {k / b:.3f} (target 0.95..1.05)")


if __name__ == "__main__":
    main()
