"""Built-in workloads: the kit's models (kit/experiments/models.py) with their data (no downloads).

Data is generated from a fixed "teacher" so the loss actually falls, and it goes through a real
`Dataset` -> `DistributedSampler` -> `DataLoader`, like a real run. Also what a run measures about a
model's blocks: the cut into pipeline stages and each block's cost.
"""
from __future__ import annotations

import math
import os
import tempfile
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from torch import nn
from torch.utils.data import DataLoader, Dataset, DistributedSampler

from kit.experiments.choices import GPT_SEQ
from kit.experiments.models import CLASSES, IMG, MLP_IN, VOCAB, build_model
from kit.experiments.theory.bubble import split_min_max
from kit import _renamed

__all__ = ["Workload", "build_workload", "split_stages", "make_loader", "sample_input", "block_costs_ms"]
__getattr__ = _renamed.renamed_getattr(__name__)  # this release's old names, for one release


@dataclass
class Workload:
    name: str
    model: nn.Sequential
    dataset: Dataset

    def loss(self, out: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        # Mean over samples (and tokens), so equal shards of a batch average to the global loss.
        return nn.functional.cross_entropy(out.reshape(-1, out.shape[-1]).float(), y.reshape(-1))


class TeacherDataset(Dataset):
    """n samples labelled by a fixed random teacher, held in RAM or in a memory-mapped file."""

    def __init__(self, workload: str, n: int, seed: int, memmap: bool = False):
        g = torch.Generator().manual_seed(10_000 + seed)
        if workload == "gpt":
            # A random bigram chain: learnable, so the loss falls below log(VOCAB). Each next token is drawn
            # by inverse CDF (the first token whose cumulative probability reaches a uniform number): the same
            # distribution as torch.multinomial, which spent 0.2-0.5 s of CPU on 1024 samples, on every rank at
            # every run's start (a fifth of lesson 04's CPU); this takes 9 ms.
            cdf = torch.softmax(torch.randn(VOCAB, VOCAB, generator=g) * 3, dim=-1).cumsum(dim=-1)
            tok = torch.empty(n, GPT_SEQ + 1, dtype=torch.long)
            tok[:, 0] = torch.randint(0, VOCAB, (n,), generator=g)
            u = torch.rand(GPT_SEQ, n, 1, generator=g)  # u[t] contiguous: searchsorted copies a strided one
            for t in range(GPT_SEQ):  # clamp: a u above the last cumulative sum's rounding picks the last token
                tok[:, t + 1] = torch.searchsorted(cdf[tok[:, t]], u[t]).squeeze(1).clamp_(max=VOCAB - 1)
            x, y = tok[:, :-1].contiguous(), tok[:, 1:].contiguous()
        else:
            shape = (MLP_IN,) if workload == "mlp" else (3, IMG, IMG)
            x = torch.randn(n, *shape, generator=g)
            teacher = torch.randn(math.prod(shape), CLASSES, generator=g)
            y = (x.reshape(n, -1) @ teacher).argmax(1)
        self.path: str | None = None
        if memmap:
            # Write once to a temp file and read back through np.memmap: the OS page cache,
            # not Python memory, now holds the data (how large datasets are usually read).
            fd, self.path = tempfile.mkstemp(prefix="kit-data-", suffix=".npy")
            os.close(fd)
            arr = np.lib.format.open_memmap(self.path, mode="w+", dtype=x.numpy().dtype, shape=tuple(x.shape))
            arr[:] = x.numpy()
            arr.flush()
            self.x_mm = np.load(self.path, mmap_mode="r")
            self.x: torch.Tensor | None = None
        else:
            self.x = x
        self.y = y

    def __len__(self) -> int:
        return len(self.y)

    def __getitem__(self, i: int) -> tuple[torch.Tensor, torch.Tensor]:
        if self.x is None:
            return torch.from_numpy(np.array(self.x_mm[i])), self.y[i]
        return self.x[i], self.y[i]

    def close(self) -> None:
        if self.path and os.path.exists(self.path):
            os.unlink(self.path)


def build_workload(name: str, model_size: str = "small", seed: int = 0, *, n_samples: int = 1024,
                   checkpointing: bool = False, memmap: bool = False) -> Workload:
    """The model (seeded: every rank builds the same weights; kit/experiments/models.py) and its dataset."""
    model = build_model(name, model_size, seed, checkpointing)
    return Workload(name, model, TeacherDataset(name, n_samples, seed, memmap))


def split_stages(model: nn.Sequential, n: int, costs: list[float] | None = None) -> list[list[int]]:
    """Cut the blocks into n contiguous stages minimising the largest stage's cost.

    `costs`: one number per block (measured seconds, see pipeline_cost.block_costs_ms); by
    default the parameter count. Why min-max and not "fill to total/n": a pipeline runs at the
    pace of its slowest stage, and greedy filling split the small MLP 2.36 M / 1.06 M.
    """
    k = len(model)
    if n > k:
        raise ValueError(f"cannot split {k} blocks into {n} stages; use world_size <= {k}")
    sizes = list(costs) if costs is not None else [float(sum(p.numel() for p in b.parameters()) + 1) for b in model]
    return split_min_max(sizes, n)


def sample_input(name: str, batch: int) -> torch.Tensor:
    """A random input batch shaped like the workload's data (for timing blocks)."""
    if name == "gpt":
        return torch.randint(0, VOCAB, (batch, GPT_SEQ))
    return torch.randn(batch, MLP_IN) if name == "mlp" else torch.randn(batch, 3, IMG, IMG)


def block_costs_ms(model: nn.Sequential, x: torch.Tensor, reps: int = 5) -> list[float]:
    """Forward + backward time of each block on input `x` (fastest of `reps`), in ms.

    The minimum, not the mean: on a shared machine noise only ever adds time, and a noisy
    cost would move the cut from run to run.

    Why measure: parameters are a poor proxy for compute (a conv block has few parameters and
    many FLOPs; an embedding many parameters and no matmul), and a pipeline runs at the pace
    of its slowest stage.
    """
    import time
    costs = []
    h = x
    for block in model:
        times = []
        for _ in range(reps + 1):  # +1: the first call pays allocation and kernel selection
            inp = h.detach().requires_grad_(h.is_floating_point())
            if h.is_cuda:
                torch.cuda.synchronize()  # time the device's work, not the enqueue
            t0 = time.perf_counter()
            out = block(inp)
            out.float().sum().backward()
            if h.is_cuda:
                torch.cuda.synchronize()
            times.append((time.perf_counter() - t0) * 1e3)
        costs.append(min(times[1:]))
        with torch.no_grad():
            h = block(h)
    model.zero_grad(set_to_none=True)
    return costs


def make_loader(dataset: Dataset, batch_size: int, rank: int, num_replicas: int, seed: int) -> Any:
    """DataLoader over this rank's shard; call `.sampler.set_epoch(e)` each epoch to reshuffle."""
    sampler = DistributedSampler(dataset, num_replicas=num_replicas, rank=rank, shuffle=True,
                                 seed=seed, drop_last=True)
    # num_workers=0: loader processes would fight the ranks for this machine's few cores.
    return DataLoader(dataset, batch_size=batch_size, sampler=sampler, drop_last=True, num_workers=0)
