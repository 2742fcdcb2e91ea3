"""The hand-written all-reduces (ring, gather-to-root + broadcast) equal dist.all_reduce.

2 ranks, and 3 ranks so the ring's chunks are uneven (1000*N + 3 elements). Tolerance 1e-5
absolute on sums of N standard normals: another summation order changes fp32 sums by ~1e-7.
"""
from __future__ import annotations

import pytest

from kit.experiments.allreduce_algos import ALGOS, records_from, wire_bytes_per_rank
from kit.experiments.local import run_local


@pytest.mark.parametrize("world_size", [2, 3])
def test_hand_written_allreduce_equals_dist(world_size: int) -> None:
    res = run_local("kit.experiments.allreduce_algos:bench_algos", world_size, [4096], 1, 0,
                    threads_per_rank=1)
    for r in range(world_size):
        errs = res[r]["max_abs_err_vs_all_reduce"]
        assert set(errs) == set(ALGOS)
        assert max(errs.values()) <= 1e-5, errs
    recs = records_from(res[0], world_size, "gloo", "cpu")
    assert [r["op"] for r in recs] == list(ALGOS)
    assert all(p["time_ms"] > 0 and p["busbw_gbps"] > 0 for r in recs for p in r["points"])


def test_wire_bytes_root_grows_with_ranks_ring_does_not() -> None:
    s = 1 << 20
    ring = [wire_bytes_per_rank(ALGOS[1], s, n)["busiest_rank"] for n in (2, 4, 8)]
    root = [wire_bytes_per_rank(ALGOS[2], s, n)["busiest_rank"] for n in (2, 4, 8)]
    assert ring == [s, 1.5 * s, 1.75 * s] and all(x < 2 * s for x in ring)
    assert root == [s, 3 * s, 7 * s]
