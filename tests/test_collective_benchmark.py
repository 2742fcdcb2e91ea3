"""The collective benchmark: bus bandwidth and the alpha-beta fit on known numbers, and a sweep on 2 gloo ranks."""
from __future__ import annotations

import pytest

from kit.experiments.benchmarks.collectives import algbw_gbps, bus_factor, busbw_gbps, fit_alpha_beta, make_records
from kit.experiments.harness.local import run_local


def test_busbw_formulas_on_known_numbers() -> None:
    assert algbw_gbps(10**9, 1000.0) == pytest.approx(1.0)
    assert busbw_gbps("all_reduce", 10**9, 1000.0, 4) == pytest.approx(1.5)      # 2(n-1)/n
    assert busbw_gbps("all_gather", 8 * 10**9, 1000.0, 8) == pytest.approx(7.0)  # (n-1)/n of the total
    assert bus_factor("reduce_scatter", 2) == pytest.approx(0.5)
    assert busbw_gbps("broadcast", 10**9, 500.0, 8) == pytest.approx(2.0)
    # alpha-beta fit recovers a known line: 20 us + bytes / 5 GB/s
    pts = [(s, 0.020 + s / 5e9 * 1e3) for s in (1e3, 1e5, 1e6, 1e7)]
    fit = fit_alpha_beta(pts)
    assert fit["alpha_us"] == pytest.approx(20.0, rel=1e-6) and fit["beta_gbps"] == pytest.approx(5.0, rel=1e-6)
    assert max(abs(r) for r in fit["residuals_pct"]) < 1e-6


def test_collective_sweep_on_two_ranks() -> None:
    sizes = [4096, 65536, 1 << 20]
    raw = run_local("kit.experiments.benchmarks.collectives:bench_rank", 2, ["all_reduce", "all_gather", "broadcast"], sizes, 3)
    assert raw[0] == raw[1]  # every rank reports the slowest rank's time
    for rec in make_records(raw[0], 2, "gloo", "cpu"):
        assert rec["schema"] == "kit.collectives/1" and [p["bytes"] for p in rec["points"]] == sizes
        for p in rec["points"]:
            assert p["time_ms"] > 0
            assert p["busbw_gbps"] == pytest.approx(p["algbw_gbps"] * bus_factor(rec["op"], 2))
        assert {"alpha_us", "beta_gbps", "residuals_pct"} <= set(rec["fit"]) and len(rec["fit"]["residuals_pct"]) == 3
