"""The planner's bytes and memory against the kit's measured tensor, sequence, context and expert
parallel runs (2 gloo ranks, the gpt workload "small": 3 layers, h = 128, 4 heads, 32 tokens, fp32).

Counted at every collective call by the strategies (kit/experiments/parallel/wire.py) and by
autograd's saved-tensor hooks (ActivationMeter); predicted by kit/experiments/theory/ from the
model's shapes alone. Exact where the formula and the run count the same thing; where they do not,
the test states the difference and pins it."""
from __future__ import annotations

import pytest

from kit.experiments.config import ExperimentConfig
from kit.experiments.measure.model_shapes import spec_from_module
from kit.experiments.measure.workloads import build_workload
from kit.experiments.choices import GPT_SEQ
from kit.experiments.theory.layout_memory import ParallelConfig, activation_bytes_per_layer, state_bytes
from kit.experiments.theory.layout_time import collective_bytes
from kit.experiments.theory.models import ModelSpec

# The runs test_parallel_memory and test_parallel_run_records check too: run once per session.
BASE = dict(workload="gpt", model_size="small", batch_size=8, steps=2, warmup_steps=1)
T, B, F32 = 2, 8, 4


@pytest.fixture(scope="module")
def runs(run_once) -> dict[str, dict]:
    per = run_once(T, {k: ExperimentConfig(**BASE, strategy=k) for k in ("tp", "sp", "cp", "ep")})
    return {k: per[k][0] for k in per}


@pytest.fixture(scope="module")
def spec() -> ModelSpec:
    wl = build_workload("gpt", "small", 0, n_samples=8)
    wl.dataset.close()
    return spec_from_module(wl.model)


def _measured(run: dict, kind: str) -> dict:
    return run["comm_report"]["measured_per_step"][kind]


def test_tp_bytes_and_activations(runs: dict, spec: ModelSpec) -> None:
    pc = ParallelConfig(tp=T, micro_batch=B, sp=False, precision="fp32")
    calls, each = collective_bytes(spec, pc, GPT_SEQ)["tp"]
    got = _measured(runs["tp"], "tp/all_reduce")
    assert (got["calls"], got["payload_bytes"]) == (calls, calls * each)
    # saved for backward per block: the formula + LayerNorm's mean, rstd and attention's logsumexp (fp32)
    extra = B * GPT_SEQ * (4 + spec.heads / T) * F32
    measured = runs["tp"]["memory"]["activations_per_layer"]["measured_mib"] * 2**20
    assert measured == activation_bytes_per_layer(spec, pc, GPT_SEQ) + extra


def test_sp_bytes_and_activations(runs: dict, spec: ModelSpec) -> None:
    pc = ParallelConfig(tp=T, micro_batch=B, sp=True, precision="fp32")
    traffic = collective_bytes(spec, pc, GPT_SEQ)
    (n_tp, each), (n_re, _) = traffic["tp"], traffic["sp_regather"]
    rs, ag = _measured(runs["sp"], "tp/reduce_scatter"), _measured(runs["sp"], "tp/all_gather")
    assert (rs["calls"], rs["payload_bytes"]) == (n_tp, n_tp * each)
    # + 2 all-gathers at the model's ends (after the embedding, before the head): per model, not per layer
    assert (ag["calls"], ag["payload_bytes"]) == (n_tp + n_re + 2, (n_tp + n_re + 2) * each)
    extra = B * GPT_SEQ * (4 / T + spec.heads / T) * F32
    measured = runs["sp"]["memory"]["activations_per_layer"]["measured_mib"] * 2**20
    assert measured == activation_bytes_per_layer(spec, pc, GPT_SEQ) + extra


def test_cp_ring_attention_sends(runs: dict, spec: ModelSpec) -> None:
    calls, each = collective_bytes(spec, ParallelConfig(cp=T, micro_batch=B, precision="fp32"), GPT_SEQ)["cp"]
    got = _measured(runs["cp"], "cp/send")
    assert (got["calls"], got["payload_bytes"]) == (calls, calls * each)


def test_ep_all_to_alls_within_routing_imbalance(runs: dict, spec: ModelSpec) -> None:
    cfg = ExperimentConfig(**BASE, strategy="ep")
    moe = ModelSpec("moe", spec.layers, spec.hidden, spec.heads, spec.kv_heads, 4 * spec.hidden, spec.vocab,
                    seq_len=GPT_SEQ, gated_mlp=False, experts=cfg.experts, experts_per_token=cfg.top_k, bias=True)
    calls, each = collective_bytes(moe, ParallelConfig(dp=T, ep=T, micro_batch=B, precision="fp32"), GPT_SEQ)["ep"]
    got = _measured(runs["ep"], "ep/all_to_all")
    assert got["calls"] == calls
    # the run counts the rows that leave the rank, routed by a learned router: uniform routing sends (n-1)/n
    assert got["payload_bytes"] == pytest.approx(calls * each * (T - 1) / T, rel=0.05)


def test_tp_params_differ_only_by_what_the_toy_replicates(runs: dict, spec: ModelSpec) -> None:
    """Megatron shards the embedding and head by vocabulary (the formula); the kit's toy keeps them,
    the norms and the row-parallel biases whole on every rank: exactly half of those is the difference."""
    wl = build_workload("gpt", "small", 0, n_samples=8)
    wl.dataset.close()
    whole = sum(p.numel() for m in wl.model if not hasattr(m, "heads") for p in m.parameters())
    whole += sum(p.numel() for m in wl.model if hasattr(m, "heads") for p in
                 (*m.ln1.parameters(), *m.ln2.parameters(), m.proj.bias, m.mlp[2].bias))
    pred = state_bytes(spec, ParallelConfig(tp=T, precision="fp32"))["params"]
    measured = runs["tp"]["memory"]["params_mib"] * 2**20
    assert measured == pred + whole / 2 * F32
    assert abs(measured - pred) / measured < 0.12  # 11% on this toy, where the embedding is large


def test_cp_and_ep_state_bytes_exact(runs: dict, spec: ModelSpec) -> None:
    """Context parallel keeps every weight on every rank; expert parallel splits the experts over ep
    and keeps the rest (attention, router, embedding) whole: params and grads exact, Adam within its
    4-byte `step` per tensor."""
    cfg = ExperimentConfig(**BASE, strategy="ep")
    moe = ModelSpec("moe", spec.layers, spec.hidden, spec.heads, spec.kv_heads, 4 * spec.hidden, spec.vocab,
                    seq_len=GPT_SEQ, gated_mlp=False, experts=cfg.experts, experts_per_token=cfg.top_k, bias=True,
                    positions=spec.positions, head_bias=spec.head_bias)
    for name, model, pc in (("cp", spec, ParallelConfig(cp=T, precision="fp32")),
                            ("ep", moe, ParallelConfig(dp=T, ep=T, precision="fp32"))):
        pred, got = state_bytes(model, pc), runs[name]["memory"]
        assert got["params_mib"] * 2**20 == pred["params"] and got["grads_mib"] * 2**20 == pred["grads"], name
        assert 0 <= got["optimizer_mib"] * 2**20 - pred["optimizer"] <= 4 * 100, name
