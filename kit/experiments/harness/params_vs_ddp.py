"""Check sharded and compressed training against DDP and the single process: parameters after
N optimizer steps on the same data.

Worker side. Gradients alone are not enough for ZeRO and FSDP: their point is a *different
optimizer step* (each rank updates its shard, then shares it), so the check compares the
parameters after the steps, gathered whole (`full_params`), keyed by the model's names.
"""
from __future__ import annotations

from typing import Any

import torch
import torch.distributed as dist

from kit.experiments.config import ExperimentConfig
from kit.experiments.choices import HAND_WRITTEN, RANK0_SERVES, SHARDS_DATA, STAGED
from kit.experiments.strategies.registry import build_strategy
from kit.experiments.strategies.sharding import full_params
from kit.experiments.measure.timing import StepClock
from kit.experiments.measure.workloads import build_workload

__all__ = ["params_after_steps", "DATA_PARALLEL"]

# Strategies whose ranks each take 1/N of every global batch (the parameter server's workers split it
# below; the hand-written parallelisms are checked against one process, parallel/'s check_*).
DATA_PARALLEL = tuple(s for s in SHARDS_DATA if s not in RANK0_SERVES + HAND_WRITTEN)


def params_after_steps(config: dict[str, Any], x: torch.Tensor, y: torch.Tensor) -> dict[str, Any]:
    """Train `config.steps` steps on consecutive global batches of x, y; return losses and params.

    Each rank slices its contiguous 1/N of every global batch (what DDP's sampler gives, up to
    the order of samples, which a mean loss does not see); `single` trains on the whole batch,
    and so do model_parallel and pipeline (every stage sees every sample; each rank returns the
    parameters of its stages).
    """
    cfg = ExperimentConfig.from_dict(config)
    wl = build_workload(cfg.workload, cfg.model_size, cfg.seed, n_samples=8)
    wl.dataset.close()
    strat = build_strategy(cfg, wl.model, wl.loss, torch.device("cpu"), StepClock(True))
    g = cfg.global_batch_size
    sharded = cfg.strategy in DATA_PARALLEL
    rank, world = (dist.get_rank(), dist.get_world_size()) if sharded else (0, 1)
    losses = []
    ps = cfg.strategy in RANK0_SERVES
    if ps:  # rank 0 serves: the workers 1..N-1 split each global batch
        rank, world = dist.get_rank() - 1, dist.get_world_size() - 1
    for s in range(cfg.steps):
        xs, ys = x[s * g:(s + 1) * g], y[s * g:(s + 1) * g]
        b = xs.shape[0] // world
        r = max(rank, 0)  # the server's slice is not used
        loss = strat.train_step(xs[r * b:(r + 1) * b], ys[r * b:(r + 1) * b])
        if ps:
            t = torch.tensor([loss])
            dist.broadcast(t, src=0)  # the server's loss is the workers' mean
            loss = t.item()
        elif cfg.strategy in STAGED:
            t = torch.tensor([loss])
            dist.broadcast(t, src=dist.get_world_size() - 1)  # only the last stage knows the loss
            loss = t.item()
        elif sharded:
            t = torch.tensor([loss])
            dist.all_reduce(t)  # mean of the shards' means = the global batch's mean
            loss = t.item() / world
        losses.append(loss)
    if strat.link:
        strat.link.close()
    if cfg.strategy in STAGED:  # each rank holds its stages' parameters, under the full model's names
        mine = {id(p) for p in strat.params}
        params = {n: p.detach().clone() for n, p in wl.model.named_parameters() if id(p) in mine}
    else:
        params = full_params(strat.base)
    out = {"losses": losses, "params": params}
    report = strat.comm_report()
    if report is not None:
        out["comm_report"] = report
    return out
