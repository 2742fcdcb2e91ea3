"""The planner's time model fed this machine's numbers (theory/local_time.py): pure arithmetic, no ranks."""
from __future__ import annotations

import math
from dataclasses import replace

import pytest

from kit.experiments.choices import GPT_HEADS_HIDDEN, GPT_LAYERS, GPT_SEQ
from kit.experiments.theory.bubble import predicted_bubble
from kit.experiments.theory.layout_time import step_time
from kit.experiments.benchmarks.local_check import blocking_calls
from kit.experiments.theory.links import alpha_beta_allreduce_s
from kit.experiments.theory.local_time import (
    FSDP_EXTRA_UNITS, LOCAL_STRATEGIES, PROBE_BYTES, LocalMachine, kit_gpt_spec, kit_layout, local_cluster,
    modelled_bubble, predict_local,
)
from kit.experiments.theory.overlap import exposed_s
from kit.experiments.theory.models import ModelSpec
from kit.experiments.theory.layout_memory import ParallelConfig

CPU = LocalMachine(matmul_gflops=25.0, op_us=20.0, alpha_us=90.0, gbps=1.0, mem_gbps=4.0, source="test")


def test_gpt_spec_matches_the_workload_module():
    torch = pytest.importorskip("torch")  # noqa: F841
    from kit.experiments.measure.workloads import build_workload
    from kit.experiments.models import VOCAB
    model = build_workload("gpt", "small").model
    params = sum(p.numel() for p in model.parameters())
    spec = kit_gpt_spec("small")
    assert spec.vocab == VOCAB and spec.layers == GPT_LAYERS["small"] and spec.hidden == GPT_HEADS_HIDDEN["small"][1]
    assert spec.params() == params


@pytest.mark.parametrize("strategy", LOCAL_STRATEGIES)
def test_every_strategy_is_predicted_and_labelled(strategy):
    p = predict_local(CPU, strategy, 2)
    assert p["predicted"] is True and p["step_ms"] > 0
    assert p["step_ms"] >= p["compute_ms"] - 1e-9


def test_a_faster_link_or_cpu_shortens_the_step():
    slow = predict_local(CPU, "tp", 2)["step_ms"]
    assert predict_local(LocalMachine(25.0, 20.0, 9.0, 10.0, 4.0), "tp", 2)["step_ms"] < slow
    assert predict_local(LocalMachine(50.0, 20.0, 90.0, 1.0, 4.0), "tp", 2)["step_ms"] < slow


def test_it_is_the_planners_model_not_a_second_one():
    c = local_cluster(CPU, 4, "tp")
    direct = step_time(kit_gpt_spec(), kit_layout("tp", 4), c, GPT_SEQ, utilisation=1.0)
    assert predict_local(CPU, "tp", 4)["step_ms"] == pytest.approx(direct.step_s * 1e3)
    # fsdp: step_time's one unit per layer, plus the fixed cost of the kit's two more units' 3 calls each
    direct = step_time(kit_gpt_spec(), kit_layout("fsdp", 4), local_cluster(CPU, 4, "fsdp"), GPT_SEQ,
                       utilisation=1.0)
    extra_ms = FSDP_EXTRA_UNITS * 3 * (c.intra.base_us + 3 * c.intra.hop_us) / 1e3
    assert predict_local(CPU, "fsdp", 4)["step_ms"] == pytest.approx(direct.step_s * 1e3 + extra_ms)


