"""predict(): the arithmetic on synthetic records (textbook limits), one real point on 2 gloo
ranks (structure, not timing), and smoke tests for the plot and the panel."""
from __future__ import annotations

import inspect
import json
import math
import subprocess
import sys
from typing import Any

import pytest

from kit.experiments.theory.links import LINKS, LinkPreset, link_allreduce_s
from kit.experiments.theory.predict_comm import (
    backward_overlap, collective_ms, fifo, link_from_fit, resolve_link, zero3_pass,
)
from kit.experiments.theory.prediction import FORMULAS, SCHEMA, predict

MIB = 2**20
PSI = 1_000_000  # parameters of the synthetic model (fp32: 4 MB of params, 4 MB of grads, 8 MB Adam)


def record(fwd: float = 10.0, bwd: float = 20.0, opt: float = 5.0, other: float = 1.0, exposed: float = 0.0,
           buckets: list[int] | None = None, strategy: str = "single", world_size: int = 1,
           timeline: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    """A kit.run/2-shaped record with exact phase times and memory (no measurement)."""
    step = fwd + bwd + opt + other + exposed
    med = lambda v: {"median": v, "q1": v, "q3": v, "iqr": 0.0, "min": v, "max": v, "n": 5}  # noqa: E731
    return {"schema": "kit.run/2", "run_id": "synthetic", "label": "synthetic mlp",
            "config": {"strategy": strategy, "workload": "mlp", "world_size": world_size, "batch_size": 32,
                       "grad_accum_steps": 1, "bucket_cap_mb": 25.0, "gradient_as_bucket_view": False,
                       "model_size": "small", "precision": "fp32"},
            "env": {"device_type": "cpu", "threads_per_rank": 1}, "steps": [{"step": 0, "rank": 0}],
            "comm": {"bytes_per_step": sum(buckets or []), "buckets": [{"index": i, "bytes": b}
                                                                       for i, b in enumerate(buckets or [])]},
            "memory": [{"rank": 0, "params_mib": 4 * PSI / MIB, "grads_mib": 4 * PSI / MIB,
                        "optimizer_mib": 8 * PSI / MIB, "activations_mib": 1.0}],
            "timeline": timeline or [],
            "spread": {"step_ms": med(step), "fwd_ms": med(fwd), "bwd_ms": med(bwd), "opt_ms": med(opt),
                       "comm_exposed_ms": med(exposed)}}


BANDWIDTH_ONLY = (0.0, 1.0)  # alpha 0, 1 GB/s: comm = bytes x 2(p-1)/p / 1e9 s


def test_one_rank_is_the_measured_step_without_comm() -> None:
    pt = predict(record(), ranks=[1])["points"][0]
    assert pt["step_ms"] == pytest.approx(36.0) and pt["comm_ms"] == 0 and pt["efficiency"] == pytest.approx(1)
    assert pt["predicted"] is True


def test_a_compressed_ddp_record_predicts_from_its_uncompressed_gradients() -> None:
    """A ddp run with compression records the compressed payload as its bytes; predicting plain ddp from it
    must start from the gradients themselves, as from the same run without compression."""
    plain = record(strategy="ddp", world_size=2, buckets=[4 * PSI])
    compressed = record(strategy="ddp", world_size=2, buckets=[4 * PSI])
    compressed["comm"].update(bytes_per_step=PSI, report={"uncompressed_bytes_per_step": 4 * PSI,
                                                          "payload_bytes_per_step": PSI, "compression_ratio": 4.0})
    got, want = (predict(r, ranks=[2, 4], link=BANDWIDTH_ONLY) for r in (compressed, plain))
    assert got["inputs"]["grad_bytes"] == 4 * PSI
    assert [p["comm_ms"] for p in got["points"]] == [p["comm_ms"] for p in want["points"]]


def test_one_bucket_cannot_overlap_so_all_comm_is_exposed() -> None:
    pred = predict(record(), ranks=[2], link=BANDWIDTH_ONLY, buckets=[4 * PSI])
    pt = pred["points"][-1]
    expected = 4 * PSI * 2 * (2 - 1) / 2 / 1e9 * 1e3  # ring all-reduce, ms
    assert pt["comm_ms"] == pytest.approx(expected)
    assert pt["comm_exposed_ms"] == pytest.approx(expected) and pt["comm_overlap_ms"] == pytest.approx(0)
    assert pt["step_ms"] == pytest.approx(36.0 + expected)


def test_zero_latency_infinite_link_hides_everything_and_many_buckets_overlap() -> None:
    fast = predict(record(), ranks=[1, 8], link=(0.0, 1e12), buckets=[PSI // 4] * 16)["points"][-1]
    assert fast["comm_exposed_ms"] == pytest.approx(0, abs=1e-3) and fast["step_ms"] == pytest.approx(36, abs=1e-3)
    # Perfect overlap: buckets become ready through backward; only what the link cannot finish
    # by the end of backward is exposed, here the last bucket alone (the link keeps up).
    pt = predict(record(), ranks=[2], link=BANDWIDTH_ONLY, buckets=[PSI // 4] * 16)["points"][-1]
    last = collective_ms("all_reduce", resolve_link(BANDWIDTH_ONLY), PSI // 4, 2)
    assert pt["comm_exposed_ms"] == pytest.approx(last)
    assert pt["comm_overlap_ms"] == pytest.approx(pt["comm_ms"] - last)


def test_a_link_ten_times_slower_makes_comm_ten_times_longer() -> None:
    a = predict(record(), ranks=[4], link=(0.0, 10.0), buckets=[4 * PSI])["points"][-1]
    b = predict(record(), ranks=[4], link=(0.0, 1.0), buckets=[4 * PSI])["points"][-1]
    assert b["comm_ms"] == pytest.approx(10 * a["comm_ms"])


def test_buckets_queue_on_the_link() -> None:
    assert fifo([0.0, 0.0, 10.0], [5.0, 5.0, 1.0]) == [(0.0, 5.0), (5.0, 10.0), (10.0, 11.0)]
    ov = backward_overlap([2.0, 8.0], [4.0, 4.0], 0.0, 8.0)  # second bucket waits for the end of backward
    assert ov["comm_overlap_ms"] == pytest.approx(4.0) and ov["comm_exposed_ms"] == pytest.approx(4.0)


def test_ring_costs_match_the_presets_formula() -> None:
    for name in LINKS:
        for p in (2, 8, 64):
            got = collective_ms("all_reduce", resolve_link(name), 13e6, p)
            assert got == pytest.approx(1e3 * link_allreduce_s(name, 13e6, p))
    chain = resolve_link([(0.0, 1.0), "10gbe"])  # an emulated link adds to the loopback
    assert collective_ms("all_reduce", chain, 1e6, 2) == pytest.approx(
        collective_ms("all_reduce", resolve_link((0.0, 1.0)), 1e6, 2) + 1e3 * link_allreduce_s("10gbe", 1e6, 2))
    rs = collective_ms("reduce_scatter", resolve_link(BANDWIDTH_ONLY), 4e6, 4)
    assert 2 * rs == pytest.approx(collective_ms("all_reduce", resolve_link(BANDWIDTH_ONLY), 4e6, 4))


def test_zero_memory_formulas_for_fp32_adam() -> None:
    n = 8
    pts = {s: predict(record(), ranks=[n], strategy=s)["points"][-1]["memory_mib"]
           for s in ("ddp", "zero1", "zero2", "zero3", "fsdp")}
    states = lambda m: m["params_mib"] + m["grads_mib"] + m["optimizer_mib"]  # noqa: E731
    assert states(pts["zero3"]) * MIB == pytest.approx(16 * PSI / n)   # 16 Psi / N
    assert states(pts["fsdp"]) == pytest.approx(states(pts["zero3"]))
    assert states(pts["zero2"]) * MIB == pytest.approx(4 * PSI + 12 * PSI / n)
    assert states(pts["zero1"]) * MIB == pytest.approx(8 * PSI + 8 * PSI / n)
    assert states(pts["ddp"]) * MIB == pytest.approx(20 * PSI)  # + DDP's bucket copy of the grads
    assert pts["zero3"]["activations_mib"] == pytest.approx(1.0)


def test_zero3_prefetches_one_chunk_and_queues_scatters_on_the_link() -> None:
    fwd = zero3_pass([10.0, 10.0], [5.0, 5.0], [0.0, 0.0])  # only the first gather is waited for
    assert fwd["pass_ms"] == pytest.approx(25.0) and fwd["comm_exposed_ms"] == pytest.approx(5.0)
    bwd = zero3_pass([10.0, 10.0], [5.0, 5.0], [3.0, 3.0])  # + the last chunk's reduce-scatter
    assert bwd["pass_ms"] == pytest.approx(28.0) and bwd["comm_exposed_ms"] == pytest.approx(8.0)
    assert bwd["comm_overlap_ms"] == pytest.approx(16.0 - 8.0)


def test_strong_scaling_splits_the_compute() -> None:
    pts = predict(record(), ranks=[1, 2, 4], link=(0.0, 1e12), batch="global")["points"]
    assert [p["fwd_ms"] + p["bwd_ms"] for p in pts] == pytest.approx([30.0, 15.0, 7.5])
    assert pts[0]["throughput_samples_s"] == pytest.approx(pts[2]["throughput_samples_s"] * pts[2]["step_ms"]
                                                            / pts[0]["step_ms"])


def test_zero3_moves_one_and_a_half_times_ddps_bytes() -> None:
    kw: dict[str, Any] = dict(ranks=[4], link=BANDWIDTH_ONLY, buckets=[PSI] * 4)
    ddp = predict(record(), strategy="ddp", **kw)["points"][-1]
    z3 = predict(record(), strategy="zero3", **kw)["points"][-1]
    assert z3["comm_ms"] == pytest.approx(1.5 * ddp["comm_ms"])


def test_pipeline_bubble_is_gpipes_formula() -> None:
    for s, m in ((4, 8), (2, 2), (8, 4)):
        pt = predict(record(), ranks=[s], strategy="pipeline", stages=s, micro_batches=m,
                     link=(0.0, 1e12))["points"][-1]
        assert pt["bubble_fraction"] == pytest.approx((s - 1) / (m + s - 1))
        busy = 30.0 / s
        assert pt["bubble_ms"] == pytest.approx(busy * (m + s - 1) / m - busy)
        assert pt["step_ms"] == pytest.approx(busy * (m + s - 1) / m + 5.0 / s + 1.0, abs=1e-3)


def test_compression_scales_the_gradient_bytes() -> None:
    kw: dict[str, Any] = dict(ranks=[4], link=BANDWIDTH_ONLY, buckets=[4 * PSI])
    full = predict(record(), **kw)["points"][-1]["comm_ms"]
    assert predict(record(), strategy="fp16_compress", **kw)["points"][-1]["comm_ms"] == pytest.approx(full / 2)
    assert predict(record(), compression=4.0, **kw)["points"][-1]["comm_ms"] == pytest.approx(full / 4)


def test_accelerator_rescale_is_labelled_and_uses_6n_flops() -> None:
    pred = predict(record(), ranks=[1, 1024], accelerator="h100", utilisation=0.5)
    pt = pred["points"][0]
    flops = 6 * PSI * 32  # 6 N per sample, batch 32
    assert pt["fwd_ms"] + pt["bwd_ms"] == pytest.approx(1e3 * flops / (989e12 * 0.5))
    assert pred["accelerator"]["measured_compute_replaced"] and pred["accelerator"]["peak_tflops"] == 989.0
    assert any("rescaled" in w for w in pred["weakest"])
    assert predict(record(), accelerator="t4")["accelerator"]["compute_precision"] == "fp16"
    with pytest.raises(ValueError, match="flops_per_sample"):
        predict({**record(), "config": {**record()["config"], "workload": "cnn"}}, accelerator="a100")


def test_record_is_json_labelled_and_keeps_formulas_and_inputs() -> None:
    pred = predict(record(buckets=[PSI] * 4, strategy="ddp", world_size=2), link="infiniband")
    json.dumps(pred, allow_nan=False)
    assert pred["schema"] == SCHEMA and pred["predicted"] is True and pred["formulas"] == FORMULAS
    assert pred["ranks"][0] == 1 and pred["ranks"][-1] == 1024
    assert all(p["predicted"] for p in pred["points"]) and pred["weakest"]
    assert pred["inputs"]["buckets_from"].startswith("the record's DDP buckets")
    assert pred["link"][0]["name"] == "infiniband" and pred["link"][0]["source"]
    for p in pred["points"]:
        assert all(math.isfinite(v) for v in (p["step_ms"], p["comm_exposed_ms"], p["efficiency"]))


def test_bucket_ready_times_come_from_the_timeline() -> None:
    tl = [{"rank": 0, "name": "backward", "start_ms": 100.0, "end_ms": 120.0},
          {"rank": 0, "name": "all_reduce #0", "start_ms": 105.0, "end_ms": 130.0},
          {"rank": 0, "name": "all_reduce #1", "start_ms": 120.0, "end_ms": 140.0}]
    pred = predict(record(buckets=[PSI, PSI], strategy="ddp", world_size=2, timeline=tl), ranks=[2])
    assert pred["inputs"]["ready_fraction"] == pytest.approx([0.25, 1.0])


def test_link_spellings_and_errors() -> None:
    fit = {"schema": "kit.collectives/1", "op": "all_reduce", "world_size": 2, "backend": "gloo",
           "fit": {"alpha_us": 200.0, "alpha_per_step_us": 100.0, "beta_gbps": 1.0}}
    lk = link_from_fit(fit)
    assert lk.hop_us == 100.0 and lk.gbps == pytest.approx(1.0)  # busbw = algbw at p = 2
    assert isinstance(resolve_link(LinkPreset(hop_us=1, gbps=2))[0], LinkPreset)
    for bad in ("warp-drive", (1.0, 0.0), [], 3):
        with pytest.raises(ValueError):
            resolve_link(bad)
    with pytest.raises(ValueError):
        predict(record(), strategy="tensor")


@pytest.mark.parametrize("kw, error, words", [
    # before: all three of strategy, batch and compression listed, whichever one was wrong
    (dict(batch="weak"), ValueError, r"^batch='weak': 'per_rank' \(weak scaling\) or 'global' \(strong\)$"),
    (dict(compression=0), ValueError, r"^compression=0: the gradient bytes are divided by it, so at least 1$"),
    (dict(strategy="zero4"), ValueError, r"^strategy='zero4': one of ddp, zero1, zero2, zero3, fsdp, pipeline"),
    # before: Python's "'int' object is not iterable", "unexpected keyword argument 'lnk'"
    (dict(ranks=8), TypeError, r"^ranks=8: give the rank counts as a list, e.g. ranks=\[1, 8\]"),
    (dict(lnk="infiniband"), TypeError, r"^predict\(\) has no keyword lnk= \(did you mean link=\?\)"),
    (dict(utilization=0.5), TypeError, r"no keyword utilization= \(did you mean utilisation=0.5"),
    # before: "ranks must be >= 1, got [0, 1, 8]", a list the caller never wrote
    (dict(ranks=[0, 8]), ValueError, r"^ranks=\[0, 8\]: every rank count must be at least 1"),
])
def test_a_wrong_argument_is_named_alone_with_what_to_write(kw: dict, error: type, words: str) -> None:
    with pytest.raises(error, match=words):
        predict(record(), **kw)
    # and "H100" is taken as plan() takes it, whatever its case
    assert predict(record(), accelerator="H100")["accelerator"]["name"] == "H100 SXM"


def test_predicts_signature_lists_its_keywords_and_takes_no_others() -> None:
    """help(predict) and `predict?` read the signature. Before: it ended in `**unknown`, keywords predict()
    refused every one of; the misspelt-keyword message stays as it was."""
    params = inspect.signature(predict).parameters
    assert not [p for p in params.values() if p.kind is inspect.Parameter.VAR_KEYWORD]
    assert list(params)[:3] == ["record", "ranks", "link"] and "host_load" in params
    with pytest.raises(TypeError, match=r"^predict\(\) has no keyword lnk= \(did you mean link=\?\); its keywords: "
                                        r"record, ranks, link, strategy, "):
        predict(record(), lnk="infiniband")


def test_a_rank_count_no_cluster_has_is_refused_with_the_range_and_what_to_ask() -> None:
    """ranks=[1, 3_000_000] is refused with the range and what to ask: no number labelled predicted for a
    cluster that no one has."""
    from kit.experiments.theory.cluster import MAX_RANKS
    from kit.widgets.planner import BOXES

    with pytest.raises(ValueError, match=r"^ranks=\[1, 3000000\]: 3,000,000 ranks is more than any cluster the kit "
                                         r"predicts: rank counts go from 1 to 65,536 \(4,096 nodes x 16 GPUs, the plan "
                                         r"panel's range.*Ask for counts up to 65,536, e.g. ranks=\[1, 8, 64, 1024"):
        predict(record(), ranks=[1, 3_000_000])
    assert predict(record(), ranks=iter([8, MAX_RANKS]))["ranks"] == [1, 8, 65_536]  # the bound itself is predicted
    # one bound: the plan panel's boxes (nodes x GPUs per node) end where predict's rank counts do
    assert BOXES["nodes"][1] * BOXES["gpus_per_node"][1] == MAX_RANKS


def test_a_record_without_a_measured_step_is_refused() -> None:
    # predict({}) drew a scaling curve of zeros, labelled predicted; predict(config) died in .get
    from kit.experiments import ExperimentConfig

    with pytest.raises(ValueError, match="no measured step time"):
        predict({})
    with pytest.raises(TypeError, match="the record run"):
        predict(ExperimentConfig())
    assert predict(record())["points"][0]["step_ms"] > 0  # a real record still predicts


def test_gpt_token_count_matches_the_workload() -> None:
    """The 6N rule's tokens per GPT sample are the tokens a GPT workload's sample holds."""
    from kit.experiments.measure.workloads import TeacherDataset
    from kit.experiments.theory.predict_inputs import TOKENS_PER_SAMPLE
    assert TeacherDataset("gpt", 4, seed=0).x.shape[1] == TOKENS_PER_SAMPLE["gpt"]


def test_prediction_modules_stay_torch_free() -> None:
    code = ("import sys, kit.experiments as e; e.predict; import kit.experiments.benchmarks.predict_check, "
            "kit.experiments.theory.predict_notes; assert 'torch' not in sys.modules, 'torch imported'")
    subprocess.run([sys.executable, "-c", code], check=True)


def test_scaling_prediction_and_residuals_plot_draw() -> None:
    from kit.plots import residuals_plot, scaling_prediction
    rec = record(buckets=[PSI] * 4, strategy="ddp", world_size=2)
    fig = scaling_prediction([predict(rec, link="10gbe"), predict(rec, link="10gbe", strategy="zero3")],
                             measured=[rec, {**rec, "emulated": True}])
    assert len(fig.axes) == 2 and "PREDICTED" in fig._suptitle.get_text()
    rows = [{"ranks": 2, "link": "loopback", "oversubscribed": False, "measured_step_ms": 10.0,
             "predicted_step_ms": 11.0, "step_err_pct": 10.0, "exposed_err_pct": None, "step_iqr_ms": 1.0}]
    assert len(residuals_plot(rows).axes) == 2


def test_scaling_prediction_names_its_right_axis_and_keys_stay_readable_over_its_lines() -> None:
    """The new-user trial: the right axis read "per step, per rank (ms)" (no noun), and the dotted "comm stops
    hiding" line ran through the legends' text (frameless keys)."""
    from kit.plots import scaling_prediction
    rec = record(buckets=[PSI] * 4, strategy="ddp", world_size=2)
    ax_thr, ax_ms = scaling_prediction(predict(rec, link="10gbe"), measured=[rec]).axes
    assert ax_ms.get_ylabel() == "time per step, per rank (ms)"
    for ax in (ax_thr, ax_ms):
        legend = ax.get_legend()
        assert legend.get_frame_on() and legend.get_frame().get_alpha() == 1.0
        assert legend.get_frame().get_facecolor()[3] == 1.0


def test_prediction_panel_redraws_on_every_choice() -> None:
    pytest.importorskip("ipywidgets")
    from kit.widgets import PredictionPanel
    panel = PredictionPanel([record(buckets=[PSI] * 4, strategy="ddp", world_size=2)])
    first = panel.image.value
    assert first and "predicted at 1024 ranks" in panel.message.value
    for ctl, value in ((panel.link, "10gbe"), (panel.strategy, "zero3"), (panel.accelerator, "t4"),
                       (panel.link, "loopback"), (panel.max_log2, 3)):
        ctl.value = value
        assert panel.prediction is not None and "predicted at" in panel.message.value
    assert panel.prediction["points"][-1]["ranks"] == 8 and panel.image.value != first
    with pytest.raises(ValueError, match="at least one kit.run record"):
        PredictionPanel([])


def test_prediction_panel_says_a_tiny_models_memory_in_digits_it_has() -> None:
    """The tiny MLP (20k parameters) is predicted at 0.39 MiB per rank: the panel said "memory 0 MiB per rank"."""
    pytest.importorskip("ipywidgets")
    from kit.widgets import PredictionPanel
    psi = 20_000
    rec = record(buckets=[4 * psi], strategy="ddp", world_size=2)
    rec["memory"] = [{"rank": 0, "params_mib": 4 * psi / MIB, "grads_mib": 4 * psi / MIB,
                      "optimizer_mib": 8 * psi / MIB, "activations_mib": 0.01}]
    panel = PredictionPanel([rec])
    mib = panel.prediction["points"][-1]["memory_mib"]["total_mib"]
    assert 0.1 < mib < 1 and f"memory {mib:.2g} MiB per rank" in panel.message.value, panel.message.value
    big = PredictionPanel([record(buckets=[PSI] * 4, strategy="ddp", world_size=2)])
    mib = big.prediction["points"][-1]["memory_mib"]["total_mib"]
    assert mib > 10 and f"memory {mib:,.0f} MiB per rank" in big.message.value, big.message.value
    psi = 100_000_000  # over a thousand MiB: thousands separated, as the memory plot's bar totals (mib_text)
    rec["memory"] = [{"rank": 0, "params_mib": 4 * psi / MIB, "grads_mib": 4 * psi / MIB,
                      "optimizer_mib": 8 * psi / MIB, "activations_mib": 0.01}]
    huge = PredictionPanel([rec])
    mib = huge.prediction["points"][-1]["memory_mib"]["total_mib"]
    assert mib > 1000 and f"memory {mib:,.0f} MiB per rank" in huge.message.value, huge.message.value


def test_prediction_panel_never_says_memory_in_scientific_notation() -> None:
    """A model of a few parameters is predicted at under 1e-4 MiB per rank: two significant digits read
    "memory 8.8e-05 MiB per rank"; now a floor, "<0.01"."""
    pytest.importorskip("ipywidgets")
    from kit.widgets import PredictionPanel
    psi = 3
    rec = record(buckets=[4 * psi], strategy="ddp", world_size=2)
    rec["memory"] = [{"rank": 0, "params_mib": 4 * psi / MIB, "grads_mib": 4 * psi / MIB,
                      "optimizer_mib": 8 * psi / MIB, "activations_mib": 32 / MIB}]
    panel = PredictionPanel([rec])
    assert panel.prediction["points"][-1]["memory_mib"]["total_mib"] < 1e-4
    assert "memory <0.01 MiB per rank" in panel.message.value and "e-0" not in panel.message.value, panel.message.value


def test_prediction_panel_takes_one_record_as_run_returns_it() -> None:
    """`rec = run(cfg); prediction_panel(rec)`: before, AttributeError "'str' object has no attribute 'get'"
    (it iterated the record's keys); None said "'NoneType' object is not iterable"."""
    pytest.importorskip("ipywidgets")
    from kit.widgets import PredictionPanel
    rec = record(buckets=[PSI] * 4, strategy="ddp", world_size=2)
    assert PredictionPanel(rec).records == [rec]
    with pytest.raises(TypeError, match=r"prediction_panel takes the records kit.experiments.run returns "
                                        r"\(a list, or one record\), not NoneType: rec = kit.experiments.run\(config\)"):
        PredictionPanel(None)  # type: ignore[arg-type]


def test_lab_bench_plot_menu_predicts_the_last_run() -> None:
    from kit.plots import PLOTS
    from kit.widgets.render import draw_plot
    assert "scaling_prediction" in PLOTS.values()
    rec = record(buckets=[PSI] * 4, strategy="ddp", world_size=2)
    rec["config"]["interconnect"] = "10gbe"
    fig = draw_plot("scaling_prediction", [record(), rec])
    assert "10gbe" in fig._suptitle.get_text() and "PREDICTED" in fig._suptitle.get_text()


WALL_CLOCK_S = 400


def test_validation_point_on_two_gloo_ranks() -> None:
    """The protocol end to end on 1 and 2 real ranks: structure, not timing (CI machines vary)."""
    from kit.experiments.benchmarks.predict_check import measure, residual_table, residuals
    meas = measure(world_sizes=(2,), steps=3, warmup=1, fit_iters=2, log=lambda _s: None)
    for mode in ("same_p", "ddp2", "single"):
        rows = residuals(meas, base_from=mode)
        assert {r["ranks"] for r in rows} == {1, 2}
        for r in rows:
            assert r["measured_step_ms"] > 0 and r["predicted_step_ms"] > 0 and math.isfinite(r["step_err_pct"])
            assert r["predicted_exposed_ms"] >= 0
        assert "loopback+10gbe" in residual_table(rows)
    same = residuals(meas)
    assert [r["link"] for r in same] == ["none (single)", "loopback", "loopback+10gbe"]
    json.dumps(meas, default=str)
