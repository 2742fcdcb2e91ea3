"""Check strategy="accelerate" against DDP and the single process: parameters after N steps.

Worker side, run on a test's gloo ranks (kit.experiments.harness.local.run_local). Same protocol as
params_vs_ddp.params_after_steps: every rank takes its contiguous 1/N of each global batch,
so Accelerate's DDP must end where torch's DDP and one process on the whole batch end.
"""
from __future__ import annotations

from typing import Any

import torch
import torch.distributed as dist

from kit.experiments.harness.local import each
from kit.experiments.harness.params_vs_ddp import params_after_steps
from kit.experiments.config import ExperimentConfig
from kit.experiments.strategies.hf_accelerate import AccelerateStrategy
from kit.experiments.strategies.sharding import full_params
from kit.experiments.measure.timing import StepClock
from kit.experiments.measure.workloads import build_workload

__all__ = ["accelerate_params_after_steps", "params_after_steps_any", "loader_epochs", "check_all"]


def accelerate_params_after_steps(config: dict[str, Any], x: torch.Tensor, y: torch.Tensor) -> dict[str, Any]:
    cfg = ExperimentConfig.from_dict(config)
    wl = build_workload(cfg.workload, cfg.model_size, cfg.seed, n_samples=8)
    wl.dataset.close()
    strat = AccelerateStrategy(cfg, wl.model, wl.loss, torch.device("cpu"), StepClock(True))
    rank, world = dist.get_rank(), dist.get_world_size()
    g, losses, grads_agree = cfg.global_batch_size, [], True
    try:
        for s in range(cfg.steps):
            xs, ys = x[s * g:(s + 1) * g], y[s * g:(s + 1) * g]
            b = xs.shape[0] // world

            def probe() -> None:  # after backward, before the step: are the gradients averaged?
                nonlocal grads_agree
                flat = torch.cat([p.grad.reshape(-1) for p in strat.params])
                other = flat.clone()
                dist.broadcast(other, src=0)
                grads_agree = grads_agree and torch.equal(flat, other)
            # train_step returns the gathered (global) mean loss: gather_for_metrics at work
            losses.append(strat.train_step(xs[rank * b:(rank + 1) * b], ys[rank * b:(rank + 1) * b],
                                           probe=probe))
        return {"losses": losses, "params": full_params(strat.base), "grads_agree": grads_agree,
                "num_processes": strat.acc.num_processes, "notes": strat.notes}
    finally:
        strat.close()


def loader_epochs(n: int, batch_size: int, epochs: int = 2) -> list[list[int]]:
    """The sample indices this rank gets from the strategy's prepared loader, per epoch (the
    runner's loop: set_epoch, then iterate)."""
    from torch.utils.data import TensorDataset
    from kit.experiments.measure.workloads import make_loader
    cfg = ExperimentConfig(strategy="accelerate", model_size="tiny", world_size=dist.get_world_size())
    wl = build_workload("mlp", "tiny", 0, n_samples=8)
    wl.dataset.close()
    strat = AccelerateStrategy(cfg, wl.model, wl.loss, torch.device("cpu"), StepClock(False))
    try:
        loader = strat.prepare_loader(make_loader(TensorDataset(torch.arange(n)), batch_size, 0, 1, seed=1))
        out = []
        for e in range(epochs):
            loader.sampler.set_epoch(e)
            out.append([int(i) for (b,) in loader for i in b])
        return out
    finally:
        strat.close()


def check_all(items: list[tuple[dict[str, Any], torch.Tensor, torch.Tensor]], n: int,
              batch_size: int) -> tuple[list[dict[str, Any]], list[list[int]]]:
    """Every config's parameters and loader_epochs in one spawn (tests pay for one process group)."""
    return each(params_after_steps_any, items), loader_epochs(n, batch_size)


def params_after_steps_any(config: dict[str, Any], x: torch.Tensor, y: torch.Tensor) -> dict[str, Any]:
    """Accelerate here, every other strategy through params_vs_ddp."""
    fn = accelerate_params_after_steps if config["strategy"] == "accelerate" else params_after_steps
    return fn(config, x, y)
