"""Interleaved 1F1B in the planner and the predictor: the bubble (p-1)/(v m + p-1) the kit measures,
v times the pipeline sends, the first stage's in-flight activations against the schedule itself,
which v the planner tries, when it chooses interleaving and when not (with the reason)."""
from __future__ import annotations

import math

from dataclasses import replace
from typing import Any

import pytest

from kit.experiments.theory.bubble import predicted_bubble
from kit.experiments import cluster_spec  # a planned cluster (conftest's make_cluster starts ranks)
from kit.experiments.theory.layout_memory import ParallelConfig, in_flight, memory_per_gpu, stage_layers
from kit.experiments.theory.layout_time import collective_bytes, step_time
from kit.experiments.theory.models import MODELS
from kit.experiments.theory.pipeline_schedule import schedule
from kit.experiments.theory.plan import PlanError, plan
from kit.experiments.theory.prediction import predict

L70 = MODELS["llama3-70b"]
L405 = MODELS["llama3-405b"]


def _pipe(v: int, m: int, pp: int = 4) -> ParallelConfig:
    return ParallelConfig(tp=8, pp=pp, dp=2, micro_batches=m, schedule="interleaved_1f1b" if v > 1 else "1f1b",
                          virtual_stages=v)


@pytest.mark.parametrize("m", [4, 8, 16])
def test_bubble_is_the_measured_formula_and_sends_grow_v_times(m: int) -> None:
    c = cluster_spec(nodes=8)
    t1, t2 = (step_time(L70, _pipe(v, m), c, 4096) for v in (1, 2))
    for v, t in ((1, t1), (2, t2)):
        pipe = t.step_s - t.dp_exposed_s - t.optimizer_s  # (m + (p-1)/v) micro-batch times
        assert t.bubble_s / pipe == pytest.approx(predicted_bubble(4, m, v))
    assert t2.pp_p2p_s == pytest.approx(2 * t1.pp_p2p_s)  # every chunk boundary is a send: 2v per micro-batch
    assert collective_bytes(L70, _pipe(2, m), 4096)["pp"][0] == 2 * collective_bytes(L70, _pipe(1, m), 4096)["pp"][0]
    if m == 4:  # m = p: GPipe's 3/7 of the pipeline, interleaved 3/11; the bubble's time about halves
        assert (predicted_bubble(4, 4, 1), predicted_bubble(4, 4, 2)) == (3 / 7, 3 / 11)
        assert 0.5 < t2.bubble_s / t1.bubble_s < 0.55  # half, plus the extra sends in each slot


@pytest.mark.parametrize("p, v, m", [(2, 2, 4), (4, 2, 4), (4, 2, 8), (4, 4, 16), (8, 2, 16), (3, 3, 9)])
def test_in_flight_activations_are_the_schedules_peak(p: int, v: int, m: int) -> None:
    """Korthikanti et al.'s p (1 + (p-1)/(p v)) on the first rank, checked against the schedule the
    pipeline strategy runs: the most chunk forwards whose backward has not run, over v."""
    def peak(rank: int) -> float:
        held = most = 0
        for kind, _, _ in schedule("interleaved_1f1b", rank, p, m, v):
            held += 1 if kind == "F" else -1
            most = max(most, held)
        return most / v
    first, last = in_flight(ParallelConfig(pp=p, micro_batches=m, schedule="interleaved_1f1b", virtual_stages=v))
    assert first == pytest.approx(peak(0)) and last == pytest.approx(peak(p - 1))
    assert first == pytest.approx(min(m, p * (1 + (p - 1) / (p * v))))
    assert in_flight(ParallelConfig(pp=p, micro_batches=m, schedule="1f1b")) == (min(p, m), 1)


