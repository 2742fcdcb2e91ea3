"""tp, sp, cp, ep (and mesh=) through the run loop: what the record carries, and what is refused.

The record of each run must carry, per collective kind and mesh dimension, the bytes counted at
the calls beside the formula's (equal: the formulas count every collective the strategy issues),
the check against one process, activations per layer beside their formula, and each dimension's
collectives in the timeline. Bad splits are refused by ExperimentConfig, before any rank starts.
"""
from __future__ import annotations

import pytest

from kit.experiments.config import ExperimentConfig, ExperimentConfigError
from kit.experiments.harness.local import run_each
from kit.experiments.records import merge

WALL_CLOCK_S = 600
TINY_RUN = dict(workload="gpt", steps=2, warmup_steps=1, batch_size=8)
TWO = {s: ExperimentConfig(strategy=s, **TINY_RUN) for s in ("tp", "sp", "cp", "ep")}
TWO["ep_drops"] = ExperimentConfig(strategy="ep", capacity_factor=0.5, top_k=1, **TINY_RUN)


@pytest.fixture(scope="module")
def records(run_once) -> dict[str, dict]:
    per = run_once(2, TWO)  # the same runs as test_parallel_memory's: run once per session
    return {name: merge(per[name], cfg) for name, cfg in TWO.items()}


def _kinds(pred: dict) -> set[str]:
    return {k for k in pred if "/" in k}


@pytest.mark.parametrize("name", list(TWO))
def test_record_bytes_measured_equal_predicted(records: dict, name: str) -> None:
    rep = records[name]["comm"]["report"]
    measured, predicted = rep["measured_per_step"], rep["predicted_per_step"]
    assert set(measured) == _kinds(predicted)
    for kind in measured:
        assert measured[kind]["calls"] == predicted[kind]["calls"], kind
        assert measured[kind]["payload_bytes"] == pytest.approx(predicted[kind]["payload_bytes"]), kind
    assert records[name]["summary"]["bytes_per_step"] == sum(v["payload_bytes"] for v in measured.values())
    timeline = {e["name"] for e in records[name]["timeline"] if e["kind"] == "comm"}
    assert timeline >= {k.replace("/", " ") for k in measured}  # each dimension's calls are in the timeline


@pytest.mark.parametrize("name", list(TWO))
def test_record_checks_against_one_process(records: dict, name: str) -> None:
    check = records[name]["comm"]["report"]["check_vs_one_process"]
    assert check["max_abs_diff"] < 1e-5, check


@pytest.mark.parametrize("name", ["tp", "sp", "cp"])
def test_record_activations_per_layer_beside_formula(records: dict, name: str) -> None:
    for mem in records[name]["memory"]:
        act = mem["activations_per_layer"]
        assert act["measured_mib"] == pytest.approx(act["predicted_mib"]), act


def test_sp_and_cp_hold_less_than_tp(records: dict) -> None:
    tp, sp, cp = (records[s]["memory"][0]["activations_per_layer"]["measured_mib"] for s in ("tp", "sp", "cp"))
    assert sp < tp  # the LayerNorm inputs and outputs are split too
    assert cp == pytest.approx(sp)  # both keep 1/t of one process's block


def test_ep_record_has_the_expert_load(records: dict) -> None:
    full = records["ep"]["comm"]["report"]["expert_load"]
    drops = records["ep_drops"]["comm"]["report"]["expert_load"]
    tokens = 2 * TINY_RUN["batch_size"] * 32  # two ranks' batches of 32-token sequences
    for layer in full:
        assert sum(layer["routed"]) == tokens * 2 and sum(layer["dropped"]) == 0  # top-2, no capacity
    assert all(sum(layer["routed"]) == tokens for layer in drops)  # top-1
    assert sum(sum(layer["dropped"]) for layer in drops) > 0  # capacity factor 0.5 must drop


