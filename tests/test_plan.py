"""The planner (kit.experiments.plan): parameter counts against published totals, memory and time
formulas against hand computations from their papers, refusals, ranking, no torch; and the ZeRO
state bytes against the kit's own measured zero1/fsdp runs (2 gloo ranks, tiny GPT)."""
from __future__ import annotations

import inspect
import json
import math
import pydoc
import re
import subprocess
import sys
import time
from dataclasses import replace
from types import SimpleNamespace

import pytest

from kit.experiments.theory.links import LINKS, alpha_beta_allreduce_s
from kit.errors import ConfigError
from kit.experiments import cluster_spec  # a planned cluster (conftest's make_cluster starts ranks)
from kit.experiments.theory.cluster import MAX_GPUS_PER_NODE, MAX_NODES, MAX_RANKS
from kit.experiments.theory.layout_memory import ParallelConfig, activation_bytes_per_layer, memory_per_gpu, \
    state_bytes
from kit.experiments.theory.layout_time import collective_bytes, planned_allreduce_s, step_time
from kit.experiments.theory.models import MODELS, ModelSpec
from kit.units import GIB
from kit.experiments.theory.plan import PlanError, plan

L8 = MODELS["llama3-8b"]


@pytest.mark.parametrize("name, published, rel", [
    ("llama3-8b", 8.03e9, 1e-3),      # Meta model card: 8.03B
    ("llama3-70b", 70.6e9, 1e-3),     # 70.6B
    ("llama3-405b", 405.9e9, 1e-3),   # 405B (Llama 3.1 405B: 405.9B in the Hugging Face listing)
    ("gpt2", 124.44e6, 1e-4),         # 124,439,808 (Hugging Face gpt2)
    ("mixtral-8x7b", 46.7e9, 1e-3),   # Mixtral paper: 47B total ...
])
def test_parameter_counts_match_published_totals(name: str, published: float, rel: float) -> None:
    assert MODELS[name].params() == pytest.approx(published, rel=rel)


def test_llama3_8b_by_hand() -> None:
    h, kv, f, v, layers = 4096, 1024, 14336, 128256, 32
    layer = 2 * h * h + 2 * h * kv + 3 * h * f + 2 * h  # q, o; k, v (8 KV heads of 128); SwiGLU; 2 RMSNorms
    assert L8.params() == layers * layer + 2 * v * h + h  # untied embedding and head, final norm
    assert MODELS["mixtral-8x7b"].active_params() == pytest.approx(12.9e9 - 32000 * 4096, rel=0.02)  # "13B active"


def test_korthikanti_activations_for_gpt() -> None:
    """GPT shapes (f = 4h, MHA, dropout, unfused attention, Megatron's selective recompute) give the
    paper's Table 2 exactly, in bytes per layer; fused attention drops the score term; torchtitan's per-op
    policy keeps the block input, the attention output and every other matmul's output."""
    gpt = ModelSpec("gpt", 24, 2048, 16, 16, 8192, 50257, dropout=True, gated_mlp=False, bias=True,
                    flash_attention=False)
    s, b, h, a, t = 2048, 2, 2048, 16, 4
    sbh = s * b * h

    def act(**kw: object) -> float:
        return activation_bytes_per_layer(gpt, ParallelConfig(micro_batch=b, framework="megatron", **kw), s)  # type: ignore[arg-type]
    fused = replace(gpt, flash_attention=True)
    assert activation_bytes_per_layer(fused, ParallelConfig(micro_batch=b, recompute="none", sp=False), s) \
        == pytest.approx(34 * sbh)
    # op policy, GeLU MLP: matmuls q, k, v, o, fc1, fc2 -> q, v, fc1 saved (h + h + 4h), with x and the attention out
    op = activation_bytes_per_layer(fused, ParallelConfig(micro_batch=b, recompute="op", sp=False), s)
    assert op == pytest.approx(sbh * (2 + 2 * (1 + 1 + 1 + 4)))
    assert act(recompute="none", sp=False) == pytest.approx(sbh * (34 + 5 * a * s / h))
    assert act(tp=t, recompute="none", sp=False) == pytest.approx(sbh * (10 + 24 / t + 5 * a * s / (h * t)))
    assert act(tp=t, recompute="none", sp=True) == pytest.approx(sbh / t * (34 + 5 * a * s / h))
    assert act(tp=t, recompute="selective", sp=True) == pytest.approx(34 * sbh / t)
    assert act(recompute="full", sp=False) == pytest.approx(2 * sbh)


