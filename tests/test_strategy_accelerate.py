"""strategy="accelerate": Hugging Face Accelerate's loop on the kit's ranks.

- Parameters after 3 Adam steps equal DDP's and the single process's (rtol=1e-4, atol=1e-5, as in
  test_strategy_sharding_and_compression.py: reordered fp32 sums differ at ~1e-7; a missing average moves
  parameters by ~lr=1e-3). The returned losses are gather_for_metrics' global means.
- Tutorial code through Cluster.run (what a %%distributed cell runs): a plain Accelerator() on
  the kit's CPU ranks has num_processes == world_size and averages gradients; a second
  Accelerator(mixed_precision=...) fails in Accelerate and the kit's hint says what to do.
Skipped when accelerate is not installed (an optional extra: `.[accelerate]`).
"""
from __future__ import annotations

import importlib.util

import pytest
import torch

from kit.experiments.harness.params_vs_ddp import params_after_steps
from kit.experiments.config import ExperimentConfig, ExperimentConfigError
from kit.experiments.measure.workloads import build_workload

HAVE_ACCELERATE = importlib.util.find_spec("accelerate") is not None
needs_accelerate = pytest.mark.skipif(not HAVE_ACCELERATE,
                                      reason="accelerate not installed (pip install .[accelerate])")
STEPS = 3
BASE = dict(workload="mlp", model_size="tiny", steps=STEPS, warmup_steps=0, seed=3, batch_size=8)


@pytest.fixture(scope="module")
def checked() -> dict:
    from kit.experiments.harness.local import run_local
    cases = {"ddp": dict(strategy="ddp"), "accelerate": dict(strategy="accelerate"),
             "accelerate_gpt": dict(strategy="accelerate", workload="gpt", batch_size=4),
             "ddp_bf16": dict(strategy="ddp", precision="bf16"),
             "accelerate_bf16": dict(strategy="accelerate", precision="bf16")}
    cfgs = {k: ExperimentConfig(**{**BASE, **v}) for k, v in cases.items()}
    items = []
    for c in cfgs.values():
        ds = build_workload(c.workload, c.model_size, seed=7, n_samples=c.global_batch_size * STEPS).dataset
        items.append((c.to_dict(), ds.x, ds.y))
    got = run_local("kit.experiments.harness.accelerate_vs_ddp:check_all", 2, items, 40, 4, threads_per_rank=1)
    per_rank = {r: got[r][0] for r in got}
    out = {}
    for i, (name, cfg) in enumerate(cfgs.items()):
        single = cfg.replace(strategy="single", world_size=1, batch_size=cfg.global_batch_size)
        out[name] = (per_rank[0][i], per_rank[1][i], params_after_steps(single.to_dict(), *items[i][1:]))
    out["loader"] = {r: got[r][1] for r in got}
    return out


@needs_accelerate
def test_prepared_loader_shards_once_and_reshuffles(checked: dict) -> None:
    # 40 samples, batch 4 per rank: Accelerate hands rank r the batches r, r+2, ... of one
    # seeded permutation, so the ranks together read every sample once per epoch.
    ep = checked["loader"]
    for e in range(2):
        assert sorted(ep[0][e] + ep[1][e]) == list(range(40))
    assert ep[0][0] != ep[0][1]  # set_epoch reached the sampler inside Accelerate's batch sampler


def test_already_sharded_loader_refused() -> None:
    from types import SimpleNamespace
    from kit.experiments.strategies.hf_accelerate import AccelerateStrategy  # imports accelerate only when used
    loader = SimpleNamespace(sampler=SimpleNamespace(num_replicas=2))
    with pytest.raises(ValueError, match="sharded twice"):
        AccelerateStrategy.prepare_loader(SimpleNamespace(), loader)


@needs_accelerate
@pytest.mark.parametrize("name, atol", [("accelerate", 1e-5), ("accelerate_gpt", 1e-4)])
def test_accelerate_equals_single_process(checked: dict, name: str, atol: float) -> None:
    r0, r1, ref = checked[name]
    assert r0["num_processes"] == 2 and r0["grads_agree"] and r1["grads_agree"]
    for k, p in ref["params"].items():  # gpt: atol 1e-4, the attention key bias (see sharding tests)
        torch.testing.assert_close(r0["params"][k], p, rtol=1e-4, atol=atol, msg=lambda m: f"{name} {k}: {m}")
        torch.testing.assert_close(r1["params"][k], r0["params"][k], rtol=0, atol=0)
    # gather_for_metrics: every rank returns the global batch's mean loss, the single process's.
    assert r0["losses"] == pytest.approx(ref["losses"], rel=1e-4)
    assert r1["losses"] == r0["losses"]


@needs_accelerate
def test_accelerate_equals_ddp(checked: dict) -> None:
    for k, p in checked["ddp"][0]["params"].items():
        torch.testing.assert_close(checked["accelerate"][0]["params"][k], p, rtol=1e-4, atol=1e-5)


