"""Which device a collective's tensors go on, for the kit's own bookkeeping collectives.

NCCL reduces, gathers and sends GPU tensors only: a CPU tensor raises "No backend type associated
with device type cpu". gloo takes CPU tensors. So every small tensor the kit's rank-side code hands
a collective (a timing's MAX over ranks, a table gathered from every stage) is made on
`group_device(group)`, or the code works on CPU ranks and fails on every GPU cluster.
"""
from __future__ import annotations

from typing import Any

import torch
import torch.distributed as dist

__all__ = ["group_device"]


def group_device(group: Any = None) -> torch.device:
    """This rank's GPU when `group` runs NCCL alone ("nccl", "cuda:nccl"), else the CPU (gloo, or a group
    with a gloo part for CPU tensors such as "cpu:gloo,cuda:nccl")."""
    backend = str(dist.get_backend(group))
    if "nccl" in backend and "gloo" not in backend:
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")
