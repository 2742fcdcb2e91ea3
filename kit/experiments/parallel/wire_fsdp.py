"""FSDP2's collectives counted and timed in the wire (wire.py's WIRE), per mesh dimension.

FSDP2 issues its all-gathers and reduce-scatters itself: `install_fsdp_comms` routes them through
FSDP2's `set_custom_all_gather` / `set_custom_reduce_scatter` (a CustomCollectives counts them);
HSDP's all-reduce across replicas has no such API and is timed between the reduce-scatter's end and
FSDP2's all-reduce hook (ReplicaAllReduce). Asynchronous calls are recorded by a completion callback
on gloo's thread, which the step's `WIRE.report()` waits for.
"""
from __future__ import annotations

from typing import Any, Callable

import torch

from kit.experiments.measure.callbacks import then
from kit.experiments.parallel.wire import WIRE, read_clock
from kit.experiments.theory.links import ring_factor

__all__ = ["CustomCollectives", "install_fsdp_comms", "ReplicaAllReduce"]


class CustomCollectives:
    """FSDP2's all-gathers and reduce-scatters on a mesh dimension, through FSDP2's own
    `set_custom_all_gather` / `set_custom_reduce_scatter` (`install_fsdp_comms` calls
    `wrap`): counted in WIRE under `dim` at the call (all-gather: the gathered output;
    reduce-scatter: the input), timed from the launch to the completion of their work, and shown
    as "<dim> <kind>" comm phases. Asynchronous calls complete in gloo's callback."""

    def __init__(self, dim: str, size: int, reduced: Callable[[], None] | None = None):
        self.dim, self.size = dim, size
        self.reduced = reduced  # called when FSDP2 holds a reduced gradient shard (HSDP: its all-reduce is next)

    def wrap(self, kind: str, call: Any, payload: Any) -> Any:
        def timed(output_tensor: torch.Tensor, input_tensor: torch.Tensor, *a: Any, **kw: Any) -> Any:
            clock = WIRE.clock
            start = read_clock(clock)
            work = call(output_tensor, input_tensor, *a, **kw)
            n = payload(output_tensor, input_tensor)
            WIRE.add(self.dim, kind, n, ring_factor(kind, self.size) * n, 0.0)  # counted at the call
            generation = None if work is None else WIRE.callback_due()

            def done(_f: Any = None) -> None:
                if WIRE.record(self.dim, kind, clock, start, read_clock(clock), generation) \
                        and kind == "reduce_scatter" and self.reduced is not None:
                    self.reduced()
            if work is None:
                done()
            else:
                then(work.get_future(), done)
            return work
        return timed


def install_fsdp_comms(module: Any, log: Any) -> bool:
    """Route one FSDP2 module's all-gathers and reduce-scatters through `log.wrap(kind, call, payload)`
    (a CustomCollectives: the fsdp strategy's, fsdp x tp's, HSDP's) with FSDP2's set_custom_* API; False
    where this torch lacks it (the caller says so)."""
    try:
        from torch.distributed.fsdp._fully_shard._fsdp_collectives import DefaultAllGather, DefaultReduceScatter
    except ImportError:  # a private module: absent in another torch
        return False
    ag, rs = DefaultAllGather(), DefaultReduceScatter()
    # all-gather: the gathered (output) buffer is S; reduce-scatter: the input buffer is S.
    ag.__call__ = log.wrap("all_gather", ag.__call__, lambda out, inp: out.numel() * out.element_size())
    rs.__call__ = log.wrap("reduce_scatter", rs.__call__, lambda out, inp: inp.numel() * inp.element_size())
    module.set_custom_all_gather(_Call(ag))
    # with one shard FSDP2 copies instead of reduce-scattering, into the buffer it allocates just before
    module.set_custom_reduce_scatter(_Call(rs, getattr(log, "reduced", None)))
    return True


class ReplicaAllReduce:
    """HSDP's all-reduce of each gradient shard across the replicas on `dim`, which FSDP2 issues itself
    (`dist.all_reduce` inside `foreach_reduce`, with no custom-collective API), counted and timed around
    what torch calls: FSDP2 reduce-scatters a block's gradients (the fsdp CustomCollectives calls
    `reduced()` when that ends), then all-reduces the shard on dp, then calls the all-reduce hook
    (`set_all_reduce_hook`, installed by `install`) with the all-reduced shard. From `reduced()` to the
    hook is that all-reduce: on CPU (gloo) it blocks until done. On CUDA the timeline's two stamps are
    events on FSDP2's streams (the clock's), while `ms` is host time (the launch), as for fsdp's own
    collectives. Counted in WIRE as "<dim>/all_reduce", shown as a "<dim> all_reduce" comm phase. With one
    shard per replica FSDP2 copies instead of reduce-scattering: the stamp is then taken when it allocates
    the shard (the copy, a memcpy of the shard, is inside the time)."""

    def __init__(self, dim: str, size: int):
        self.dim, self.size = dim, size
        self.start: tuple[tuple[float, Any], Any] | None = None  # (read_clock(clock), clock)

    def reduced(self) -> None:
        clock = WIRE.clock
        self.start = (read_clock(clock), clock)

    def install(self, module: Any) -> None:
        module.set_all_reduce_hook(self._all_reduced)

    def _all_reduced(self, reduce_output: torch.Tensor) -> None:
        if self.start is None:  # FSDP2 never called reduced(): the order above changed in this torch
            raise RuntimeError("FSDP2 ran HSDP's all-reduce without a reduce-scatter before it; the kit cannot "
                               "time it in this torch (parallel/wire_fsdp.py ReplicaAllReduce)")
        start, clock = self.start
        end = read_clock(clock)
        self.start = None
        n = reduce_output.numel() * reduce_output.element_size()
        WIRE.add(self.dim, "all_reduce", n, ring_factor("all_reduce", self.size) * n, 0.0)
        WIRE.record(self.dim, "all_reduce", clock, start, end)


class _Call:
    """Calls go through the instance attribute (Python looks special methods up on the type)."""

    def __init__(self, inner: Any, allocated: Callable[[], None] | None = None):
        self.inner, self.allocated = inner, allocated

    def __call__(self, *a: Any, **kw: Any) -> Any:
        return self.inner.__call__(*a, **kw)

    def allocate(self, *a: Any, **kw: Any) -> torch.Tensor:
        t = self.inner.allocate(*a, **kw)
        if self.allocated is not None:
            self.allocated()
        return t
