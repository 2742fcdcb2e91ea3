"""Memory per rank by kind for tp, sp, cp and ep: measured on the ranks beside
theory/parallel_memory.py's formulas, how those formulas move with the world size, and the
memory plot (the lab bench's "Memory per rank") drawing these runs.

Measured on this machine (2 gloo ranks, gpt small, batch 8): parameters, gradients and Adam's
state equal the formula to the byte, and so do the whole forward's activations (measured /
predicted = 1.000000 for every strategy and rank; ep's from the probe step's routing counts).
The tolerance below (1e-9 relative) only absorbs float rounding of MiB.
"""
from __future__ import annotations

import pytest

from kit.experiments.config import ExperimentConfig
from kit.experiments.records import merge
from kit.experiments.theory.parallel_memory import (
    adam_bytes, ep_routing_expected, gpt_params_per_rank, memory_per_rank, model_activation_bytes,
)

TINY_RUN = dict(workload="gpt", steps=2, warmup_steps=1, batch_size=8)
RUNS = {s: ExperimentConfig(strategy=s, **TINY_RUN) for s in ("tp", "sp", "cp", "ep")}
RUNS["ep_drops"] = ExperimentConfig(strategy="ep", capacity_factor=0.5, top_k=1, **TINY_RUN)
KINDS = ("params_mib", "grads_mib", "optimizer_mib", "activations_mib")
H, HEADS, L, V, S, B = 128, 4, 3, 256, 32, 8  # gpt "small" (choices.WORKLOAD_SIZES) and the batch


@pytest.fixture(scope="module")
def records(run_once) -> dict[str, dict]:
    per = run_once(2, RUNS)  # the same runs as test_parallel_run_records's: run once per session
    return {name: merge(per[name], cfg) for name, cfg in RUNS.items()}


# -- on the ranks -------------------------------------------------------------------------------
@pytest.mark.parametrize("name", list(RUNS))
def test_memory_by_kind_equals_the_formula(records: dict, name: str) -> None:
    rows = records[name]["memory"]
    assert len(rows) == 2
    for mem in rows:
        by_kind = mem["by_kind"]
        for kind in ("params_mib", "grads_mib", "optimizer_mib"):  # tensors on the rank: to the byte
            assert by_kind[kind]["measured_mib"] == by_kind[kind]["predicted_mib"], (name, kind, by_kind[kind])
            assert by_kind[kind]["formula"]
        act = by_kind["activations_mib"]
        assert act["measured_mib"] == pytest.approx(act["predicted_mib"], rel=1e-9), (name, act)
        assert mem["predicted"] == {k: by_kind[k]["predicted_mib"] for k in KINDS}  # what the plot draws


def test_the_formula_is_what_the_theory_says_for_the_run(records: dict) -> None:
    """Predicted params/optimizer from the dimensions alone: the record uses the same functions."""
    for name, t in (("tp", 2), ("sp", 2), ("cp", 2)):
        want = memory_per_rank(name, B, S, H, HEADS, L, V, t)
        mem = records[name]["memory"][0]
        assert mem["predicted"]["params_mib"] == want["params_mib"]
        assert mem["predicted"]["optimizer_mib"] == want["optimizer_mib"]
        assert mem["predicted"]["activations_mib"] == want["activations_mib"]
    tp, cp = (records[s]["memory"][0]["params_mib"] for s in ("tp", "cp"))
    assert tp < cp  # tensor parallel holds half of each block's matrices, context parallel all


def test_ep_activations_from_routing_and_balanced(records: dict) -> None:
    tokens = B * S
    for name, k, cap in (("ep", 2, None), ("ep_drops", 1, 32)):
        for mem in records[name]["memory"]:
            ep = mem["ep_activations"]
            assert ep["tokens"] == tokens and ep["capacity"] == cap  # ceil(0.5 x 256 x 1 / 4) = 32
            assert len(ep["per_layer_routing"]) == L
            for layer in ep["per_layer_routing"]:
                if cap is None:
                    assert layer["kept"] == tokens * k  # nothing dropped without a capacity
                else:
                    assert layer["kept"] <= 4 * cap and layer["received"] <= 4 * cap  # E experts x C
            assert ep["predicted_from_routing_mib"] == pytest.approx(ep["measured_mib"], rel=1e-9)
            assert ep["measured_over_balanced"] == pytest.approx(ep["measured_mib"] / ep["predicted_balanced_mib"])
            layer = mem["activations_per_layer"]  # the first MoE block alone, beside its routing's formula
            assert layer["measured_mib"] == pytest.approx(layer["predicted_mib"], rel=1e-9), layer
            assert "MoE" in layer["formula"]
    received = [sum(l["received"] for l in m["ep_activations"]["per_layer_routing"]) for m in records["ep"]["memory"]]
    assert sum(received) == 2 * L * tokens * 2  # every kept row lands on some rank's expert


