"""zero1, fsdp and DDP gradient compression train what DDP and the single process train.

Two gloo ranks run every config in one spawn; the single-process reference runs here.
Check: parameters after STEPS Adam steps on the same consecutive global batches.

Tolerances:
- exact strategies (ddp, zero1, fsdp, PowerSGD before its warm-up ends): rtol=1e-4, atol=1e-5.
  The same fp32 sums in another order (shards, reduce-scatter vs all-reduce) differ at ~1e-7
  relative; Adam divides by sqrt(v), which can amplify that for near-zero gradients, but each
  step moves a parameter by at most lr=1e-3, so 1e-5 absolute is 1% of one step. A wrong
  shard, a missing /N or a skipped update moves parameters by ~lr: 100x the tolerance.
- gpt: atol=1e-4. Attention's key bias gets a zero gradient in exact arithmetic (softmax is
  shift-invariant per query), so its gradient is pure rounding noise and Adam's m/sqrt(v) turns
  noise into steps of up to lr whose sign depends on summation order (seen: 3e-5). 1e-4 is still
  10% of one step; a real error moves every parameter.
- fp16 compression: atol=1e-4 (fp16 keeps ~3 decimal digits of each gradient; 10% of a step).
"""
from __future__ import annotations

import pytest
import torch

from kit.experiments.harness.params_vs_ddp import params_after_steps
from kit.experiments.config import ExperimentConfig, ExperimentConfigError
from kit.experiments.harness.local import run_each
from kit.experiments.measure.workloads import build_workload

STEPS = 3
BASE = dict(model_size="tiny", steps=STEPS, warmup_steps=0, seed=3, batch_size=8)
CASES = {
    "ddp": dict(strategy="ddp", workload="mlp"),
    "zero1": dict(strategy="zero1", workload="mlp"),
    "ddp_gpt": dict(strategy="ddp", workload="gpt", batch_size=4),
    "zero1_gpt": dict(strategy="zero1", workload="gpt", batch_size=4),
    "fsdp_zero3": dict(strategy="fsdp", workload="mlp"),
    "fsdp_zero2": dict(strategy="fsdp", workload="mlp", reshard_after_forward=False),
    "fsdp_gpt": dict(strategy="fsdp", workload="gpt", batch_size=4),
    "ddp_fp16": dict(strategy="ddp", workload="mlp", compression="fp16"),
    "ddp_fp16_link": dict(strategy="ddp", workload="mlp", compression="fp16", interconnect="10gbe"),
    "ddp_powersgd_warmup": dict(strategy="ddp", workload="mlp", compression="powersgd",
                                start_powerSGD_iter=STEPS + 1),
    "ddp_powersgd": dict(strategy="ddp", workload="mlp", compression="powersgd", start_powerSGD_iter=2),
}
EXACT = ("ddp", "ddp_gpt", "zero1", "zero1_gpt", "fsdp_zero3", "fsdp_zero2", "fsdp_gpt", "ddp_powersgd_warmup")


def _data(cfg: ExperimentConfig) -> tuple[torch.Tensor, torch.Tensor]:
    ds = build_workload(cfg.workload, cfg.model_size, seed=7, n_samples=cfg.global_batch_size * STEPS).dataset
    return ds.x, ds.y


@pytest.fixture(scope="module")
def results() -> dict[str, tuple[dict, dict]]:
    cfgs = {k: ExperimentConfig(**{**BASE, **v}) for k, v in CASES.items()}
    items = [(c.to_dict(), *_data(c)) for c in cfgs.values()]
    per_rank = run_each("kit.experiments.harness.params_vs_ddp:params_after_steps", 2, items)
    out = {}
    for i, (name, cfg) in enumerate(cfgs.items()):
        single = cfg.replace(strategy="single", world_size=1, compression="none", interconnect=None,
                             reshard_after_forward=True, batch_size=cfg.global_batch_size)
        ref = params_after_steps(single.to_dict(), *items[i][1:])
        out[name] = (per_rank[0][i], per_rank[1][i], ref)
    return out


@pytest.mark.parametrize("name", EXACT)
def test_parameters_match_single_process(results: dict, name: str) -> None:
    r0, r1, ref = results[name]
    assert set(r0["params"]) == set(ref["params"])
    atol = 1e-4 if "gpt" in name else 1e-5
    for k, p in ref["params"].items():
        torch.testing.assert_close(r0["params"][k], p, rtol=1e-4, atol=atol, msg=lambda m: f"{name} {k}: {m}")
        torch.testing.assert_close(r1["params"][k], r0["params"][k], rtol=0, atol=0)  # replicas agree exactly
    assert r0["losses"] == pytest.approx(ref["losses"], rel=1e-4)


def test_sharded_equal_ddp(results: dict) -> None:
    for ref, name, atol in (("ddp", "zero1", 1e-5), ("ddp", "fsdp_zero3", 1e-5), ("ddp", "fsdp_zero2", 1e-5),
                            ("ddp_gpt", "zero1_gpt", 1e-6), ("ddp_gpt", "fsdp_gpt", 1e-4)):
        # zero1 all-reduces gradients through DDP itself: the same sums, so nearly bit-equal.
        for k, p in results[ref][0]["params"].items():
            torch.testing.assert_close(results[name][0]["params"][k], p, rtol=1e-4, atol=atol,
                                       msg=lambda m: f"{name} vs {ref} {k}: {m}")


