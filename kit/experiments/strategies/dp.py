"""nn.DataParallel: one process drives several replicas (the older, single-process design).

Each step: scatter the batch across devices, replicate the module (broadcast the parameters),
run the replicas in parallel threads, gather the outputs on the first device, compute the loss
there; backward reduces the replicas' gradients onto the first device's parameters. DDP
replaced it because the GIL, the per-step replication and the gather/reduce on one device
make it slower (torch docs: "use DistributedDataParallel instead").

With >= world_size GPUs visible this runs the real `nn.DataParallel`. Otherwise it re-enacts
the same steps on CPU: replicas are autograd-connected clones of the parameters (so backward
*is* the reduce onto the original, as with DataParallel's Broadcast function), run from threads.
Such runs are labelled emulated.
"""
from __future__ import annotations

import threading
from typing import Any

import torch
from torch import nn
from torch.func import functional_call

from kit.experiments.strategies.single import Single

__all__ = ["EmulatedDataParallel", "DataParallelStrategy"]


class EmulatedDataParallel(nn.Module):
    """scatter -> replicate -> parallel_apply (threads) -> gather, on one CPU device."""

    def __init__(self, module: nn.Module, replicas: int):
        super().__init__()
        self.module, self.replicas = module, replicas

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        xs = x.chunk(self.replicas)                                      # scatter
        params = dict(self.module.named_parameters())
        copies = [{k: p.clone() for k, p in params.items()} for _ in xs]  # replicate (a broadcast)
        outs: list[Any] = [None] * len(xs)

        def work(i: int) -> None:  # parallel_apply: one thread per replica, like DataParallel
            try:
                outs[i] = functional_call(self.module, copies[i], (xs[i],))
            except BaseException as e:  # re-raised in the caller's thread
                outs[i] = e

        threads = [threading.Thread(target=work, args=(i,)) for i in range(1, len(xs))]
        for t in threads:
            t.start()
        work(0)
        for t in threads:
            t.join()
        for o in outs:
            if isinstance(o, BaseException):
                raise o
        return torch.cat(outs)                                            # gather on device 0


class DataParallelStrategy(Single):
    """Single's loop around DataParallel (real or emulated); only rank 0 of the cluster runs."""

    @classmethod
    def loader_batch(cls, cfg: Any) -> int:
        return super().loader_batch(cfg) * cfg.world_size  # one process reads the whole batch and scatters it

    def wrap(self, model: nn.Module) -> nn.Module:
        n = self.cfg.world_size
        p_bytes = sum(p.numel() * p.element_size() for p in model.parameters())
        # Per step DataParallel broadcasts the parameters to n-1 devices and reduces n-1 gradients back.
        self.bucket_bytes = [(n - 1) * p_bytes, (n - 1) * p_bytes]
        if self.device.type == "cuda" and torch.cuda.device_count() >= n:
            self.emulated = False
            return nn.DataParallel(model, device_ids=list(range(n)))
        self.emulated = True
        return EmulatedDataParallel(model, n)

    def __init__(self, *a: Any, **kw: Any):
        super().__init__(*a, **kw)
        if self.emulated:
            self.notes.append(f"DataParallel re-enacted on CPU: {self.cfg.world_size} replicas as threads in one "
                              "process, parameter clones as the broadcast, autograd as the gradient reduce; "
                              "on GPUs the copies cross PCIe/NVLink and replica 0's device does the extra work")