def test_each_blocking_collective_costs_the_measured_call():
    """tp's 12 all-reduces (4 per layer, 3 layers) each pay the blocking call measured after compute, less
    the alpha-beta the model already charges for the probe's 4 KiB; the pipeline pays the hand-off instead,
    cp the ring exchange."""
    woken = replace(CPU, call_us=8000.0, handoff_us=400.0)
    probe_us = 1e6 * alpha_beta_allreduce_s(PROBE_BYTES, 2, CPU.alpha_us, CPU.gbps)
    grown = predict_local(woken, "tp", 2)["tp_ms"] - predict_local(CPU, "tp", 2)["tp_ms"]
    assert grown == pytest.approx(12 * (8000.0 - probe_us) / 1e3)
    assert predict_local(woken, "tp", 2)["per_call_ms"] == pytest.approx((8000.0 - probe_us) / 1e3)
    pipe = predict_local(woken, "pipeline", 2)
    assert pipe["per_call_ms"] == pytest.approx((400.0 - CPU.alpha_us - PROBE_BYTES / (CPU.gbps * 1e3)) / 1e3)
    assert predict_local(replace(woken, call_us=1e5), "pipeline", 2)["step_ms"] == pytest.approx(pipe["step_ms"])
    # cp's hops wait for one neighbour: the ring exchange measured after compute, not the all-reduce
    ring = replace(woken, exchange_us=3000.0)
    assert predict_local(ring, "cp", 2)["per_call_ms"] == pytest.approx(
        (3000.0 - CPU.alpha_us - PROBE_BYTES / (CPU.gbps * 1e3)) / 1e3)
    assert predict_local(replace(ring, call_us=1e5), "cp", 2)["step_ms"] == pytest.approx(
        predict_local(ring, "cp", 2)["step_ms"])


@pytest.mark.parametrize("strategy", ["ddp", "fsdp", "cp"])
def test_on_cpu_ranks_no_collective_hides_behind_compute(strategy):
    """A gloo call blocks the rank's thread: every collective is exposed; blocking=False is the GPU
    planner's overlap, which hides some of them."""
    woken = replace(CPU, call_us=8000.0)
    blocked = predict_local(woken, strategy, 2)
    assert blocked["comm_exposed_ms"] > 0 and blocked["step_ms"] == pytest.approx(
        blocked["compute_ms"] + blocked["comm_exposed_ms"] + blocked["opt_ms"])
    overlapped = predict_local(woken, strategy, 2, blocking=False)
    assert overlapped["comm_exposed_ms"] < blocked["comm_exposed_ms"]
    assert exposed_s(0.010, 0.003, math.inf) == pytest.approx(0.003)   # the work waits for the whole call


def test_blocking_calls_split_each_collective_into_waiting_and_the_rest():
    """Two ranks, two all-reduces on one clock: rank 1 arrives 3 ms late at the first, rank 0 2 ms late at
    the second; sends are left out (they wait for no one)."""
    ev = lambda r, name, s, e: {"rank": r, "name": name, "kind": "comm", "start_ms": s, "end_ms": e}  # noqa: E731
    rec = {"timeline": [ev(0, "tp all_reduce", 10, 15), ev(1, "tp all_reduce", 13, 15),
                        ev(0, "tp all_reduce", 32, 34), ev(1, "tp all_reduce", 30, 34),
                        ev(0, "cp send", 1, 9), {"rank": 0, "name": "forward", "kind": "compute",
                                                 "start_ms": 0, "end_ms": 40}]}
    got = blocking_calls(rec)
    assert got == {"calls": 2, "wait_ms": pytest.approx((3 + 2) / 2),
                   "after_arrival_ms": pytest.approx((2 + 2 + 2 + 2) / 2)}


def test_layouts_follow_the_kit_runs():
    assert kit_layout("ddp", 4) == ParallelConfig(dp=4, micro_batch=32, precision="fp32", recompute="none", sp=False)
    assert kit_layout("pipeline", 2, 32, 8).micro_batch == 4
    with pytest.raises(ValueError, match="micro_batches"):
        kit_layout("pipeline", 2, 32, 5)
    with pytest.raises(ValueError, match="ep"):
        kit_layout("ep", 2)


def test_bad_measurements_are_refused():
    with pytest.raises(ValueError, match="gbps"):
        LocalMachine(25.0, 0.0, 1.0, 0.0, 4.0)
    with pytest.raises(ValueError, match="matmul_gflops"):
        LocalMachine(math.nan, 0.0, 1.0, 1.0, 4.0)