def test_planner_tries_v_only_where_megatron_allows_it() -> None:
    p = plan("llama3-70b", nodes=16, seq_len=4096, include_unfit=True)  # 80 layers; pp divides 128 GPUs
    inter = [x for x in p if x.config.virtual_stages > 1]
    assert inter and all(x.config.pp > 1 and x.config.pp * x.config.virtual_stages <= 80
                         and x.config.micro_batches % x.config.pp == 0 for x in inter)
    assert any(x.config.zero >= 2 for x in inter)   # FSDP beside a pipeline (torchtitan's way)
    deepspeed = plan("llama3-70b", nodes=16, seq_len=4096, include_unfit=True, framework="deepspeed", zero=1)
    assert [x for x in deepspeed if x.config.virtual_stages > 1]
    pairs = {(x.config.pp, x.config.virtual_stages) for x in inter}
    assert {(2, 2), (2, 4), (4, 2), (4, 4), (8, 2), (8, 4), (16, 2), (16, 4)} <= pairs
    assert not [pv for pv in pairs if pv[0] * pv[1] > 80]
    assert all(x.name() != y.name() for x, y in zip(p.layouts, p.layouts[1:]))  # v is part of the name
    # 126 layers (2 x 3^2 x 7) do not split evenly into pp x v chunks with pp a power of two: allowed, the
    # fullest GPU holding v chunks of ceil(126 / (pp v)) layers (Llama 3 405B ran pp=16 that way)
    uneven = [x for x in plan("llama3-405b", nodes=16, seq_len=4096, include_unfit=True) if x.config.virtual_stages > 1]
    assert uneven and all(stage_layers(L405, x.config) == x.config.virtual_stages
                          * math.ceil(126 / (x.config.pp * x.config.virtual_stages)) for x in uneven)
    with pytest.raises(PlanError, match="pp x virtual_stages = 128 chunks are more than the 80 layers"):
        plan("llama3-70b", nodes=8, seq_len=4096, pp=64, virtual_stages=2)
    with pytest.raises(PlanError, match="needs pipeline parallelism"):
        plan("llama3-70b", nodes=8, seq_len=4096, pp=1, virtual_stages=2)


def _same_degrees(p: Any, x: Any, v: int) -> Any:
    key = (x.config.tp, x.config.pp, x.config.dp, x.config.cp, x.config.ep, x.config.zero)
    return min((y for y in p if y.config.virtual_stages == v and (y.config.tp, y.config.pp, y.config.dp, y.config.cp, y.config.ep, y.config.zero) == key),
               key=lambda y: y.step_s)


def test_interleaving_is_chosen_when_the_bubble_is_big() -> None:
    """70B on 1024 GPUs, pp=8: 64 micro-batches of 8 stages leave a bubble worth halving, and the
    sends cost a fraction of what that saves."""
    p = plan("llama3-70b", nodes=128, seq_len=4096, pp=8)
    best, plain = p[0], _same_degrees(p, p[0], 1)
    assert best.config.virtual_stages == 2 and "v2" in best.name() and "v=2" in best.why
    saved = plain.time.bubble_s - best.time.bubble_s
    assert saved > best.time.pp_p2p_s - plain.time.pp_p2p_s > 0 and best.step_s < plain.step_s
    assert best.memory.activations_gib > plain.memory.activations_gib  # the price: more in flight
    assert p.interleaving.startswith("Interleaving chosen: v=2") and p.interleaving in p.describe()


def test_interleaving_is_not_chosen_when_sends_cost_more_than_the_bubble() -> None:
    """pp=4 across nodes with 1024 micro-batches: the bubble is already small; 4x the sends over
    InfiniBand cost more than the bubble interleaving saves."""
    p = plan("llama3-70b", nodes=4, seq_len=4096, pp=4, tp=8, micro_batch=1)
    best = p[0]
    inter = _same_degrees(p, best, 4)
    assert best.config.virtual_stages == 1 and "v=" not in best.why and dict(best.time.links)["pp"] == "InfiniBand"
    assert inter.time.pp_p2p_s - best.time.pp_p2p_s > best.time.bubble_s - inter.time.bubble_s > 0
    assert p.interleaving.startswith("Interleaving not chosen: v=") and "no faster" in p.interleaving