@pytest.mark.parametrize("kw,fix", [
    (dict(strategy="tp"), "workload='gpt'"),
    (dict(strategy="tp", workload="gpt", model_size="tiny"), "model_size in ['small', 'base']"),
    (dict(strategy="tp", workload="gpt", world_size=3), "[1, 2, 4]"),
    (dict(strategy="tp", workload="gpt", world_size=2, mesh={"dp": 2, "tp": 2}), "world_size=4"),
    (dict(strategy="tp", workload="gpt", world_size=4, mesh={"tp": 2, "dp": 2}), "in that order"),
    (dict(strategy="zero1", world_size=4, mesh={"dp": 2, "tp": 2}), "set strategy='tp'"),
    (dict(strategy="ep", workload="gpt", world_size=3), "experts in [3, 6, 12]"),
    (dict(strategy="ep", workload="gpt", top_k=5), "top_k <= 4"),
    (dict(strategy="ep", workload="gpt", capacity_factor=0), "e.g. 1.25"),
    (dict(strategy="cp", workload="gpt", world_size=3), "world_size in"),
    (dict(strategy="sp", workload="gpt", precision="bf16"), "precision='fp32'"),
])
def test_bad_splits_refused_with_the_fix(kw: dict, fix: str) -> None:
    with pytest.raises(ExperimentConfigError, match=None) as e:
        ExperimentConfig(**kw)
    assert fix in str(e.value), str(e.value)


def test_the_config_refuses_splits_by_the_shapes_the_ranks_build() -> None:
    from kit.experiments.choices import GPT_HEADS_HIDDEN, GPT_LAYERS, GPT_SEQ
    from kit.experiments.measure.workloads import build_workload
    from kit.experiments.models import Block
    for size in GPT_HEADS_HIDDEN:
        model = build_workload("gpt", size, seed=0, n_samples=8).model  # the shapes; a small dataset
        blocks = [m for m in model if isinstance(m, Block)]
        assert {(b.heads, b.qkv.in_features) for b in blocks} == {GPT_HEADS_HIDDEN[size]}, size
        assert len(blocks) == GPT_LAYERS[size], size
        assert model[0].pos.shape[0] == GPT_SEQ, size  # the positions the embedding holds


def test_mesh_dp_x_tp_record_counts_each_dimension() -> None:
    cfg = ExperimentConfig(strategy="tp", world_size=4, mesh={"dp": 2, "tp": 2}, **TINY_RUN)
    per = run_each("kit.experiments.runner:run_rank", 4, [(cfg.to_dict(),)])
    rec = merge({r: per[r][0] for r in per}, cfg)
    measured = rec["comm"]["report"]["measured_per_step"]
    predicted = rec["comm"]["report"]["predicted_per_step"]
    assert set(measured) == {"dp/all_reduce", "tp/all_reduce"} == _kinds(predicted)
    for kind in measured:
        assert measured[kind]["payload_bytes"] == pytest.approx(predicted[kind]["payload_bytes"]), kind
    assert {"dp all_reduce", "tp all_reduce"} <= {e["name"] for e in rec["timeline"]}
    assert rec["comm"]["report"]["check_vs_one_process"]["diffs"]["weights"] < 1e-5


def test_bytes_plot_draws_measured_beside_predicted(records: dict) -> None:
    import matplotlib
    matplotlib.use("Agg")
    from kit.plots import PLOTS, bytes_by_collective
    assert PLOTS[next(k for k in PLOTS if "Bytes per collective" in k)] == "bytes_by_collective"
    rec = records["sp"]
    fig = bytes_by_collective(rec)
    measured = rec["comm"]["report"]["measured_per_step"]
    dims = {k.split("/")[0] for k in measured}
    assert len(fig.axes) == len(dims)  # one row of bars per mesh dimension
    got, formula = [], []
    for ax in fig.axes:  # each row: its measured bars, then the formula's
        half = len(ax.patches) // 2
        got += ax.patches[:half]
        formula += ax.patches[half:]
    kib = sorted(v["payload_bytes"] / 2**10 for v in measured.values())
    assert sorted(b.get_height() for b in got) == pytest.approx(kib)  # measured
    assert sorted(b.get_height() for b in formula) == pytest.approx(kib)  # the formula's
    empty = bytes_by_collective({"label": "ddp", "comm": {}})
    assert "no per-collective counts" in empty.axes[0].texts[0].get_text()