def test_state_bytes_of_a_simple_layout_by_hand() -> None:
    n = L8.params()
    # bf16 params, fp32 grads, fp32 master + Adam (18 B/param); ZeRO-1 over 8: 2 + 4 + 12/8
    st = state_bytes(L8, ParallelConfig(dp=8, zero=1, precision="bf16"))
    assert (st["params"], st["grads"], st["optimizer"]) == (2 * n, 4 * n, 12 * n / 8)
    st3 = state_bytes(L8, ParallelConfig(dp=4, cp=2, zero=3, precision="bf16"))  # cp ranks share the shards
    assert sum(st3.values()) == pytest.approx(18 * n / 8)
    mem = memory_per_gpu(L8, ParallelConfig(dp=8, zero=1, recompute="full"), 4096)
    s, h, v = 4096, 4096, 128256
    acts = 32 * 2 * s * h + activation_bytes_per_layer(L8, ParallelConfig(framework="megatron"), s, "selective")
    assert mem.activations_gib == pytest.approx(acts / GIB)
    # torchtitan's loss: bf16 logits, their fp32 copy, fp32 log-probabilities' gradient and the bf16 one
    assert mem.logits_gib == pytest.approx(s * v * 12 / GIB)
    megatron = memory_per_gpu(L8, ParallelConfig(dp=8, zero=1, recompute="full", framework="megatron"), 4096)
    assert megatron.logits_gib == pytest.approx(s * v * 6 / GIB)
    allocated = (18 * n - 12 * n + 12 * n / 8) + acts + s * v * 12
    assert mem.total_gib == pytest.approx((allocated * 1.05) / GIB + 2.0)


def test_pipeline_stages_and_in_flight_micro_batches() -> None:
    m = MODELS["llama3-70b"]
    one_f = memory_per_gpu(m, ParallelConfig(tp=8, pp=8, micro_batches=32, schedule="1f1b"), 4096)
    gpipe = memory_per_gpu(m, ParallelConfig(tp=8, pp=8, micro_batches=32, schedule="gpipe"), 4096)
    assert one_f.stage == "first"   # 1F1B: pp micro-batches in flight on the first stage, one on the last
    assert gpipe.stage == "last"    # GPipe: all m on every stage, and the last also holds their logits
    assert gpipe.activations_gib == pytest.approx(one_f.activations_gib * 32 / 8)  # m vs pp in flight
    z3 = memory_per_gpu(m, ParallelConfig(tp=8, dp=8, zero=3), 4096)
    assert z3.gathered_gib > 0 and memory_per_gpu(m, ParallelConfig(tp=8, dp=8, zero=1), 4096).gathered_gib == 0


def test_collectives_use_the_link_they_cross() -> None:
    c = cluster_spec(nodes=4)
    nv, ib = LINKS["nvlink"], LINKS["infiniband"]
    n = 64e6
    assert planned_allreduce_s(n, 8, 1, c) == pytest.approx(alpha_beta_allreduce_s(n, 8, nv.hop_us, nv.gbps, nv.base_us,
                                                                                  nv.efficiency, nv.chunk_half_bytes))
    ring = alpha_beta_allreduce_s(n, 4, ib.hop_us, 50.0, ib.base_us, ib.efficiency)  # one NIC (400/8 GB/s) per GPU
    tree = (ib.base_us + 2 * 2 * ib.hop_us) * 1e-6 + 2 * n / (50e9 * ib.efficiency)
    assert planned_allreduce_s(n, 4, 8, c) == pytest.approx(min(ring, tree))  # stride 8: every member on its own node
    assert planned_allreduce_s(1e3, 4, 8, c) == pytest.approx((ib.base_us + 4 * ib.hop_us) * 1e-6 + 2e3 / 45e9)  # tree


def test_step_time_rules() -> None:
    c = cluster_spec(nodes=8)
    m = MODELS["llama3-70b"]
    pc = ParallelConfig(tp=8, pp=4, dp=2, micro_batches=16)
    t = step_time(m, pc, c, 4096)
    t_mb = t.bubble_s / 3
    assert t.step_s == pytest.approx(19 * t_mb + t.dp_exposed_s + t.optimizer_s)  # (m + pp - 1) micro-batch times
    assert 0 < t.mfu < 0.52 and dict(t.links) == {"tp": "NVLink", "cp": "none", "ep": "none", "dp": "InfiniBand",
                                                     "pp": "InfiniBand"}
    # critical batch: with one micro-batch, the gradient all-reduce hides iff the tokens exceed it; hidden, it
    # still costs what it slows the backward beside it (theory/overlap.py): dp_s x slowdown / (1 + slowdown)
    slow = c.accelerator.overlap_slowdown
    for mb in (1, 8):
        t1 = step_time(MODELS["llama3-8b"], ParallelConfig(dp=64, micro_batch=mb, recompute="full"), c, 4096)
        hidden = t1.dp_exposed_s == pytest.approx(t1.dp_s * slow / (1 + slow))
        assert hidden == (t1.tokens_per_gpu >= t1.critical_tokens_per_gpu)


