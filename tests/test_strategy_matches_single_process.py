"""Every strategy gives the single-process loss and gradients for the same global batch.

Two gloo ranks run all the strategy checks in one spawn (starting processes is the slow part);
the reference runs here, in one process.

Tolerance: rtol=1e-4, atol=1e-6. The strategies compute the same fp32 sums in a different
order (batch split in shards or micro-batches, then an all-reduce or autograd's accumulation
of clones); fp32 has eps ~1.2e-7 and the longest reductions here are ~10^3 terms, so
reordering errors stay well below 1e-4 relative. A wrong scale (a missing /world_size or
/micro_batches) is an error of 50% or more, and a missing shard changes gradients at the
10% level: either fails this check by orders of magnitude.
"""
from __future__ import annotations

import pytest
import torch

from kit.experiments.harness.grads_vs_single import reference_grads
from kit.experiments.config import ExperimentConfig
from kit.experiments.harness.local import run_each
from kit.experiments.measure.workloads import build_workload

RTOL, ATOL = 1e-4, 1e-6
TINY = dict(model_size="tiny", steps=1, warmup_steps=0, seed=3)

CASES = {
    "ddp": dict(strategy="ddp", workload="mlp", batch_size=8),
    "ddp_small_buckets_view": dict(strategy="ddp", workload="mlp", batch_size=8, bucket_cap_mb=0.01,
                                   gradient_as_bucket_view=True),
    "ddp_accum_no_sync": dict(strategy="ddp", workload="mlp", batch_size=4, grad_accum_steps=2),
    "ddp_virtual_link": dict(strategy="ddp", workload="mlp", batch_size=8, interconnect="10gbe"),
    "ddp_gpt_ckpt": dict(strategy="ddp", workload="gpt", batch_size=4, activation_checkpointing=True),
    "ddp_cnn_unused": dict(strategy="ddp", workload="cnn", batch_size=4, find_unused_parameters=True),
    "naive_dp": dict(strategy="naive_dp", workload="mlp", batch_size=8),
    "dp_emulated": dict(strategy="dp", workload="mlp", batch_size=8),
    "model_parallel": dict(strategy="model_parallel", workload="mlp", batch_size=16),
    "model_parallel_cnn": dict(strategy="model_parallel", workload="cnn", batch_size=8),
    "pipeline_gpipe": dict(strategy="pipeline", workload="mlp", batch_size=16, micro_batches=4),
    "pipeline_1f1b_gpt": dict(strategy="pipeline", workload="gpt", batch_size=8, micro_batches=4,
                              schedule="1f1b"),
}


def _global_batch(cfg: ExperimentConfig) -> tuple[torch.Tensor, torch.Tensor]:
    ds = build_workload(cfg.workload, cfg.model_size, seed=7, n_samples=cfg.global_batch_size).dataset
    return ds.x, ds.y


@pytest.fixture(scope="module")
def results() -> dict[str, tuple[dict, dict]]:
    cfgs = {k: ExperimentConfig(**TINY, **v) for k, v in CASES.items()}
    items = [(c.to_dict(), *_global_batch(c)) for c in cfgs.values()]
    per_rank = run_each("kit.experiments.harness.grads_vs_single:strategy_grads", 2, items)
    out = {}
    for i, (name, cfg) in enumerate(cfgs.items()):
        merged: dict[str, torch.Tensor] = {}
        losses = []
        for r in (0, 1):
            res = per_rank[r][i]
            merged.update(res["grads"])  # model/pipeline parallel: each rank holds its stage's grads
            if res["loss"] is not None:
                losses.append(res["loss"])
        ref = reference_grads(cfg.to_dict(), *items[i][1:])
        out[name] = ({"loss": losses, "grads": merged}, ref)
    return out


@pytest.mark.parametrize("name", list(CASES))
def test_strategy_matches_single_process(results: dict, name: str) -> None:
    got, ref = results[name]
    assert set(got["grads"]) == set(ref["grads"]), "every parameter's gradient must be somewhere"
    for loss in got["loss"]:
        assert loss == pytest.approx(ref["loss"], rel=RTOL)
    for k, g in ref["grads"].items():
        torch.testing.assert_close(got["grads"][k], g, rtol=RTOL, atol=ATOL, msg=lambda m: f"{name} {k}: {m}")


def test_reference_is_sensitive_to_the_batch() -> None:
    # Guard against a vacuous comparison: a different batch must give different gradients.
    cfg = ExperimentConfig(**TINY, **CASES["ddp"])
    x, y = _global_batch(cfg)
    a, b = reference_grads(cfg.to_dict(), x, y), reference_grads(cfg.to_dict(), x[:8], y[:8])
    assert any(not torch.allclose(a["grads"][k], b["grads"][k], rtol=RTOL, atol=ATOL) for k in a["grads"])