# -- the plot and the bench ---------------------------------------------------------------------
def test_memory_plot_draws_these_runs_beside_the_formula(records: dict) -> None:
    import matplotlib
    matplotlib.use("Agg")
    from kit.plots import memory_breakdown
    from kit.widgets.render import draw_plot
    recs = [records[s] for s in ("tp", "sp", "cp", "ep")]
    fig = memory_breakdown(recs)
    ax = fig.axes[0]
    assert "Memory per rank, measured vs formula" in fig.get_suptitle()
    assert ax.get_ylabel() == "memory per rank (MiB)"
    legend = [t.get_text() for t in ax.get_legend().get_texts()]
    assert {"parameters", "gradients", "optimizer state", "activations", "predicted (formula)"} <= set(legend)
    rows = [m for r in recs for m in sorted(r["memory"], key=lambda m: m["rank"])]
    bars, n = ax.patches, len(rows)
    for i, kind in enumerate(KINDS):  # per kind: the measured bars, then the predicted (hatched) ones
        measured, predicted = bars[2 * i * n:2 * i * n + n], bars[2 * i * n + n:2 * (i + 1) * n]
        assert [b.get_height() for b in measured] == pytest.approx([m[kind] for m in rows])
        assert [b.get_height() for b in predicted] == pytest.approx([m["predicted"][kind] for m in rows])
        assert all(b.get_hatch() for b in predicted)
    bench = draw_plot("memory_breakdown", recs)  # what the lab bench shows for "Memory per rank"
    assert len(bench.axes[0].patches) == 2 * len(KINDS) * n


# -- the formulas, without ranks ----------------------------------------------------------------
def test_params_formula_counts_the_model() -> None:
    """At t=1 every strategy's count is the single-process model's (torch counts it here)."""
    from kit.experiments.measure.workloads import build_workload
    from kit.experiments.parallel.expert import MoE
    model = build_workload("gpt", "small").model
    one = sum(p.numel() for p in model.parameters())
    tensors = len(list(model.parameters()))
    for s in ("tp", "sp", "cp"):
        assert (gpt_params_per_rank(s, H, L, V, S, 1)["numel"], gpt_params_per_rank(s, H, L, V, S, 1)["tensors"]) \
            == (one, tensors)
    mlp = sum(p.numel() for p in model[1].mlp.parameters())
    moe = sum(p.numel() for p in MoE(H, 4, 2, 4 * H).parameters())
    assert gpt_params_per_rank("ep", H, L, V, S, 1, experts=4)["numel"] == one + L * (moe - mlp)


@pytest.mark.parametrize("t", [2, 4])
def test_params_formula_changes_with_the_world_size(t: int) -> None:
    one = {s: gpt_params_per_rank(s, H, L, V, S, 1, experts=8) for s in ("tp", "sp", "cp", "ep")}
    many = {s: gpt_params_per_rank(s, H, L, V, S, t, experts=8) for s in ("tp", "sp", "cp", "ep")}
    for s in ("tp", "sp", "ep"):  # the split part divides by t; LayerNorms, biases, embedding, head stay
        assert many[s]["split"] * t == one[s]["split"] > 0
        assert many[s]["whole"] == one[s]["whole"]
    assert t * many["tp"]["numel"] - (t - 1) * many["tp"]["whole"] == one["tp"]["numel"]  # ranks sum to one
    assert many["cp"] == one["cp"]  # context parallel keeps every weight
    assert many["ep"]["tensors"] < one["ep"]["tensors"]  # fewer experts, fewer Adam step scalars
    assert adam_bytes(10, 3) == 8 * 10 + 4 * 3


@pytest.mark.parametrize("t", [2, 4])
def test_activation_formula_changes_with_the_world_size(t: int) -> None:
    def act(s: str, n: int, **kw: object) -> dict:
        return model_activation_bytes(s, B, S, H, HEADS, L, V, n, **kw)  # type: ignore[arg-type]
    tp1, tpt = act("tp", 1)["per_layer_bytes"][0], act("tp", t)["per_layer_bytes"][0]
    rep = 4 * (4 * B * S * H + 4 * B * S)  # LayerNorm inputs, outputs and statistics: whole under tp
    assert tpt - rep == pytest.approx((tp1 - rep) / t)
    assert act("sp", t)["per_layer_bytes"][0] == pytest.approx(tp1 / t)  # sp splits every term
    assert act("sp", 1)["bytes"] == act("tp", 1)["bytes"]
    assert act("tp", t)["ends_bytes"] == act("tp", 1)["ends_bytes"]  # embedding and head see every token
    assert act("cp", t)["per_layer_bytes"][0] == pytest.approx(tp1 / t)  # s/t tokens through the whole block
    assert act("cp", t)["ends_bytes"] < act("cp", 1)["ends_bytes"]
    even = ep_routing_expected(B * S, 8, 2, None)
    moe = [{"kept": even["kept"], "received": even["received"]}] * L
    assert act("ep", t, moe=moe, experts=8, k=2)["bytes"] == act("ep", 1, moe=moe, experts=8, k=2)["bytes"]


def test_capacity_bounds_the_dispatched_tokens() -> None:
    free = ep_routing_expected(256, 4, 2, None)
    assert free["capacity"] is None and free["kept"] == 512
    tight = ep_routing_expected(256, 4, 1, 0.5)
    assert tight["capacity"] == 32 and tight["kept"] == 4 * 32  # E x C < T k: the rest is dropped
    loose = ep_routing_expected(256, 4, 2, 2.0)
    assert loose["kept"] == 512  # a capacity above T k / E drops nothing when balanced
    assert memory_per_rank("ep", B, S, H, HEADS, L, V, 2, 4, 1, [dict(kept=128, received=128)] * L)["activations_mib"] \
        < memory_per_rank("ep", B, S, H, HEADS, L, V, 2, 4, 2, [dict(kept=512, received=512)] * L)["activations_mib"]
