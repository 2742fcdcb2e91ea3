"""The run record (kit.run/2) of real runs on 2 gloo ranks: its schema and consistency, the timing method
validated by an injected link delay, and the memory accounting (the breakdown against its formula,
ActivationMeter's saved-tensor count, the optimizer's bytes)."""
from __future__ import annotations

import json
from statistics import median

import pytest
import torch
from torch import nn

from kit.experiments.config import ExperimentConfig
from kit.experiments.theory.links import alpha_beta_allreduce_s
from kit.experiments.measure.memory import ActivationMeter, optimizer_bytes
from kit.experiments.records import append_jsonl, load_jsonl, merge, table

RUN_KEYS = {"schema", "run_id", "created_unix_s", "label", "config", "env", "emulated", "notes", "steps",
            "memory", "timeline", "comm", "summary"}
STEP_KEYS = {"step", "rank", "fwd_ms", "bwd_ms", "opt_ms", "step_ms", "comm_ms", "comm_overlap_ms",
             "comm_exposed_ms", "loss", "samples"}
SUMMARY_KEYS = {"step_ms", "fwd_ms", "bwd_ms", "opt_ms", "comm_ms", "comm_overlap_ms", "comm_exposed_ms",
                "comm_overhead_pct", "throughput_samples_s", "peak_mib", "loss_final", "bytes_per_step", "bubble_pct"}


# -- runs on 2 gloo ranks (one spawn for all of them) ---------------------------------------------------
SMALL = dict(steps=3, warmup_steps=1)
PRED_LINK_MS = 300.0  # twice loopback's all-reduce of these 13 MB at load 10-15
MLP_GRAD_BYTES = 13_688_872  # the small MLP's fp32 gradient bytes (checked against the params below)
CFGS = {
    "ddp": ExperimentConfig(**SMALL),
    "ddp_view": ExperimentConfig(**SMALL, gradient_as_bucket_view=True, bucket_cap_mb=2),
    # custom link chosen so one bucket of all the MLP's gradients takes PRED_LINK_MS on the wire
    "ddp_link": ExperimentConfig(**SMALL, interconnect="custom", link_alpha_us=0.0,
                                 link_gbps=MLP_GRAD_BYTES / (PRED_LINK_MS * 1e-3) / 1e9),
    "pipeline": ExperimentConfig(**SMALL, strategy="pipeline", micro_batches=4),
}


@pytest.fixture(scope="module")
def recs(run_once) -> dict[str, dict]:
    per = run_once(2, CFGS)  # "pipeline" is test_measure_timing_clocks_links's m4: run once per session
    return {k: merge(per[k], c) for k, c in CFGS.items()}


def test_record_schema_and_consistency(recs: dict, tmp_path) -> None:
    for name, rec in recs.items():
        assert RUN_KEYS <= set(rec), name
        assert rec["schema"] == "kit.run/2" and rec["config"] == CFGS[name].to_dict()
        assert SUMMARY_KEYS <= set(rec["summary"])
        assert len(rec["steps"]) == 2 * CFGS[name].steps  # every timed step on both ranks
        for row in rec["steps"]:
            assert STEP_KEYS <= set(row)
            assert row["comm_overlap_ms"] + row["comm_exposed_ms"] == pytest.approx(row["comm_ms"], abs=1e-6)
            # phases are sequential parts of the step (pipeline: the forward/backward phases add up
            # over micro-batches, still inside the step)
            assert row["step_ms"] >= 0.98 * (row["fwd_ms"] + row["bwd_ms"] + row["opt_ms"])
        assert {e["kind"] for e in rec["timeline"]} <= {"compute", "comm", "idle"}
        json.dumps(rec, allow_nan=False)
    assert recs["ddp_link"]["emulated"] and not recs["ddp"]["emulated"]
    assert recs["ddp"]["comm"]["bytes_per_step"] == MLP_GRAD_BYTES
    assert len(recs["ddp_view"]["comm"]["buckets"]) > 1  # 2 MB cap: the 13 MB of gradients split
    assert 0 < recs["pipeline"]["summary"]["bubble_pct"] < 100
    path = tmp_path / "runs.jsonl"
    for rec in recs.values():
        append_jsonl(path, rec)
    with open(path, "a") as f:
        f.write('{"torn": ')  # a crash mid-write must not lose the finished records
    assert [r["run_id"] for r in load_jsonl(path)] == [r["run_id"] for r in recs.values()]
    assert "ddp mlp bs32 fp32 bucket25MiB" in table(recs.values())


