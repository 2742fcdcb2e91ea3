"""The hand-written all-reduces (ring, gather-to-root + broadcast) equal dist.all_reduce.

2 ranks, and 3 ranks so the ring's chunks are uneven (1000*N + 3 elements). Tolerance 1e-5
absolute on sums of N standard normals: another summation order changes fp32 sums by ~1e-7.
"""
from __future__ import annotations

import pytest

from kit.experiments.benchmarks.allreduce_algos import ALGOS, records_from, wire_bytes_per_rank
from kit.experiments.harness.local import run_local


@pytest.mark.parametrize("world_size", [2, 3])
def test_hand_written_allreduce_equals_dist(world_size: int) -> None:
    res = run_local("kit.experiments.benchmarks.allreduce_algos:bench_algos", world_size, [4096], 1, 0,
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


def _rec(comp: str, gbps: float, step_ms: float, nbytes: int) -> dict:
    return {"config": {"compression": comp, "link_gbps": gbps, "world_size": 2},
            "summary": {"step_ms": step_ms, "bytes_per_step": nbytes}}


def test_break_even_finds_the_crossing() -> None:
    from kit.experiments.benchmarks.compression_bench import break_even
    # none: 10 ms + 4 MB / link; fp16: 12 ms + 2 MB / link: equal at exactly 1 GB/s. The
    # prediction uses the fastest link's difference (1.8 ms: the bytes there still cost 0.2 ms).
    recs = []
    for g in (0.1, 0.5, 2.0, 10.0):
        recs += [_rec("none", g, 10 + 4e6 / (g * 1e9) * 1e3, 4_000_000),
                 _rec("fp16", g, 12 + 2e6 / (g * 1e9) * 1e3, 2_000_000)]
    be = break_even(recs)["fp16"]
    assert 0.5 < be["break_even_gbps_measured"] < 2.0  # log-interpolated around 1
    assert be["break_even_gbps_predicted"] == pytest.approx(2e6 / 1.8e-3 / 1e9, rel=1e-6)
    assert not be["wins_at_every_link"]


def test_break_even_uses_the_median_and_the_fastest_winning_link() -> None:
    from kit.experiments.benchmarks.compression_bench import break_even
    # A noisy outlier (fp16 at 0.5 GB/s, one of three repeats) must not move the crossing.
    recs = []
    for g in (0.1, 0.5, 2.0, 10.0):
        for k in range(3):
            recs.append(_rec("none", g, 10 + 4e6 / (g * 1e9) * 1e3, 4_000_000))
            slow = 100.0 if (g == 0.5 and k == 0) else 0.0
            recs.append(_rec("fp16", g, 12 + 2e6 / (g * 1e9) * 1e3 + slow, 2_000_000))
    be = break_even(recs)["fp16"]
    assert 0.5 < be["break_even_gbps_measured"] < 2.0
    assert [r["repeats"] for r in be["rows"]] == [3, 3, 3, 3]
