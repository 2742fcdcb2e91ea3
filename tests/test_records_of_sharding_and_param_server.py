"""Run records of zero1, fsdp, compressed DDP and param_server through the real runner: the
fields the existing plots and table read, the predictions with their formulas, JSON-safe.

One spawn of 2 gloo ranks, tiny model, 2 timed steps each (shape, not speed, is checked here).
"""
from __future__ import annotations

import json

import matplotlib
import pytest

from kit.experiments.config import ExperimentConfig
from kit.experiments.harness.local import run_each
from kit.experiments.records import merge, table

matplotlib.use("Agg")

BASE = dict(workload="mlp", model_size="tiny", batch_size=8, steps=2, warmup_steps=1)
CFGS = {
    "zero1": ExperimentConfig(**BASE, strategy="zero1"),
    "fsdp": ExperimentConfig(**BASE, strategy="fsdp"),
    "fsdp_zero2": ExperimentConfig(**BASE, strategy="fsdp", reshard_after_forward=False),
    "fp16": ExperimentConfig(**BASE, strategy="ddp", compression="fp16"),
    "powersgd_link": ExperimentConfig(**BASE, strategy="ddp", compression="powersgd", powersgd_rank=2,
                                      start_powerSGD_iter=2, interconnect="10gbe"),
    "ps_async": ExperimentConfig(**BASE, strategy="param_server", ps_mode="async", straggler_ms=5.0),
}


@pytest.fixture(scope="module")
def recs() -> dict[str, dict]:
    per_rank = run_each("kit.experiments.runner:run_rank", 2, [(c.to_dict(),) for c in CFGS.values()])
    return {k: merge({r: per_rank[r][i] for r in per_rank}, c) for i, (k, c) in enumerate(CFGS.items())}


def test_records_have_the_plot_fields_and_predictions(recs: dict) -> None:
    for name, rec in recs.items():
        json.dumps(rec, allow_nan=False)
        assert len(rec["steps"]) == 2 * CFGS[name].steps, name
        assert rec["summary"]["step_ms"] > 0 and rec["summary"]["bytes_per_step"] > 0, name
        rep = rec["comm"]["report"]
        assert rep["payload_bytes_per_step"] == rec["summary"]["bytes_per_step"]
        assert "predicted" in rep.get("kind", "") or "predicted" in rep, name  # labelled
        for m in rec["memory"]:
            assert {"params_mib", "grads_mib", "optimizer_mib", "activations_mib", "predicted"} <= set(m)
    for name in ("zero1", "fsdp", "fsdp_zero2"):
        z = recs[name]["memory"][0]["zero"]
        assert "bytes/param" in z["fp32"]["formula"] and "bytes/param" in z["mixed"]["formula"]
    fsdp, z2 = recs["fsdp"]["memory"][0], recs["fsdp_zero2"]["memory"][0]
    assert fsdp["params_mib"] == pytest.approx(fsdp["zero"]["fp32"]["params_mib"], rel=0.01)  # 4/N
    assert fsdp["gathered_params_after_forward_mib"] == 0.0
    assert z2["gathered_params_after_forward_mib"] == pytest.approx(2 * z2["params_mib"], rel=0.01)
    assert recs["fsdp"]["summary"]["comm_ms"] > 0  # FSDP's collectives are timed
    assert recs["fp16"]["comm"]["report"]["compression_ratio"] == 2.0
    ps = recs["powersgd_link"]["comm"]["report"]
    # start_powerSGD_iter=2: two plain all-reduces (warm-up + first timed step), then compressed
    assert ps["compressed_by_step"] == [False, False, True, True] and ps["compression_ratio"] > 2
    assert recs["powersgd_link"]["emulated"]
    rep = recs["ps_async"]["comm"]["report"]
    assert rep["updates"] == 1 + 2 + 1 and rep["server_ingress_bytes_per_step"] > 0


def test_sharded_adam_state_is_predicted_as_torch_allocates_it(recs: dict) -> None:
    """FSDP: every rank holds 1/N of each tensor's m and v and a 4-byte `step` per tensor, predicted to the
    byte (parallel_memory.state_mib, as HSDP's); the prediction sat 4 bytes x tensors low before. torch's ZeRO-1
    gives each rank whole tensors (m, v and step), so the ranks differ by the partition and their mean is the
    formula's tensors / N."""
    for name in ("fsdp", "fsdp_zero2"):
        for m in recs[name]["memory"]:
            by_kind = m["by_kind"]["optimizer_mib"]
            assert by_kind["measured_mib"] == pytest.approx(by_kind["predicted_mib"], rel=1e-12), (name, by_kind)
            assert "4 bytes x tensors (step)" in by_kind["formula"]
    rows = recs["zero1"]["memory"]
    mean = sum(m["optimizer_mib"] for m in rows) / len(rows)
    assert mean == pytest.approx(rows[0]["predicted"]["optimizer_mib"], rel=1e-12)
    assert "4 bytes x tensors / N (step)" in rows[0]["by_kind"]["optimizer_mib"]["formula"]


def test_existing_plots_draw_the_new_records(recs: dict) -> None:
    from kit.plots import memory_breakdown, step_breakdown, step_timeline
    records = list(recs.values())
    for fig in (step_breakdown(records), memory_breakdown(records), step_timeline(recs["fsdp"])):
        assert fig.axes
    assert "zero1 mlp bs8 fp32 tiny" in table(records)