def _wire_ms(rec: dict) -> float:
    """The median over steps of the comm time of the rank that reached the all-reduce last: it waited for
    no peer, so its comm is the wire's own time (loopback's all-reduce, plus the emulated link's)."""
    by_step: dict[int, list[float]] = {}
    for row in rec["steps"]:
        by_step.setdefault(row["step"], []).append(row["comm_ms"])
    return median(min(ms) for ms in by_step.values())


def test_injected_link_delay_shows_up_as_exposed_comm(recs: dict) -> None:
    """The timing method's validation: a known delay on the wire must appear where predicted.

    The emulated link holds a bucket for its link time *after* the real all-reduce finished (VirtualLink:
    the link's time is added to loopback's), and the one bucket is launched when backward ends, so
    nothing overlaps: every step's comm is exposed, and the wire's time grows by PRED_LINK_MS. Each bound
    compares numbers of one step, or the wire's own time (no rank skew) across the two runs: a whole step,
    or a rank that waited for its peer, grows by hundreds of ms between two runs at load 10-15.
    """
    assert alpha_beta_allreduce_s(MLP_GRAD_BYTES, 2, 0.0, CFGS["ddp_link"].link[1]) * 1e3 == pytest.approx(PRED_LINK_MS)
    base, slow = recs["ddp"], recs["ddp_link"]
    # A sleep never ends early: every bucket is held at least its link time after the real all-reduce.
    assert all(row["comm_ms"] >= PRED_LINK_MS for row in slow["steps"]), slow["steps"]
    assert slow["summary"]["comm_exposed_ms"] >= 0.9 * PRED_LINK_MS
    assert slow["summary"]["comm_overlap_ms"] < 0.2 * PRED_LINK_MS  # launched after backward: little to overlap
    # Charged once, not twice or not at all; half a link time of slack for loopback's own time, which
    # differs between the two runs on a busy machine.
    assert _wire_ms(slow) - _wire_ms(base) == pytest.approx(PRED_LINK_MS, abs=0.5 * PRED_LINK_MS)
    # The step pays it: a step is its phases plus its exposed comm (and little else), in each step.
    rest_ms = [r["step_ms"] - r["fwd_ms"] - r["bwd_ms"] - r["opt_ms"] - r["comm_exposed_ms"] for r in slow["steps"]]
    assert 0 <= median(rest_ms) < 0.5 * PRED_LINK_MS, rest_ms


def test_memory_breakdown_matches_formula(recs: dict) -> None:
    n_params = MLP_GRAD_BYTES // 4
    for name in ("ddp", "ddp_view"):
        for m in recs[name]["memory"]:
            assert m["params_mib"] == pytest.approx(n_params * 4 / 2**20, rel=1e-12)
            # Adam: exp_avg + exp_avg_sq (8 bytes/param) + one 4-byte `step` scalar per tensor (10 tensors)
            assert m["optimizer_mib"] * 2**20 == pytest.approx(8 * n_params + 4 * 10, abs=0.5)
            assert m["predicted"]["optimizer_mib"] == m["optimizer_mib"]  # the prediction counts the steps too
            assert m["predicted"]["activations_mib"] == pytest.approx(m["activations_mib"], rel=1e-12)
    # gradient_as_bucket_view: .grad *is* the bucket, so one copy of the gradients instead of two.
    assert recs["ddp"]["memory"][0]["grads_mib"] == pytest.approx(2 * n_params * 4 / 2**20)
    assert recs["ddp_view"]["memory"][0]["grads_mib"] == pytest.approx(n_params * 4 / 2**20)


def test_saved_tensor_hooks_count_activations_exactly() -> None:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 3), nn.ReLU(), nn.Linear(3, 2))
    x = torch.randn(5, 4)
    meter = ActivationMeter(model.parameters())
    with meter.record():
        out = model(x)
    # By hand: Linear 1 saves its input x (5x4 fp32 = 80 B); ReLU saves its output (5x3 = 60 B),
    # which Linear 2 saves again (same storage, counted once); weights are params, not activations.
    assert meter.bytes == 5 * 4 * 4 + 5 * 3 * 4
    out.sum().backward()
    opt = torch.optim.Adam(model.parameters())
    opt.step()
    p = sum(q.numel() for q in model.parameters())
    assert optimizer_bytes(opt) == 8 * p + 4 * 4  # 4 parameter tensors, one fp32 step scalar each
