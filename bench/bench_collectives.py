"""Kit collective benchmark busbw vs a bare torch.distributed loop measuring the same thing.

    python bench/bench_collectives.py [--quick]

"The same thing": per iteration a barrier, then one timed all_reduce; the median over
iterations; the slowest rank's time; busbw = 2(n-1)/n * S / t (nccl-tests). The kit side is
`kit.experiments.collective_benchmark` running in the kit's worker processes (ledger wrappers
installed, pre-flight off, as in a measured run); the bare side is a textbook loop written here,
in plain spawned processes with the same threads per rank. Rounds alternate kit, bare, kit, ...
so machine noise hits both. Target: kit busbw within 5% of the bare loop's.
"""
from __future__ import annotations

import statistics
import sys
import time

SIZES = [1 << 16, 1 << 20, 1 << 22]


def bare(sizes: list[int], iters: int) -> dict[int, float]:
    """The textbook loop, in a plain process (no kit code on the timed path)."""
    import torch
    import torch.distributed as dist
    from kit.experiments import ring_factor  # after the timing only
    n = dist.get_world_size()
    out = {}
    for s in sizes:
        t = torch.ones(s // 4)
        for _ in range(3):
            dist.all_reduce(t)
        times = []
        for _ in range(iters):
            dist.barrier()
            t0 = time.perf_counter()
            dist.all_reduce(t)
            times.append(time.perf_counter() - t0)
        dt = torch.tensor([statistics.median(times)])
        dist.all_reduce(dt, op=dist.ReduceOp.MAX)
        out[s] = s / dt.item() / 1e9 * ring_factor("all_reduce", n)
    return out


def kit_side(sizes: list[int], iters: int) -> dict[int, float]:
    from kit.engine.cluster import Cluster
    from kit.config import LaunchConfig
    from kit.experiments import collective_benchmark
    with Cluster(LaunchConfig(world_size=2, check_collectives=False)) as c:
        rec = collective_benchmark(cluster=c, ops=["all_reduce"], sizes=sizes, iters=iters)[0]
    return {p["bytes"]: p["busbw_gbps"] for p in rec["points"]}


def main() -> None:
    from kit.experiments.harness.local import run_local
    quick = "--quick" in sys.argv
    iters, rounds = (5, 1) if quick else (30, 4)
    res: dict[str, list[dict[int, float]]] = {"kit": [], "bare": []}
    for _ in range(rounds):
        res["kit"].append(kit_side(SIZES, iters))
        res["bare"].append(run_local("bench_collectives:bare", 2, SIZES, iters)[0])
    print(f"all_reduce busbw GB/s, 2 gloo ranks, {iters} iterations, median of {rounds} alternating rounds")
    for s in SIZES:
        k = statistics.median(r[s] for r in res["kit"])
        b = statistics.median(r[s] for r in res["bare"])
        verdict = "PASS" if 0.95 <= k / b <= 1.05 else "outside target (noisy machine? re-run)"
        print(f"  {s:>9} B: kit {k:6.3f}  bare loop {b:6.3f}  ratio kit/bare = {k / b:.3f} (target 0.95..1.05) {verdict}")


if __name__ == "__main__":
    main()
