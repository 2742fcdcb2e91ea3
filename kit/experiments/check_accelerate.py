"""Check strategy="accelerate" against DDP and the single process: parameters after N steps.

Worker side, run on a test's gloo ranks (kit.experiments.local.run_local). Same protocol as
check_sharding.params_after_steps: every rank takes its contiguous 1/N of each global batch,
so Accelerate's DDP must end where torch's DDP and one process on the whole batch end.
"""
from __future__ import annotations

from typing import Any

import torch
import torch.distributed as dist

from kit.experiments.check_sharding import params_after_steps
from kit.experiments.config import ExperimentConfig
from kit.experiments.hf_accelerate import AccelerateStrategy
from kit.experiments.sharding import full_params
from kit.experiments.timing import StepClock
from kit.experiments.workloads import build_workload

__all__ = ["accelerate_params_after_steps", "compare_many"]


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


def compare_many(items: list[tuple[dict[str, Any], torch.Tensor, torch.Tensor]]) -> list[dict[str, Any]]:
    """Each config in one process group: accelerate here, the others through check_sharding."""
    out = []
    for cfg, x, y in items:
        fn = accelerate_params_after_steps if cfg["strategy"] == "accelerate" else params_after_steps
        out.append(fn(cfg, x, y))
        dist.barrier()
    return out
