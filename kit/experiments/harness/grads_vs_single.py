"""Check a strategy against the single-process reference: same loss, same gradients.

Worker side. `strategy_grads` runs one step of `config`'s strategy on the global batch (X, Y),
each rank taking the slice the strategy would get from its sampler, and returns the loss and
the gradients it holds, keyed by the full model's parameter names; `reference_grads` does the
same step in one process. Lessons and tests compare the two with `torch.testing.assert_close`.
"""
from __future__ import annotations

from typing import Any

import torch
import torch.distributed as dist

from kit.experiments.config import ExperimentConfig
from kit.experiments.choices import ONE_PROCESS, STAGED, VIRTUAL_LINK
from kit.experiments.strategies.registry import build_strategy
from kit.experiments.measure.timing import StepClock
from kit.experiments.measure.workloads import build_workload

__all__ = ["strategy_grads", "reference_grads"]


def _run(cfg: ExperimentConfig, x: torch.Tensor, y: torch.Tensor) -> dict[str, Any]:
    wl = build_workload(cfg.workload, cfg.model_size, cfg.seed, n_samples=8,
                        checkpointing=cfg.activation_checkpointing)
    wl.dataset.close()
    model = wl.model
    names = {id(p): n for n, p in model.named_parameters()}  # full-model names, before wrapping
    strat = build_strategy(cfg, model, wl.loss, torch.device("cpu"), StepClock(True))
    grads: dict[str, torch.Tensor] = {}

    def probe() -> None:  # called after backward, before the optimizer step
        for p in strat.params:
            grads[names[id(p)]] = p.grad.detach().clone()
    loss = strat.train_step(x, y, probe=probe)
    if cfg.strategy in STAGED:
        # Only the last stage knows the loss; share it so every rank returns the same number.
        t = torch.tensor([loss])
        dist.broadcast(t, src=dist.get_world_size() - 1)
        loss = t.item()
    return {"loss": loss, "grads": grads}


def strategy_grads(config: dict[str, Any], x: torch.Tensor, y: torch.Tensor) -> dict[str, Any]:
    cfg = ExperimentConfig.from_dict(config)
    rank = dist.get_rank()
    if cfg.strategy in ONE_PROCESS and rank != 0:
        return {"loss": None, "grads": {}}
    if cfg.strategy in VIRTUAL_LINK:
        b = x.shape[0] // cfg.world_size
        x, y = x[rank * b:(rank + 1) * b], y[rank * b:(rank + 1) * b]
        out = _run(cfg, x, y)
        t = torch.tensor([out["loss"]])
        dist.all_reduce(t)  # each rank's loss is its shard's mean; the global mean is their mean
        out["loss"] = t.item() / cfg.world_size
        return out
    return _run(cfg, x, y)


def reference_grads(config: dict[str, Any], x: torch.Tensor, y: torch.Tensor) -> dict[str, Any]:
    cfg = ExperimentConfig.from_dict(config).replace(strategy="single", world_size=1, grad_accum_steps=1, virtual_stages=1,
                                                     find_unused_parameters=False, interconnect=None,
                                                     link_alpha_us=None, link_gbps=None)
    return _run(cfg, x, y)
