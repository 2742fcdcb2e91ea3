"""The contract between the run loop (runner.run_rank) and a strategy, with do-nothing defaults.

A strategy overrides only what it has: DDP its buckets, the sharded ones their memory formula,
pipelines their stage table. The run loop calls every hook on every strategy, so a new strategy
never needs the loop to learn about it (how to add one: docs/architecture.md, "Adding a strategy").
"""
from __future__ import annotations

from typing import Any, Callable, NamedTuple

import torch

__all__ = ["Strategy", "StageTable"]


class StageTable(NamedTuple):
    """What a strategy with stages (model and pipeline parallel) reports about them after a run."""

    busy_ms: list[list[float]]  # per timed step, every stage's busy ms (forward + backward)
    span_ms: list[float]  # per timed step, the global span: first start to last end on any stage
    stage: int  # this rank's stage (on a mesh: its rank along pp)
    p2p_bytes: int  # bytes this rank sent to its neighbour stages in the last step
    micro_batches: int  # per step (1: no pipeline)
    virtual_stages: int  # chunks per rank (interleaved 1F1B)


class Strategy:
    """What every strategy gives the run loop. Required: `train_step`, `params`, `opt`, `meter`
    (an ActivationMeter), `notes` and `bucket_bytes`, set by the subclass's `__init__`."""

    emulated = False  # True where the strategy stands in for hardware this machine lacks
    link: Any = None  # the virtual interconnect (measure/interconnect.py), closed after the run
    offset_ms = 0.0   # this rank's clock minus rank 0's (measure/clocks.py)
    params: list[torch.nn.Parameter]
    opt: torch.optim.Optimizer
    meter: Any
    notes: list[str]
    bucket_bytes: list[int]

    def train_step(self, x: torch.Tensor, y: torch.Tensor, probe: Callable[[], None] | None = None) -> float:
        raise NotImplementedError

    @classmethod
    def loader_batch(cls, cfg: Any) -> int:
        """Samples this rank's DataLoader yields per step (read before the strategy is built)."""
        return cfg.batch_size * cfg.grad_accum_steps

    def prepare_loader(self, loader: Any) -> Any:
        """The loader this strategy reads (Accelerate shards an unsharded one itself)."""
        return loader

    def set_clock_offset(self, offset_ms: float) -> None:
        self.offset_ms = offset_ms

    def reset_buckets(self) -> None:
        """Forget what warm-up saw (DDP rebuilds its buckets after the first step)."""

    def bucket_sizes(self) -> list[int]:
        """Bytes per gradient bucket (or per message) as the record shows them."""
        return list(self.bucket_bytes)

    def extra_grad_bytes(self) -> int:
        """Gradient-sized buffers beyond .grad (DDP's buckets)."""
        return 0

    def adjust_memory(self, memory: dict[str, Any]) -> None:
        """Correct the memory snapshot where a strategy holds shards (ZeRO, FSDP)."""

    def after_step(self) -> None:
        """Bookkeeping after each step, outside the timed phases."""

    def stage_table(self, lo: int, hi: int) -> StageTable | None:
        """The stages' busy ms and the global span per step in [lo, hi) (a collective over the
        stages); None without stages."""
        return None

    def ddp_logging(self) -> dict[str, Any] | None:
        """DDP's own logging data, where the strategy wraps DDP."""
        return None

    def comm_report(self) -> dict[str, Any] | None:
        """Bytes per collective, where the strategy counts them."""
        return None

    def close(self) -> None:
        """Give back what the strategy borrowed (Accelerate's shared state)."""
