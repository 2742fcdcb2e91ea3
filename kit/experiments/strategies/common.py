"""Small pieces every strategy shares: autocast, the optimizer, micro-batch slicing."""
from __future__ import annotations

from contextlib import nullcontext
from typing import Any, ContextManager

import torch

from kit import _renamed

__all__ = ["autocast", "make_optimizer", "make_scaler", "chunks", "ADAM_LR"]

ADAM_LR = 1e-3  # the run loop's optimizer (make_optimizer: Adam)
__getattr__ = _renamed.renamed_getattr(__name__)  # this release's old names, for one release


def autocast(precision: str, device_type: str) -> ContextManager[Any]:
    """fp32: nothing. bf16/fp16: torch.autocast; parameters and grads stay fp32 (master weights)."""
    if precision == "fp32":
        return nullcontext()
    return torch.autocast(device_type, dtype=torch.bfloat16 if precision == "bf16" else torch.float16)


def make_optimizer(params: list[torch.nn.Parameter]) -> torch.optim.Optimizer:
    # Adam: two fp32 states per parameter, the memory lesson's 8 bytes/param.
    return torch.optim.Adam(params, lr=ADAM_LR)


def make_scaler(precision: str, device_type: str) -> Any:
    """fp16 needs loss scaling (small grads underflow in fp16); bf16 has fp32's range and does not."""
    return torch.amp.GradScaler(device_type, enabled=precision == "fp16")


def chunks(x: torch.Tensor, y: torch.Tensor, n: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """Split a batch into n equal micro-batches along dim 0."""
    if x.shape[0] % n:
        raise ValueError(f"batch of {x.shape[0]} does not split into {n} equal micro-batches")
    return list(zip(x.chunk(n), y.chunk(n)))