@pytest.mark.parametrize("m", [1, 2, 4, 8, 16])
def test_free_messages_and_equal_stages_give_the_formula(m):
    assert modelled_bubble([10.0, 10.0], m, 0.0) == pytest.approx(predicted_bubble(2, m))
    assert modelled_bubble([10.0] * 4, m, 0.0, virtual=2) == pytest.approx(predicted_bubble(4, m, 2))


def test_message_cost_keeps_the_bubble_up_as_micro_batches_shrink():
    # a fixed batch: each micro-batch's compute is 1/m of the whole, each hand-off costs the same
    curve = [modelled_bubble([40.0 / m, 40.0 / m], m, 3.0) for m in (1, 4, 16)]
    assert curve[0] > predicted_bubble(2, 1) and curve[2] > 3 * predicted_bubble(2, 16)


def test_bubble_agrees_with_step_time_pipeline_term():
    spec = ModelSpec("even", 4, 256, 4, 4, 1024, 256, seq_len=64, gated_mlp=False)
    c = local_cluster(CPU, 2)
    pc = ParallelConfig(pp=2, micro_batch=4, micro_batches=8, precision="fp32", recompute="none", sp=False)
    t = step_time(spec, pc, c, 64, utilisation=1.0)
    per_micro = t.compute_s / 8
    send = t.pp_p2p_s / 8 / 2
    idle = modelled_bubble([per_micro, per_micro], 8, send)
    pipe = t.step_s - t.optimizer_s - (t.dp_exposed_s if t.dp_exposed_s else 0.0)
    assert idle == pytest.approx(1 - t.compute_s / pipe, rel=1e-6)


def test_bubble_model_plot_draws_three_labelled_series():
    pytest.importorskip("matplotlib")
    from kit.plots import bubble_model
    rows = [{"micro_batches": m, "formula": predicted_bubble(2, m), "predicted": 0.6, "measured": 0.62,
             "measured_spread": (0.55, 0.7), "predicted_fitted_messages": 0.3,
             "predicted_schedule_messages": 0.61} for m in (1, 2, 4)]
    fig = bubble_model(rows)
    labels = [t.get_text() for t in fig.axes[0].get_legend().get_texts()]
    assert any("formula" in s for s in labels) and any("measured" in s for s in labels)
    assert sum("predicted" in s for s in labels) == 4


