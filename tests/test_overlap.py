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
    slower by a few percent; on 1536 (gathers 4x the compute) the step is the gathers' either way."""
    runs = {r.id: r for r in published_runs()}
    for rid, grows in (("sc21-t2-zero3-174.6B-384", True), ("sc21-t2-zero3-174.6B-1536", False)):
        r = runs[rid]
        pc = ParallelConfig(dp=r.knobs["dp"], zero=3, micro_batch=r.knobs["micro_batch"], recompute="full",
                            framework=r.framework, precision=r.precision)
        calm = replace(r.cluster, accelerator=replace(r.cluster.accelerator, overlap_slowdown=0.0))
        slowed, ideal = step_time(r.model, pc, r.cluster, r.seq_len), step_time(r.model, pc, calm, r.seq_len)
        assert slowed.step_s >= ideal.step_s
        assert (slowed.step_s > 1.03 * ideal.step_s) == grows, (rid, slowed.step_s, ideal.step_s)
        assert (slowed.step_s < 1.001 * ideal.step_s) == (not grows)


def test_deepspeed_recompute_backward_waits_for_its_gather_behind_the_reduce_scatter() -> None:
    """DeepSpeed prefetches a layer's backward gather only when its recompute starts, and the reduce-scatter
    of the layer before shares the link: with compute and collectives equal, a layer's backward takes 4 units
    where perfect overlap gives 3; communication bound, the collectives' time, as before."""
    from kit.experiments.theory.layout_zero import _deepspeed_recompute_backward
    k = 100
    # recompute 1, backward proper 2 (c_b = 3); each collective 1: (k-1) layers of 2 + 2 and one of 1 + 2
    assert _deepspeed_recompute_backward(k, 1.0, 3.0, 1.0, 1.0, 0.0) == pytest.approx((k - 1) * 4 + 3 - 3 * k)
    # collectives 2: the link's 2 x 2 + 2 per layer bound the step either way
    assert _deepspeed_recompute_backward(k, 1.0, 3.0, 2.0, 2.0, 0.0) == pytest.approx((k - 1) * 6 + 4 - 3 * k)
    # compute bound (collectives 0.5): nothing beyond the compute
    assert _deepspeed_recompute_backward(k, 1.0, 3.0, 0.5, 0.5, 0.0) == pytest.approx(0.0)
