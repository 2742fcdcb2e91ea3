"""Data parallel, twice: the naive way (all-reduce every gradient after backward) and the
real `DistributedDataParallel` (bucketed all-reduce overlapping backward).

Both give the single-process gradients for the global batch: each rank computes the mean
loss on its shard, the all-reduce sums, and dividing by world_size turns the sum of means
into the global mean (equal shards).
"""
from __future__ import annotations

from contextlib import nullcontext
from typing import Any, ContextManager

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP

from kit.experiments.measure.interconnect import DeviceLink, VirtualLink
from kit.experiments.measure.callbacks import then
from kit.experiments.theory.links import LINKS
from kit.experiments.strategies.single import Single

__all__ = ["NaiveDataParallel", "DDPStrategy", "timed_allreduce_hook", "make_link", "HookState"]


def make_link(cfg: Any, world_size: int, device: torch.device) -> VirtualLink | DeviceLink | None:
    """Host-thread link on CPU (gloo futures complete when the data arrived); on GPU a delay on
    a device stream, since NCCL futures complete at enqueue and a host wait would delay nothing."""
    if not cfg.link:
        return None
    preset = LINKS.get(cfg.interconnect)
    kind = DeviceLink if device.type == "cuda" else VirtualLink
    return kind(*cfg.link, world_size, preset)


class NaiveDataParallel(Single):
    """Not used in practice, but the clearest start: backward first, then one blocking
    all_reduce per gradient. Nothing overlaps, so all communication is exposed."""

    def __init__(self, *a: Any, **kw: Any):
        super().__init__(*a, **kw)
        self.world_size = dist.get_world_size()
        self.link = make_link(self.cfg, self.world_size, self.device)
        self.bucket_bytes = [p.numel() * p.element_size() for p in reversed(self.params)]
        # Same starting weights everywhere (they are seeded, but a broadcast makes it a rule).
        for p in self.base.parameters():
            dist.broadcast(p.data, src=0)

    def after_backward(self) -> None:
        with self.clock.phase("all_reduce grads", "comm"):
            for p in reversed(self.params):  # reverse: the order gradients were produced in
                if p.grad is None:
                    p.grad = torch.zeros_like(p)
                fut = dist.all_reduce(p.grad, async_op=True).get_future()
                if self.link:
                    fut = self.link.delay(fut, p.grad.numel() * p.grad.element_size())
                fut.wait()
                p.grad.div_(self.world_size)


class HookState:
    """What the comm hook needs, and nothing that leads back to the model."""

    def __init__(self, buckets: dict[int, int], link: VirtualLink | None, clock: Any, world_size: int):
        self.buckets, self.link, self.clock, self.world_size = buckets, link, clock, world_size


def timed_allreduce_hook(state, bucket):  # type: ignore[no-untyped-def]
    """DDP comm hook: the default all-reduce, plus a launch/complete stamp and the virtual link.

    (state: HookState, bucket: dist.GradBucket) -> Future[Tensor]. No annotations on purpose:
    DDP checks them at registration and `from __future__ import annotations` makes them strings.
    """
    clock = state.clock
    # Launch stamp: on CUDA an event on the compute stream, i.e. when the bucket's last gradient
    # was produced on the device (NCCL's stream waits for exactly that point).
    t0 = clock.now() if clock.enabled else 0.0
    buf = bucket.buffer()
    state.buckets[bucket.index()] = buf.numel() * buf.element_size()
    fut = dist.all_reduce(buf, async_op=True).get_future()
    if state.link:
        fut = state.link.delay(fut, buf.numel() * buf.element_size())
    ws = state.world_size

    def done(f: torch.futures.Future) -> torch.Tensor:
        # With NCCL this callback runs at enqueue, but on a stream that waits for the collective
        # (and the link's device delay), so a CUDA stamp here is the device completion time.
        if clock.enabled:
            clock.comm_interval(t0, clock.now())
        return f.value()[0].div_(ws)

    return then(fut, done)  # released before the run returns (measure/callbacks.py)


class DDPStrategy(Single):
    """torch's DDP: gradients grouped into ~bucket_cap_mb buckets (reverse parameter order);
    each bucket's all-reduce starts as soon as its last gradient is ready, during backward."""

    def wrap(self, model: nn.Module) -> nn.Module:
        self.buckets: dict[int, int] = {}  # bucket index -> bytes, as the comm hook saw them
        self.world_size = dist.get_world_size()
        self.link = make_link(self.cfg, self.world_size, self.device)
        dev = [self.device.index] if self.device.type == "cuda" else None
        ddp = DDP(model, device_ids=dev, bucket_cap_mb=self.cfg.bucket_cap_mb,
                  gradient_as_bucket_view=self.cfg.gradient_as_bucket_view,
                  find_unused_parameters=self.cfg.find_unused_parameters)
        if self.cfg.instrument or self.link:
            # Without instrumentation and link we keep DDP's built-in C++ hook: the honest baseline.
            # The hook state must not reference the model: DDP's C++ reducer holds the state, so a
            # state -> model reference is a cycle Python cannot collect (one leaked model per run).
            ddp.register_comm_hook(HookState(self.buckets, self.link, self.clock, self.world_size),
                                   timed_allreduce_hook)
        return ddp

    def sync_context(self, last_micro: bool) -> ContextManager[Any]:
        return nullcontext() if last_micro else self.model.no_sync()

    def reset_buckets(self) -> None:
        self.buckets.clear()

    def bucket_sizes(self) -> list[int]:
        """As the comm hook saw them; uninstrumented runs keep DDP's C++ hook, which tells none."""
        return [self.buckets[i] for i in sorted(self.buckets)] or list(self.bucket_bytes)

    def extra_grad_bytes(self) -> int:
        """Without gradient_as_bucket_view DDP keeps its flat bucket buffers beside .grad: a
        second copy of the gradients (the memory gradient_as_bucket_view=True saves).

        Counted from the parameters, not from the comm hook: the reducer's buckets hold every
        gradient of a parameter that requires one (dense, same dtype), whether or not our hook
        ran (uninstrumented runs keep DDP's built-in C++ hook and never tell us the buckets).
        """
        if self.cfg.gradient_as_bucket_view:
            return 0
        return sum(p.numel() * p.element_size() for p in self.params)

    def ddp_logging(self) -> dict[str, Any]:
        """torch's own (sampled) DDP timers, ns -> ms, to cross-check ours."""
        try:
            d = self.model._get_ddp_logging_data()
        except Exception:  # private API: absent or changed in another torch
            return {}
        keys = ("avg_forward_compute_time", "avg_backward_compute_time", "avg_backward_comm_time",
                "avg_backward_compute_comm_overlap_time")
        out = {k.replace("_time", "_ms"): d[k] / 1e6 for k in keys if k in d}
        out["bucket_sizes"] = d.get("bucket_sizes")
        return out