def test_interleaving_is_not_chosen_when_its_activations_force_recompute() -> None:
    p = plan("llama3-8b", nodes=1, seq_len=4096, pp=4, micro_batch=4, zero=0, tp=1)
    best = p[0]
    inter = _same_degrees(p, best, 2)
    assert best.config.virtual_stages == 1 and best.config.recompute == "none" and inter.config.recompute != "none"
    assert memory_per_gpu(MODELS["llama3-8b"], replace(inter.config, recompute="none"),
                          4096).total_gib > 80  # v=2 without recompute does not fit
    assert f"recompute={inter.config.recompute}" in p.interleaving and "not chosen" in p.interleaving


def test_interleaving_is_not_chosen_when_it_does_not_fit_at_all() -> None:
    p = plan("llama3-70b", nodes=8, seq_len=4096, pp=8, tp=2, micro_batch=8, zero=1, cp=1)
    best = p[0]
    assert best.config.virtual_stages == 1 and not [x for x in p if x.config.virtual_stages > 1 and x.config.dp == best.config.dp]
    v2 = replace(best.config, schedule="interleaved_1f1b", virtual_stages=2, recompute="full")
    need = memory_per_gpu(L70, v2, 4096).total_gib
    assert need > 80 >= best.memory_gib and f"would need {need:.1f} GiB" in p.interleaving


def test_plot_labels_show_v() -> None:
    import matplotlib
    matplotlib.use("Agg")
    from kit.plots import plan_layouts
    p = plan("llama3-70b", nodes=128, seq_len=4096, pp=8)
    labels = [t.get_text() for t in plan_layouts(p, top=3).axes[0].get_yticklabels()]
    assert "pp8 v2" in labels[0] and " v" in p.table(3).splitlines()[0]


def _pipeline_record(v: int, world: int = 4, m: int = 4) -> dict[str, Any]:
    med = lambda x: {"median": x}  # noqa: E731
    return {"schema": "kit.run/2", "label": "pipeline", "config": {
        "strategy": "pipeline", "workload": "mlp", "world_size": world, "batch_size": 32, "micro_batches": m,
        "schedule": "interleaved_1f1b" if v > 1 else "gpipe", "virtual_stages": v},
        "env": {}, "comm": {}, "memory": [{"params_mib": 4.0, "optimizer_mib": 8.0, "activations_mib": 16.0}],
        "spread": {"step_ms": med(36.0), "fwd_ms": med(10.0), "bwd_ms": med(20.0), "opt_ms": med(5.0),
                   "comm_exposed_ms": med(0.0)}}


@pytest.mark.parametrize("v", [1, 2, 4])
def test_prediction_reads_the_interleaved_config(v: int) -> None:
    pred = predict(_pipeline_record(v), ranks=[4], strategy="pipeline", link=(0.0, 1e12))
    pt, s, m = pred["points"][-1], 4, 4
    assert pred["pipeline"] == {"stages": s, "micro_batches": m, "virtual_stages": v,
                                "schedule": "interleaved_1f1b" if v > 1 else "gpipe"}
    busy = 30.0 / s
    assert pt["bubble_fraction"] == pytest.approx((s - 1) / (v * m + s - 1))
    assert pt["bubble_ms"] == pytest.approx(busy * (s - 1) / v / m)
    held = min(m, s + (s - 1) / v) if v > 1 else m  # GPipe holds all m
    assert pt["memory_mib"]["activations_mib"] == pytest.approx(16.0 / s * held / m)
    assert predict(_pipeline_record(v), ranks=[4], strategy="pipeline", virtual_stages=1,
                   schedule="1f1b")["points"][-1]["bubble_fraction"] == pytest.approx(3 / 7)  # given beats the record
    one = predict(_pipeline_record(v), ranks=[4], strategy="pipeline", virtual_stages=1, schedule="interleaved_1f1b")
    assert one["points"][-1]["memory_mib"]["activations_mib"] == pytest.approx(16.0 / s)  # v = 1 is 1F1B: min(s, m)
    with pytest.raises(ValueError, match="interleaved_1f1b"):
        predict(_pipeline_record(1), ranks=[4], strategy="pipeline", virtual_stages=2, schedule="1f1b")
