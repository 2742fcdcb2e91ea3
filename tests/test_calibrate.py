"""This machine's numbers for the local time model (measure/calibrate.py), measured on two gloo ranks."""
from __future__ import annotations

import pytest

from kit.experiments.measure.calibrate import fit_op_rate


def test_fit_recovers_a_known_rate_and_intercept():
    pts = [(f, 0.05 + f / 20e6) for f in (1e6, 1e7, 1e8, 1e9)]   # 50 us + flops at 20 GFLOP/s
    op_us, gflops = fit_op_rate(pts)
    assert op_us == pytest.approx(50.0, rel=1e-6) and gflops == pytest.approx(20.0, rel=1e-6)


def test_ranks_measure_rates_latencies_a_hand_off_and_a_blocking_call():
    from kit.experiments.harness.local import run_local
    cal = run_local("kit.experiments.measure.calibrate:calibrate_rank", 2, 64, (16, 256, 2048), 5.0, 4, 1)
    for r in (0, 1):
        assert cal[r]["measured"] and cal[r]["matmul_gflops"] > 0 and cal[r]["op_us"] > 0 and cal[r]["mem_gbps"] > 0
    out = run_local("kit.experiments.measure.calibrate:handoff_rank", 2, [4096, 1 << 20], 3, 2.0)
    assert out[0] == out[1] and set(out[0]) == {4096, 1 << 20}
    assert all(ms > 0 for ms in out[0].values())
    for op in ("all_reduce", "ring"):
        calls = run_local("kit.experiments.measure.calibrate:blocked_call_rank", 2, 4096, 2.0, 3, op)
        for r in (0, 1):   # a blocking call takes time whichever way the rank reached it
            assert calls[r]["measured"] and calls[r]["after_compute_ms"] > 0 and calls[r]["back_to_back_ms"] > 0