def test_planner_shortcuts_leave_every_result_unchanged():
    """plan() prices the smallest unfit layout lazily and caches gemm_efficiency and span: every layout it
    returns, and the smallest, must equal what pricing that layout directly gives."""
    from kit.experiments import plan
    from kit.experiments.theory.gemm_efficiency import gemm_efficiency
    from kit.experiments.theory.layout_memory import memory_per_gpu
    from kit.experiments.theory.plan import layout_of
    p = plan("llama3-70b", nodes=8, gpus_per_node=8, accelerator="h100", seq_len=4096)
    assert len(p) > 60
    for lay in list(p)[:: max(1, len(p) // 60)]:
        direct = layout_of(p.model, p.cluster, lay.config, 4096)
        assert direct.time == lay.time and direct.memory == lay.memory
    tiny = plan("llama3-70b", nodes=1, gpus_per_node=2, accelerator="h100", seq_len=4096, pp=1)
    assert len(tiny) == 0 and tiny.smallest is not None
    s = tiny.smallest
    assert s.time == layout_of(tiny.model, tiny.cluster, s.config, 4096).time
    assert s.memory == memory_per_gpu(tiny.model, s.config, 4096)
    m = p.model
    assert gemm_efficiency(m, 2, 4096.0) == gemm_efficiency.__wrapped__(m, 2, 4096.0)
    # the per-shape caches behind memory and time: each cached value is what computing it afresh gives
    from dataclasses import replace
    from kit.experiments.theory import layout_memory, layout_time
    for lay in list(p)[:: max(1, len(p) // 20)]:
        c, key = lay.config, (m, lay.config.tp, lay.config.pp, lay.config.ep, lay.config.virtual_stages)
        assert layout_memory._stage_params(*key, "last") == layout_memory._stage_params.__wrapped__(*key, "last")
        args = (m, 4096, c.cp, c.micro_batch, c.tp, c.sp, c.precision, c.recompute)
        assert layout_memory._activation_bytes(*args) == layout_memory._activation_bytes.__wrapped__(*args)
        args = (*key, c.dp * c.cp, c.zero, c.precision, "only")
        assert layout_memory._state_bytes(*args) == layout_memory._state_bytes.__wrapped__(*args)
        args = (m, 4096, 1e15, 3e12, c.tp, c.pp, c.cp, c.micro_batch, c.virtual_stages, c.recompute, c.sp, c.precision)
        assert layout_time._compute_of(*args) == layout_time._compute_of.__wrapped__(*args)
    # the spec's hash covers fewer fields than equality: equal specs hash alike, unequal ones stay unequal
    assert hash(replace(m)) == hash(m) and replace(m, kv_heads=m.heads) != m


def test_mlp_pipeline_bubble_is_the_formula_with_free_ops_and_rises_above_it_with_their_cost():
    """Lesson 05's predicted curve: with equal stages, no fixed cost per op and free hand-offs the model is
    (p-1)/(m+p-1); each op's fixed cost and each hand-off lift it, more as m grows (more, smaller slots)."""
    from kit.experiments.theory.bubble import split_min_max
    from kit.experiments.theory.local_time import mlp_pipeline_bubble
    equal = [[(64, 64)]] * 4
    for m in (1, 2, 4, 8, 16):
        assert mlp_pipeline_bubble(equal, 64, m, 10.0, 0.0, 0.0) == pytest.approx(predicted_bubble(2, m))
    mlp = [[(256, 1024)], [(1024, 1024)], [(1024, 1024)], [(1024, 1024)], [(1024, 10)]]
    costly = [mlp_pipeline_bubble(mlp, 64, m, 30.0, 120.0, 0.5) for m in (1, 2, 4, 8, 16)]
    gaps = [c - predicted_bubble(2, m) for c, m in zip(costly, (1, 2, 4, 8, 16))]
    assert all(g > 0 for g in gaps) and gaps == sorted(gaps), gaps
    assert split_min_max([1.0, 1.0, 1.0, 1.0, 4.0], 2) == [[0, 1, 2, 3], [4]]
    with pytest.raises(ValueError, match="cannot split 2 blocks into 3 stages"):
        split_min_max([1.0, 1.0], 3)


def test_bubble_model_draws_into_a_panel_of_the_callers_figure():
    pytest.importorskip("matplotlib")
    from matplotlib.figure import Figure

    from kit.plots import bubble_model
    fig = Figure()
    ax1, _ = fig.subplots(1, 2)
    rows = [{"micro_batches": m, "formula": predicted_bubble(2, m), "predicted": 0.4, "measured": 0.6}
            for m in (1, 2, 4)]
    assert bubble_model(rows, ax=ax1, predicted_label="model (predicted)", measured_label="gpipe measured") is fig
    labels = [t.get_text() for t in ax1.get_legend().get_texts()]
    assert "model (predicted)" in labels and "gpipe measured" in labels


def test_local_prediction_plot_labels_measured_and_predicted_and_check_local_refuses_other_strategies():
    pytest.importorskip("matplotlib")
    from kit.experiments import check_local
    from kit.plots import local_prediction
    rows = [{"strategy": s, "ranks": 4, "measured_step_ms": 300.0, "measured_spread_ms": (250.0, 400.0),
             "predicted_step_ms": 200.0, "predicted_spread_ms": (180.0, 220.0), "repeats": 3} for s in ("ddp", "tp")]
    fig = local_prediction(rows)
    labels = [t.get_text() for t in fig.axes[0].get_legend().get_texts()]
    assert len(labels) == 2 and labels[0].startswith("measured") and labels[1].startswith("predicted")
    assert [t.get_text() for t in fig.axes[0].get_xticklabels()] == ["ddp, 4 ranks", "tp, 4 ranks"]
    with pytest.raises(ValueError, match="the local model predicts ddp, fsdp, tp, pipeline, cp"):
        check_local(None, ("zero_bubble",))