@pytest.mark.parametrize("name", ["ddp_fp16", "ddp_fp16_link"])
def test_fp16_compression_close_to_ddp(results: dict, name: str) -> None:
    ddp = results["ddp"][0]["params"]
    for k, p in ddp.items():
        torch.testing.assert_close(results[name][0]["params"][k], p, rtol=0, atol=1e-4)


def test_powersgd_compresses_after_warmup(results: dict) -> None:
    # After warm-up the update is low-rank: parameters leave DDP's, but stay finite and within
    # the 2 compressed Adam steps (at most lr=1e-3 each) of them.
    ddp, got = results["ddp"][0]["params"], results["ddp_powersgd"][0]["params"]
    diffs = [float((got[k] - p).abs().max()) for k, p in ddp.items()]
    assert max(diffs) > 1e-6, "PowerSGD after warm-up should change the update"
    assert max(diffs) <= 2 * 1e-3 + 1e-5
    assert all(torch.isfinite(t).all() for t in got.values())


def test_reference_is_sensitive_to_steps() -> None:
    # Guard against a vacuous check: one step fewer must give different parameters.
    cfg = ExperimentConfig(**{**BASE, "strategy": "single", "world_size": 1})
    x, y = _data(cfg)
    a = params_after_steps(cfg.to_dict(), x, y)["params"]
    b = params_after_steps(cfg.replace(steps=STEPS - 1).to_dict(), x, y)["params"]
    # and a different batch split (the global batch size) must too
    c = params_after_steps(cfg.replace(batch_size=4).to_dict(), x, y)["params"]
    assert any(not torch.allclose(a[k], c[k], rtol=1e-4, atol=1e-5) for k in a)
    assert any(not torch.allclose(a[k], b[k], rtol=1e-4, atol=1e-5) for k in a)


@pytest.mark.parametrize("kw, words", [
    (dict(strategy="zero1", world_size=1), "nothing to shard"),
    (dict(strategy="fsdp", world_size=1), "nothing to shard"),
    (dict(strategy="fsdp", precision="fp16"), "bf16"),
    (dict(strategy="zero1", compression="fp16"), "strategy='ddp'"),
    (dict(strategy="ddp", reshard_after_forward=False), "FSDP knob"),
    (dict(strategy="ddp", compression="powersgd", start_powerSGD_iter=1), ">= 2"),
    (dict(strategy="ddp", compression="zip"), "not supported"),
])
def test_impossible_combinations_refused(kw: dict, words: str) -> None:
    with pytest.raises(ExperimentConfigError, match=words.replace("(", r"\(")):
        ExperimentConfig(**kw)


def test_bf16_compression_refused_on_gloo() -> None:
    # run() calls this with the cluster's backend before the ranks start the experiment; the
    # rank calls it again before registering the hook (torch itself raises a TypeError there).
    from kit.experiments.config_rules import check_backend
    cfg = ExperimentConfig(strategy="ddp", compression="bf16")
    with pytest.raises(ExperimentConfigError, match="bf16 compression is not supported on gloo/CPU"):
        check_backend(cfg, "gloo", ExperimentConfigError)
    for nccl in ("nccl", "cuda:nccl", "cpu:gloo,cuda:nccl"):  # NCCL, as torch may name it: allowed
        check_backend(cfg, nccl, ExperimentConfigError)


@pytest.mark.parametrize("name, gathers", [("fsdp_zero3", 2), ("fsdp_zero2", 1)])
def test_fsdp_bytes_counted_equal_the_prediction(results: dict, name: str, gathers: int) -> None:
    # ZeRO-3 gathers the parameters twice per step (forward, then again in backward), the
    # ZeRO-2-like mode once; both reduce-scatter the gradients once. S = fp32 parameter bytes.
    rep = results[name][0]["comm_report"]
    s = 4 * sum(p.numel() for p in results[name][2]["params"].values())
    assert rep["measured_payload_bytes_per_step"] == {"all_gather": gathers * s, "reduce_scatter": s}
    assert {op: d["payload_bytes"] for op, d in rep["per_op"].items()} == {"all_gather": gathers * s,
                                                                          "reduce_scatter": s}
    assert rep["wire_bytes_per_rank"] == pytest.approx((gathers + 1) * s / 2)  # (N-1)/N at N=2


def test_labels_name_the_new_knobs() -> None:
    assert ExperimentConfig(strategy="fsdp", reshard_after_forward=False).label() == "fsdp mlp bs32 fp32 zero2-like"
    assert ExperimentConfig(compression="powersgd", powersgd_rank=4, gradient_as_bucket_view=True).label() \
        == "ddp mlp bs32 fp32 bucket25MiB view powersgdr4"


def test_run_refuses_bf16_compression_before_starting_ranks() -> None:
    from kit.experiments import api
    with pytest.raises(ExperimentConfigError, match="bf16 compression is not supported on gloo/CPU"):
        api.run(ExperimentConfig(strategy="ddp", compression="bf16"), device="cpu")
    assert api._owned is None  # refused before any rank was started