def test_collective_bytes_by_hand() -> None:
    """Megatron's 4 all-reduces of b s h per layer (6 with full recompute); ring attention's K, V."""
    b, s, h = 2, 4096, 4096
    t = collective_bytes(L8, ParallelConfig(tp=8, pp=2, dp=4, cp=2, micro_batch=b, zero=1), s)
    assert t["tp"] == (16 * 4, b * s / 2 * h * 2)          # 16 layers per stage, s/cp tokens, bf16
    assert t["cp"] == (16 * (4 * 1 + 2 * 2), b * s / 2 * 8 * 128 * 2 / 8)  # one K or V chunk; kv heads split by tp
    assert t["pp"] == (2, b * s / 2 * h * 2 / 8) and t["ep"][0] == 0  # sequence parallel: 1/tp of the activation
    assert t["sp_regather"] == (16 * 2, t["tp"][1])
    assert t["dp_reduce"][1] == 4 * (16 * sum(L8.layer_params()) + L8.vocab * h + h) / 8  # fp32 grads, last stage
    assert collective_bytes(L8, ParallelConfig(tp=8, recompute="full"), s)["tp"][0] == 32 * 6


@pytest.mark.parametrize("kw, words", [
    (dict(tp=3), r"does not divide the 64 attention heads.*pick tp from \[1, 2, 4, 8\]"),
    (dict(pp=100), "more pipeline stages than the 80 layers"),
    (dict(tp=8, pp=8, cp=32), "larger than the cluster's 64"),
    (dict(ep=2), "needs an MoE model"),
    (dict(zero=3, pp=2, framework="deepspeed"), "ZeRO-2/3 with pipeline parallelism under DeepSpeed's rules"),
    (dict(zero=2, framework="megatron"), "ZeRO-2/3 under Megatron-LM's rules"),
    (dict(recompute="op", framework="megatron"), "recompute='op' .* needs framework='torch'"),
    (dict(cp=3), r"cp=3 does not divide the cluster's 64 GPUs: .*pick cp from \[1, 2, 4, 8, 16, 32, 64\]"),
    (dict(cp=8, seq_len=4100), "cp=8 does not divide the sequence length 4100"),
])
def test_impossible_requests_are_refused_with_the_reason(kw: dict, words: str) -> None:
    with pytest.raises(PlanError, match=words):
        plan("llama3-70b", nodes=8, **{"seq_len": 4096, **kw})


def test_refused_layouts_are_counted_once_per_rule_whatever_their_numbers() -> None:
    """Plan.refused: one line per rule broken, with its first layout's reason and how many broke it, however
    the numbers in the reasons differ (a fixed dp: layouts of 4, 8, 16 GPUs and of 64, 128 are refused);
    with the layouts kept, the lines account for every layout considered."""
    p = plan("llama3-70b", nodes=4, dp=4)
    lines = dict(p.refused)
    assert len([r for r in lines if r.endswith("does not use the cluster's 32 GPUs")]) == 1, p.refused
    assert len([r for r in lines if r.endswith("GPUs is larger than the cluster's 32")]) == 1, p.refused
    assert len({re.sub(r"\d+", "N", r) for r in lines}) == len(lines), p.refused   # no rule on two lines
    assert len(p) + sum(lines.values()) == p.considered


def test_plan_ranks_fitting_layouts_and_explains() -> None:
    p = plan("llama3-70b", nodes=8, seq_len=4096)
    assert len(p) > 0 and all(x.fits and x.memory_gib <= 80 for x in p)
    steps = [x.step_s for x in p]
    assert steps[0] == min(steps) and all(a <= b * 1.001 for a, b in zip(steps, steps[1:]))
    top = p[0]
    assert top.config.tp * top.config.pp * top.config.dp * top.config.cp == 64 and "dominates" in top.why and "predicted" in p.describe()
    assert any(r.startswith("does not fit in memory (even with recompute=full)") for r, _ in p.refused)
    assert all(x.config.recompute == "none" or memory_per_gpu(MODELS["llama3-70b"], replace(  # least that fits
        x.config, recompute="none"), 4096).total_gib > 80 for x in p)
    nothing = plan("llama3-405b", nodes=1)
    assert len(nothing) == 0 and "Nothing fits" in nothing.describe() and nothing.smallest.memory_gib > 80
    d = top.as_dict()
    assert json.loads(json.dumps(d))["memory"]["total_gib"] == top.memory_gib and d["time"]["links"] == dict(top.time.links)
    fixed = plan("llama3-70b", nodes=8, seq_len=4096, tp=8, zero=1)
    assert {(x.config.tp, x.config.zero) for x in fixed} == {(8, 1)}


