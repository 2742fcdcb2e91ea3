"""param_server: sync mode trains what the single process trains on the workers' batches
together; async mode applies each worker's gradient on arrival (staleness > 0 with 2 workers
and a straggler); refusals for impossible combinations.

Tolerance as in test_strategy_sharding_and_compression.py: rtol=1e-4, atol=1e-5 on parameters after 3 Adam
steps (reordered fp32 sums; a wrong average or a lost gradient moves parameters by ~lr=1e-3).
"""
from __future__ import annotations

import pytest
import torch

from kit.experiments.harness.params_vs_ddp import params_after_steps
from kit.experiments.config import ExperimentConfig, ExperimentConfigError
from kit.experiments.harness.local import run_each
from kit.experiments.measure.workloads import build_workload

STEPS = 3
BASE = dict(strategy="param_server", workload="mlp", model_size="tiny", steps=STEPS, warmup_steps=0,
            seed=3, batch_size=8)


def _items(world_size: int, cases: list[dict]) -> tuple[list, list[ExperimentConfig]]:
    cfgs = [ExperimentConfig(**{**BASE, **c, "world_size": world_size}) for c in cases]
    items = []
    for c in cfgs:
        ds = build_workload(c.workload, c.model_size, seed=7, n_samples=c.global_batch_size * STEPS).dataset
        items.append((c.to_dict(), ds.x, ds.y))
    return items, cfgs


def _single(cfg: ExperimentConfig, x: torch.Tensor, y: torch.Tensor) -> dict:
    ref = cfg.replace(strategy="single", world_size=1, ps_mode="sync", straggler_ms=0.0,
                      batch_size=cfg.global_batch_size)
    return params_after_steps(ref.to_dict(), x, y)


def _close(got: dict, ref: dict) -> None:
    for k, p in ref["params"].items():
        torch.testing.assert_close(got["params"][k], p, rtol=1e-4, atol=1e-5, msg=lambda m: f"{k}: {m}")


def test_two_ranks_sync_and_async_match_single_process() -> None:
    # One worker: async has nothing to be stale against, so both modes equal the reference.
    items, cfgs = _items(2, [dict(ps_mode="sync"), dict(ps_mode="async")])
    res = run_each("kit.experiments.harness.params_vs_ddp:params_after_steps", 2, items, threads_per_rank=1)
    for i, cfg in enumerate(cfgs):
        ref = _single(cfg, *items[i][1:])
        _close(res[0][i], ref)  # the server's weights
        _close(res[1][i], ref)  # the worker holds the same after its last pull
        assert res[0][i]["losses"] == pytest.approx(ref["losses"], rel=1e-4)
        rep = res[0][i]["comm_report"]
        assert rep["staleness_histogram"] == {"0": STEPS}
        assert rep["server_ingress_bytes_per_step"] == (rep["predicted"]["server_ingress_bytes_per_step"] + 8)


def test_three_ranks_sync_matches_single_async_is_stale() -> None:
    items, cfgs = _items(3, [dict(ps_mode="sync"), dict(ps_mode="async", straggler_ms=30.0)])
    res = run_each("kit.experiments.harness.params_vs_ddp:params_after_steps", 3, items, threads_per_rank=1)
    ref = _single(cfgs[0], *items[0][1:])
    _close(res[0][0], ref)
    rep = res[0][1]["comm_report"]
    assert rep["updates"] == 2 * STEPS
    assert sum(rep["staleness_histogram"].values()) == 2 * STEPS
    # Two workers sharing one server: every update after the first pair finds a newer version.
    assert any(int(k) > 0 for k in rep["staleness_histogram"])
    # Ingress grows with workers: two gradients per round, where a ring sends 2(N-1)/N*S = S per rank.
    s = 4 * sum(p.numel() for p in ref["params"].values())
    assert rep["server_ingress_bytes_per_step"] == pytest.approx(2 * (s + 8))


@pytest.mark.parametrize("kw, words", [
    (dict(world_size=1), "world_size >= 2"),
    (dict(ps_mode="hogwild"), "'sync' or 'async'"),
    (dict(straggler_ms=-1.0), ">= 0"),
    (dict(strategy="ddp", straggler_ms=5.0), "parameter-server knobs"),
    (dict(compression="fp16"), "strategy='ddp'"),
    (dict(interconnect="10gbe"), "delays DDP gradient buckets"),
])
def test_param_server_refusals(kw: dict, words: str) -> None:
    with pytest.raises(ExperimentConfigError, match=words):
        ExperimentConfig(**{**BASE, **kw})