@needs_accelerate
def test_accelerate_bf16_close_to_kit_bf16(checked: dict) -> None:
    # Accelerate's autocast covers forward only (the loss runs in fp32 outside it), the kit's the
    # loss too; both round activations to bf16 (~3 digits), so parameters agree to 10% of a step.
    acc, ddp = checked["accelerate_bf16"][0], checked["ddp_bf16"][0]
    assert "bf16" in " ".join(acc["notes"])
    for k, p in ddp["params"].items():
        torch.testing.assert_close(acc["params"][k], p, rtol=0, atol=1e-4)


TUTORIAL = """
import torch
from torch import nn
from accelerate import Accelerator
accelerator = Accelerator()                      # plain, as in Accelerate's tutorials
torch.manual_seed(0)
model = nn.Linear(4, 1)
opt = torch.optim.SGD(model.parameters(), lr=0.1)
data = torch.utils.data.TensorDataset(torch.randn(16, 4), torch.randn(16, 1))
loader = torch.utils.data.DataLoader(data, batch_size=4)
model, opt, loader = accelerator.prepare(model, opt, loader)
x, y = next(iter(loader))                        # rank r gets batch r
local = torch.autograd.grad(nn.functional.mse_loss(model.module(x), y), model.module.weight)[0]
accelerator.backward(nn.functional.mse_loss(model(x), y))
mean_local = accelerator.gather(local[None]).mean(0)
(accelerator.num_processes, accelerator.device.type,
 bool(torch.allclose(model.module.weight.grad, mean_local, atol=1e-6)), x[0, 0].item())
"""


@needs_accelerate
def test_tutorial_accelerate_on_kit_ranks(cluster) -> None:
    res = cluster.run(TUTORIAL)
    assert res.ok, res.failures
    v = res.values
    assert v[0][:3] == (2, "cpu", True) and v[1][:3] == (2, "cpu", True)
    assert v[0][3] != v[1][3]  # different batches on the two ranks, yet the same averaged gradient

    # A second Accelerator with another precision fails inside Accelerate; the kit says what to do.
    res = cluster.run("Accelerator(mixed_precision='bf16')")
    assert not res.ok
    from kit.diagnose import hint
    text = hint(res.failures[0])
    assert text and "AcceleratorState._reset_state(reset_partial_state=True)" in text and "%dist restart" in text
    res = cluster.run("from accelerate.state import AcceleratorState\n"
                      "AcceleratorState._reset_state(reset_partial_state=True)\n"
                      "accelerator = Accelerator(mixed_precision='bf16')\n"
                      "(accelerator.num_processes, accelerator.mixed_precision)")
    assert res.ok and res.values[0] == (2, "bf16")

    # A lab-bench run on the same ranks leaves the learner's accelerator as it was.
    from kit.experiments import run
    rec = run(ExperimentConfig(strategy="accelerate", model_size="tiny", steps=3, warmup_steps=1,
                               dataset="memmap"), cluster=cluster)
    res = cluster.run("from accelerate.state import AcceleratorState\n"
                      "(accelerator.mixed_precision, AcceleratorState().mixed_precision)")
    assert res.ok and res.values[0] == ("bf16", "bf16")
    assert rec["complete"] and len(rec["steps"]) == 6
    row = rec["steps"][0]
    assert {"fwd_ms", "bwd_ms", "opt_ms", "comm_ms", "loss"} <= set(row) and row["comm_ms"] > 0
    assert rec["memory"] and rec["memory"][0]["params_mib"] > 0
    grads = 4 * sum(p.numel() for p in build_workload("mlp", "tiny").model.parameters())
    rep = rec["comm"]["report"]  # all_reduce of the gradients + gather_for_metrics of 2 x 32 fp32 losses
    assert {k: v["payload_bytes"] for k, v in rep["per_op"].items()} == {"all_reduce": grads, "all_gather": 256}
    assert rec["comm"]["bytes_per_step"] == grads + 256 and len(rep["gather_for_metrics_ms_by_step"]) == 5
    assert any("num_processes=2" in n and "set aside" not in n for n in rec["notes"])
    assert any("set aside" in n for n in rec["notes"])
    import matplotlib
    matplotlib.use("Agg")
    from kit.plots import memory_breakdown, step_breakdown
    assert step_breakdown([rec]).axes and memory_breakdown(rec).axes  # the existing plots draw it


@pytest.mark.parametrize("kw, words", [
    (dict(strategy="accelerate", compression="fp16"), "strategy='ddp'"),
    (dict(strategy="accelerate", grad_accum_steps=2), "not 'accelerate'"),
    (dict(strategy="accelerate", interconnect="10gbe"), "not 'accelerate'"),
])
def test_impossible_combinations_refused(kw: dict, words: str) -> None:
    with pytest.raises(ExperimentConfigError, match=words):
        ExperimentConfig(**kw)


def test_refused_before_the_ranks_start(monkeypatch: pytest.MonkeyPatch) -> None:
    from kit.experiments.config_rules import check_backend
    with pytest.raises(ExperimentConfigError, match="fp16.*bf16"):
        check_backend(ExperimentConfig(strategy="accelerate", precision="fp16"), "gloo", ExperimentConfigError)
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda n, *a: None if n == "accelerate" else real(n, *a))
    with pytest.raises(ExperimentConfigError, match=r"not installed; pip install \"distributed-kit\[accelerate\]\""):
        check_backend(ExperimentConfig(strategy="accelerate"), "gloo", ExperimentConfigError)