def test_planning_never_imports_torch() -> None:
    code = ("import sys; from kit.experiments import plan; p = plan('llama3-70b', nodes=128, seq_len=4096); "
            "assert len(p) > 0; import kit.experiments.measure.model_shapes; print('torch' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "False"


def test_spec_from_a_module_and_from_a_config() -> None:
    from kit.experiments.measure.model_shapes import spec_from_module
    from kit.experiments.measure.workloads import build_workload
    wl = build_workload("gpt", "small", 0, n_samples=8)
    wl.dataset.close()
    spec = spec_from_module(wl.model)
    assert spec.params() == sum(p.numel() for p in wl.model.parameters())
    cfg = SimpleNamespace(num_hidden_layers=32, hidden_size=4096, num_attention_heads=32, num_key_value_heads=8,
                          intermediate_size=14336, vocab_size=128256, max_position_embeddings=8192,
                          tie_word_embeddings=False)
    assert spec_from_module(SimpleNamespace(config=cfg)).params() == L8.params()


# --- validation against this machine's measured runs: ZeRO state bytes per rank (fp32 Adam, 2 ranks) ---
BASE = dict(workload="gpt", model_size="tiny", batch_size=4, steps=1, warmup_steps=1)


@pytest.fixture(scope="module")
def measured() -> dict[str, dict]:
    from kit.experiments.config import ExperimentConfig
    from kit.experiments.harness.local import run_each
    cfgs = {"ddp": ExperimentConfig(**BASE, strategy="ddp", gradient_as_bucket_view=True),
            "zero1": ExperimentConfig(**BASE, strategy="zero1"), "fsdp": ExperimentConfig(**BASE, strategy="fsdp")}
    per_rank = run_each("kit.experiments.runner:run_rank", 2, [(c.to_dict(),) for c in cfgs.values()])
    return {k: per_rank[0][i]["memory"] for i, k in enumerate(cfgs)}  # rank 0 (both ranks hold equal shards)


def test_state_bytes_match_the_measured_sharding_runs(measured: dict[str, dict]) -> None:
    from kit.experiments.measure.model_shapes import spec_from_module
    from kit.experiments.measure.workloads import build_workload
    wl = build_workload("gpt", "tiny", 0, n_samples=8)
    wl.dataset.close()
    spec, n_tensors = spec_from_module(wl.model), len(list(wl.model.parameters()))
    for name, zero in (("ddp", 0), ("zero1", 1), ("fsdp", 3)):
        pred = state_bytes(spec, ParallelConfig(dp=2, zero=zero, precision="fp32"))
        got = measured[name]
        mib = 2.0**20
        assert got["params_mib"] * mib == pred["params"], name
        # the kit's zero1 is DDP (default buckets: a second gradient copy) + ZeroRedundancyOptimizer
        assert got["grads_mib"] * mib == pred["grads"] * (2 if name == "zero1" else 1), name
        # Adam also keeps one 4-byte `step` per tensor (sharded with its tensor): at most n_tensors * 4 bytes
        assert 0 <= got["optimizer_mib"] * mib - pred["optimizer"] <= 4 * n_tensors, name
    assert math.isclose(measured["fsdp"]["params_mib"] * 2, measured["ddp"]["params_mib"])


def test_plot_and_panel_show_the_plan() -> None:
    import matplotlib
    matplotlib.use("Agg")
    pytest.importorskip("ipywidgets")
    from kit.plots import plan_layouts
    from kit.widgets import PlanPanel
    p = plan("llama3-70b", nodes=8)
    fig = plan_layouts(p, top=5)
    mem_ax, time_ax = fig.axes[:2]
    assert "GiB" in mem_ax.get_xlabel() and "s, predicted" in time_ax.get_xlabel() and len(fig.legends) == 2
    assert len(mem_ax.get_yticklabels()) == 5 and "predicted" in fig._suptitle.get_text()
    panel = PlanPanel(model="llama3-70b", nodes=8)
    assert panel.plan[0].step_s == p[0].step_s and panel.image.value  # the same plan, drawn
    panel.nodes.value = 1  # 70B on 8 GPUs: nothing fits, said in words
    assert "Nothing fits" in panel.text.value
    panel.model.value = "gpt2"
    panel.seq.value = 1000  # fine: no cp divides it but cp=1 does
    assert len(panel.plan) > 0 and panel.image.layout.display is None
    panel.gpus.value = 16
    panel.nodes.value = 4096  # no layout possible: the reason, and no plot of the last plan under it
    assert "no layout is possible" in panel.text.value and panel.image.layout.display == "none"
    panel.nodes.value = 1
    assert len(panel.plan) > 0 and panel.image.layout.display is None  # a possible plan shows its plot again


def test_the_plan_panel_plans_what_plan_plans_at_the_model_s_own_length() -> None:
    """Left alone, the panel and `plan()` give one plan: the panel used to plan llama3-8b at 4096 tokens where
    plan("llama3-8b") takes the model's 8192. The box follows the model menu until the learner types a length."""
    pytest.importorskip("ipywidgets")
    from kit.widgets import PlanPanel
    panel = PlanPanel()
    assert panel.seq.value == 8192 and panel.plan[0].step_s == plan("llama3-8b")[0].step_s
    panel.model.value = "gpt2"  # the box follows the menu: GPT-2 trains at 1024
    assert panel.seq.value == 1024 and panel.plan[0].step_s == plan("gpt2")[0].step_s
    panel.seq.value = 512  # typed: kept when the model changes
    panel.model.value = "llama3-8b"
    assert panel.seq.value == 512 and panel.plan[0].step_s == plan("llama3-8b", seq_len=512)[0].step_s
    fixed = PlanPanel(model="gpt2", seq_len=2048)  # a starting length is the learner's too
    fixed.model.value = "llama3-8b"
    assert fixed.seq.value == 2048


def test_state_bytes_agree_with_the_zero_prediction_the_runs_record() -> None:
    """The planner and the per-run ZeRO prediction (sharding_theory, in every zero1/fsdp record) agree."""
    from kit.experiments.theory.sharding_theory import zero_bytes_per_param
    n = L8.params()
    for stage in (0, 1, 2, 3):
        for precision, mixed in (("fp32", False), ("bf16-bf16grads", True)):
            st = state_bytes(L8, ParallelConfig(dp=16, zero=stage, precision=precision))
            ref = zero_bytes_per_param(stage, 16, mixed)
            assert st == pytest.approx({"params": ref["params"] * n, "grads": ref["grads"] * n,
                                        "optimizer": ref["optimizer"] * n}), (stage, precision)


@pytest.mark.parametrize("h, heads, s, b", [(128, 4, 64, 2), (256, 8, 128, 4)])
def test_activation_formula_matches_saved_tensors_of_a_real_block(h: int, heads: int, s: int, b: int) -> None:
    """Measured here: the bytes autograd saves for one of the kit's transformer blocks (fp32, GeLU MLP,
    no dropout) equal Korthikanti's terms with the score term gone, because torch's CPU
    scaled_dot_product_attention is a flash kernel (it keeps no s x s scores: what selective recompute
    achieves). The rest is the kernel's logsumexp and LayerNorm's mean and rstd (b s (heads + 4) fp32)."""
    torch = pytest.importorskip("torch")
    from kit.experiments.measure.memory import ActivationMeter
    from kit.experiments.models import Block
    torch.manual_seed(0)
    block = Block(h, heads)
    meter = ActivationMeter(block.parameters())
    with meter.record():
        block(torch.randn(b, s, h, requires_grad=True))
    spec = ModelSpec("block", 1, h, heads, heads, 4 * h, 256, seq_len=s, gated_mlp=False, bias=True)
    pred = activation_bytes_per_layer(spec, ParallelConfig(micro_batch=b, precision="fp32", recompute="selective"), s)
    assert meter.bytes == pred + b * s * (heads + 4) * 4


def test_bad_cluster_sizes_are_refused_at_once_in_the_callers_words() -> None:
    """nodes=0 names nodes (not nics_per_node, which the caller never passed); a billion nodes is refused
    before any enumeration; a NaN shape does not slip past a `<= 0` check."""
    with pytest.raises(PlanError, match=r"^nodes=0 must be at least 1"):
        plan("llama3-70b", nodes=0)
    t0 = time.perf_counter()
    with pytest.raises(PlanError, match=r"nodes=1000000000 x gpus_per_node=8 = 8,000,000,000 GPUs.*fewer nodes"):
        plan("llama3-70b", nodes=10**9)
    assert time.perf_counter() - t0 < 5
    with pytest.raises(ValueError, match=r"hidden=nan: every shape must be a whole number"):
        ModelSpec("x", 2, float("nan"), 2, 2, 8, 10)  # type: ignore[arg-type]
    with pytest.raises(PlanError, match=r"utilisation=nan is a share"):
        plan("llama3-70b", utilisation=float("nan"))


def test_plan_and_a_cluster_spec_refuse_more_gpus_than_predict_takes_in_one_line() -> None:
    """One bound, theory/cluster.MAX_RANKS, for plan(), ClusterSpec, predict() and the plan panel. Before:
    plan("llama3-8b", nodes=2**17) planned 1,048,576 GPUs (60 layouts, labelled predicted) where predict()
    refused more than 65,536 ranks."""
    with pytest.raises(PlanError, match=rf"^nodes=131072 x gpus_per_node=8 = 1,048,576 GPUs is more than the "
                                        rf"{MAX_RANKS:,} the kit plans and predicts \(.*\): give fewer nodes "
                                        rf"\(at most 8,192 of 8 GPUs\)$") as e:
        plan("llama3-8b", nodes=2**17)
    assert isinstance(e.value, ConfigError) and "\n" not in str(e.value)
    with pytest.raises(ConfigError, match=rf"^nodes=4097 x gpus_per_node=16 = 65,552 GPUs is more than the {MAX_RANKS:,}"):
        cluster_spec(MAX_NODES + 1, MAX_GPUS_PER_NODE)
    with pytest.raises(ConfigError, match=r"give fewer GPUs per node"):  # a ClusterSpec by hand, for plan(cluster=)
        replace(cluster_spec(1, 8), gpus_per_node=2**20)
    assert plan("llama3-8b", nodes=MAX_NODES, gpus_per_node=MAX_GPUS_PER_NODE).cluster.world == MAX_RANKS


@pytest.mark.parametrize("kw, words", [
    (dict(utilisation=52), r"utilisation=52 is a share of the peak FLOP/s, between 0 and 1"),
    (dict(seq_len=0), r"^seq_len=0 must be at least 1, or seq_len=None for the model's own$"),
    (dict(global_batch=-3), r"^global_batch=-3 must be at least 1, or global_batch=None for 4M tokens$"),
    (dict(precision="fp8"), r"precision='fp8' is not one of \('bf16', "),
    (dict(recompute="sel"), r"recompute='sel' is not one of \('none', 'selective', 'op', 'full'\)"),
])
def test_bad_arguments_name_the_value_and_what_to_use(kw: dict, words: str) -> None:
    with pytest.raises(PlanError, match=words):
        plan("llama3-70b", **kw)


@pytest.mark.parametrize("kw, error, words", [
    (dict(nodes="2"), TypeError, r"nodes='2' is a str; write nodes=2 without quotes"),
    (dict(nodes=2.0), TypeError, r"nodes=2.0 is a float; write nodes=2"),
    (dict(nodes=None), TypeError, r"nodes=None is None; give a whole number such as nodes=2"),
    (dict(nodes=True), TypeError, r"nodes=True is a bool; give a whole number"),
    (dict(gpus_per_node="8"), TypeError, r"gpus_per_node='8' is a str; write gpus_per_node=8"),
    (dict(seq_len=4096.0), TypeError, r"seq_len=4096.0 is a float; write seq_len=4096 .*seq_len=None for the model's own"),
    (dict(global_batch=1.5), TypeError, r"global_batch=1.5 is a float; give a whole number"),
    (dict(tp="2"), TypeError, r"tp='2' is a str; write tp=2 without quotes, or tp=None to try every value"),
    (dict(micro_batch=False), TypeError, r"micro_batch=False is a bool"),
    (dict(tp=0), PlanError, r"tp=0 must be at least 1, or tp=None to try every value"),
    (dict(zero="1"), TypeError, r"zero='1' is a str; write zero=1"),
    (dict(zero=5), PlanError, r"zero=5 must be 0, 1, 2 or 3"),
    (dict(utilisation="0.5"), TypeError, r"utilisation='0.5' is a str; give a number between 0 and 1"),
    (dict(utilisation=[0.5]), TypeError, r"utilisation=\[0.5\] is a list"),
    (dict(accelerator=None), TypeError, r"accelerator=None is None; name a preset, e.g. accelerator='h100'"),
    (dict(precision=16), TypeError, r"precision=16 is an int; give its name as a str, e.g. precision='bf16'"),
    (dict(recompute=1), TypeError, r"recompute=1 is an int; .*recompute='selective'"),
    (dict(include_unfit="yes"), TypeError, r"include_unfit='yes' is a str; write True or False"),
    (dict(cluster="h100"), TypeError, r"cluster='h100' is a str; give a ClusterSpec .*accelerator="),
])
def test_wrong_types_are_refused_up_front_saying_the_fix(kw: dict, error: type, words: str) -> None:
    """Each wrong type is refused before any arithmetic, naming the value and the fix: never a TypeError from
    deep inside ('<' not supported between 'str' and 'int'), and never a silent int(1.5)."""
    with pytest.raises(error, match=words):
        plan("llama3-8b", **kw)


def test_a_model_that_is_neither_a_name_nor_a_spec_lists_the_presets() -> None:
    with pytest.raises(TypeError, match=r"model=7 is an int; give a preset name \(gpt2, .*llama3-8b.*\) or a ModelSpec"):
        plan(7)  # type: ignore[arg-type]


def test_integers_of_other_types_are_accepted() -> None:
    """numpy's integers are whole numbers (numbers.Integral): the same plan as with int."""
    np = pytest.importorskip("numpy")
    assert [x.name() for x in plan("llama3-8b", nodes=np.int64(2), tp=np.int32(2))][:5] == \
        [x.name() for x in plan("llama3-8b", nodes=2, tp=2)][:5]


def test_async_tp_hides_tensor_parallel_collectives_behind_their_matmuls() -> None:
    """TP's collectives are on the critical path unless the layout overlaps them (async TP): then
    only the first of tp steps, or what the matmuls cannot cover, is exposed, and the matmuls the rest
    runs beside are slowed by it (theory/overlap.py)."""
    c = cluster_spec(nodes=8)
    pc = ParallelConfig(tp=8, pp=4, dp=2, micro_batch=4, micro_batches=128, zero=1, recompute="none")
    m = MODELS["llama3-70b"]
    plain, overlapped = step_time(m, pc, c, 4096), step_time(m, replace(pc, tp_overlap=True), c, 4096)
    slow = c.accelerator.overlap_slowdown
    rest = plain.tp_s * 7 / 8
    assert overlapped.tp_s == pytest.approx(plain.tp_s / 8 + rest * slow / (1 + slow))
    assert overlapped.step_s < plain.step_s
    assert plan("llama3-70b", nodes=8, seq_len=4096, tp=8, zero=1, tp_overlap=True)[0].config.tp_overlap


def test_a_context_parallel_layout_names_the_group_its_gradients_are_sharded_over() -> None:
    """With cp > 1 the gradients are reduced (and ZeRO shards) over dp x cp, so the explanation says so rather
    than "dp=1 ZeRO-2", which reads as sharding over one GPU."""
    p = plan("llama3-8b", nodes=1, gpus_per_node=8)
    cp_layouts = [x for x in p if x.config.cp > 1 and x.config.dp * x.config.cp > 1]
    assert cp_layouts, "expected a context-parallel layout among the 8-GPU plans"
    for x in cp_layouts[:5]:
        assert f"dp x cp = {x.config.dp} x {x.config.cp}" in x.why and f"dp={x.config.dp} " not in x.why


@pytest.mark.parametrize("kw, words", [
    # before: "tp x pp x dp x cp = 64 GPUs is larger than the cluster's 8" and nothing on what to change
    (dict(nodes=1, tp=4, pp=4, dp=4), r"= 64 GPUs is larger than the cluster's 8: fix degrees whose product "
                                      r"divides 8 \(leave dp=None.*nodes=8 or more"),
    # before: "no layout is possible: tp x pp x dp x cp = 4 does not use the cluster's 8 GPUs"
    (dict(nodes=1, tp=2, pp=2, dp=1, cp=1), r"^tp=2 x pp=2 x dp=1 x cp=1 = 4 uses 4 of the cluster's 8 GPUs.*"
                                            r"leave dp=None and dp fills the cluster \(dp=2 here\)"),
    # before: "the fixed degrees do not divide the cluster's 8 GPUs", naming none of them
    (dict(nodes=1, tp=2, dp=3), r"^tp=2 x dp=3 = 6 does not divide the cluster's 8 GPUs.*one of \[1, 2, 4, 8\]"),
])
def test_degrees_that_do_not_multiply_to_the_cluster_say_which_and_what_to_change(kw: dict, words: str) -> None:
    with pytest.raises(PlanError, match=words):
        plan("llama3-8b", **kw)


@pytest.mark.parametrize("kw, words", [
    (dict(gpu_per_node=8), r"no keyword gpu_per_node= \(did you mean gpus_per_node=\?\); its keywords: model, "),
    (dict(utilization=0.4), r"no keyword utilization= \(did you mean utilisation="),
    (dict(micro_batches=4), r"micro_batches \(the count per step\) follows from global_batch / \(dp x micro_batch\)"),
    (dict(seqlen=4096), r"did you mean seq_len=4096\?"),
])
def test_a_misspelt_keyword_names_the_one_meant(kw: dict, words: str) -> None:
    """A misspelt or borrowed keyword gets the one meant and what to write, not Python's bare
    "plan() got an unexpected keyword argument 'gpu_per_node'"."""
    with pytest.raises(TypeError, match=words):
        plan("llama3-8b", **kw)


def test_plans_signature_lists_its_keywords_and_takes_no_others() -> None:
    """help(plan), `plan?` and tab completion read the signature. Before: it ended in `**unknown`, which a
    learner could read as "any keyword is taken", only for plan() to refuse every one of them."""
    params = inspect.signature(plan).parameters
    assert not [p for p in params.values() if p.kind is inspect.Parameter.VAR_KEYWORD]
    assert list(params)[:3] == ["model", "nodes", "gpus_per_node"] and "tp_overlap" in params
    assert "**unknown" not in pydoc.render_doc(plan)
    with pytest.raises(TypeError, match=r"^plan\(\) has no keyword gpu_per_node= \(did you mean gpus_per_node=\?\)"):
        plan("llama3-8b", gpu_per_node=8)


def test_an_unknown_model_or_gpu_says_what_to_write() -> None:
    with pytest.raises(ValueError, match=r"unknown model 'llama3_70b' \(did you mean 'llama3-70b'\?\): presets"):
        plan("llama3_70b")
    with pytest.raises(ValueError, match=r"unknown model 'gpt3': presets"):  # not sent to gpt2, a model 1000x smaller
        plan("gpt3")
    with pytest.raises(ValueError, match=r"'h200': known a100, h100\. For another GPU, plan on a ClusterSpec"):
        plan("llama3-8b", accelerator="h200")
    # the recipe that message gives works
    from dataclasses import replace
    from kit.experiments.theory.accelerators import Accelerator
    from kit.experiments import cluster_spec
    h200 = replace(cluster_spec(2, 8, "h100"), accelerator=Accelerator("H200", {"bf16": 989.0}, 4800.0, 141.0))
    assert plan("llama3-70b", cluster=h200, seq_len=4096)[0].memory_gib > 80  # uses the 141 GiB


def test_a_plan_shown_in_a_notebook_is_a_few_lines() -> None:
    """A cell ending in `p` showed the dataclass repr: every layout, about 900,000 characters for this plan."""
    p = plan("llama3-70b", nodes=128, seq_len=4096)
    text = repr(p)
    assert len(text) < 500, len(text)
    assert text.startswith("<Plan (predicted) for llama3-70b on 128 x 8 H100 SXM, seq 4096: ")
    assert f"{sum(x.fits for x in p)} of {p.considered} layouts fit; best {p[0].name()}" in text
    assert "p.describe()" in text and "p.table(" in text
    # and `p[0]` shows the numbers, labelled predicted, not only the degrees (`Layout(config=ParallelConfig(...))`)
    best = p[0]
    assert repr(best) == (f"<Layout {best.name()}: {best.memory_gib:.1f} GiB, {best.step_s:.2f} s per step, MFU "
                          f"{best.mfu:.1%} (predicted); .config, .why, .memory.text()>")
    # a plan where nothing fits points at no p[0] (it raises IndexError) but at the smallest and describe()
    none = plan("llama3-70b", nodes=1)
    assert repr(none) == (f"<Plan (predicted) for llama3-70b on 1 x 8 H100 SXM, seq 8192: none of {none.considered} "
                          f"layouts fit; the smallest, {none.smallest.name()}, needs {none.smallest.memory_gib:.1f} GiB "
                          "per GPU. print(p.describe()) says what to change>") and len(none) == 0


@pytest.mark.parametrize("kw, words", [
    (dict(model="llama-70b"), r"unknown model 'llama-70b' \(did you mean 'llama3-70b'\?\).*panel's menu takes"),
    (dict(accelerator="h200"), r"accelerator='h200': the panel knows h100, a100; another GPU is plan\(model, "
                               r"cluster=ClusterSpec"),
    (dict(nodes=100000), r"nodes=100000: the panel's box takes a whole number from 1 to 4,096"),
    (dict(nodes=0), r"nodes=0: the panel's box takes"),
])
def test_the_plan_panel_refuses_what_its_menus_and_boxes_cannot_show(kw: dict, words: str) -> None:
    """A model or GPU the menu lacks, or a count outside a box's range, is refused naming the value and the
    choices or range: never ipywidgets' `TraitError: Invalid selection: value not found`, and never a box
    that quietly clamps nodes=100000 to its maximum, 4,096."""
    pytest.importorskip("ipywidgets")
    from kit.widgets import PlanPanel
    with pytest.raises(ValueError, match=words):
        PlanPanel(**kw)
    assert PlanPanel(model="Llama3-8B", accelerator="A100").plan.model.name == "llama3-8b"  # as plan() spells
