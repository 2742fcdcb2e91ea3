"""Overlapped communication slows the compute beside it (theory/overlap.py): a 'hidden' collective still
costs a share of its length, most where compute and communication are equal (SC21's ZeRO-3 on 384 A100s)."""
from __future__ import annotations

from dataclasses import replace

import pytest

from kit.experiments.theory.layout_memory import ParallelConfig
from kit.experiments.theory.layout_time import step_time
from kit.experiments.theory.overlap import exposed_s, overlapped_s
from kit.experiments.theory.published import published_runs


def test_the_three_regimes_of_a_collective_beside_compute() -> None:
    assert overlapped_s(10.0, 0.0, 0.2) == 10.0                        # nothing beside it
    assert overlapped_s(10.0, 6.0, 0.2) == pytest.approx(10.0 + 6.0 * 0.2 / 1.2)  # hidden, the compute slowed
    assert overlapped_s(10.0, 13.0, 0.2) == 13.0                       # communication bound: the collective's time
    assert overlapped_s(10.0, 12.0, 0.2) == pytest.approx(12.0)        # the two regimes meet at compute x (1 + s)
    assert overlapped_s(10.0, 6.0, 0.0) == 10.0                        # no contention: perfect overlap, max()
    assert exposed_s(10.0, 10.0, 0.2) == pytest.approx(10.0 / 6)       # equal: the largest share of the two


def test_balanced_zero3_pays_for_the_contention_and_communication_bound_zero3_does_not() -> None:
    """The same layout with the slowdown and without it: SC21's 174.6B on 384 A100s (compute ~ gathers) is
    slower by over a tenth; on 1536 (gathers 4x the compute) the step is the gathers' either way."""
    runs = {r.id: r for r in published_runs()}
    for rid, grows in (("sc21-t2-zero3-174.6B-384", True), ("sc21-t2-zero3-174.6B-1536", False)):
        r = runs[rid]
        pc = ParallelConfig(dp=r.knobs["dp"], zero=3, micro_batch=r.knobs["micro_batch"], recompute="full",
                            framework=r.framework, precision=r.precision)
        calm = replace(r.cluster, accelerator=replace(r.cluster.accelerator, overlap_slowdown=0.0))
        slowed, ideal = step_time(r.model, pc, r.cluster, r.seq_len), step_time(r.model, pc, calm, r.seq_len)
        assert slowed.step_s >= ideal.step_s
        assert (slowed.step_s > 1.10 * ideal.step_s) == grows, (rid, slowed.step_s, ideal.step_s)
        assert (slowed.step_s < 1.001 * ideal.step_s) == (not grows)
