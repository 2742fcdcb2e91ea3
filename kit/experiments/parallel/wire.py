"""Every collective the hand-written strategies issue goes through here: counted and timed.

`payload_bytes` is the tensor a collective is about (all-reduce: the tensor; all-gather: the
gathered output; reduce-scatter: the input before scattering; all-to-all and send: the bytes
this rank sends to *other* ranks). `wire_bytes` is what one rank sends under the
bandwidth-optimal ring algorithm: all-reduce 2(t-1)/t x N, all-gather and reduce-scatter
(t-1)/t x N, point-to-point and all-to-all their own bytes (Patarasuk & Yuan 2009; see
docs/strategies.md). Counts and payloads are measured at the call; wire bytes follow from them.
Each call is labelled with its mesh dimension ("tp", "dp", ...), so a 2-D mesh reports each
dimension's collectives separately.
"""
from __future__ import annotations

import math
import threading
import time
from collections import defaultdict
from contextlib import contextmanager
from typing import Any, Callable, Iterator

import torch
import torch.distributed as dist

from kit.experiments.measure.callbacks import then
from kit.experiments.measure.stamps import HostStamps
from kit.experiments.theory.sharding_theory import ring_factor

__all__ = ["WIRE", "Wire", "FunctionalCollectives", "CustomCollectives", "all_reduce", "all_gather", "reduce_scatter",
           "all_to_all", "isend", "irecv", "install_fsdp_comms", "ReplicaAllReduce"]


class Wire:
    """Calls, payload bytes, ring wire bytes and wall ms per (dimension, collective kind)."""

    def __init__(self) -> None:
        self.rows: dict[tuple[str, str], dict[str, float]] = defaultdict(
            lambda: {"calls": 0, "payload_bytes": 0, "wire_bytes": 0, "ms": 0.0})
        self.clock: Any = None  # a StepClock: each call becomes a "comm" phase named "<dim> <kind>"
        # Asynchronous calls whose completion callback has not run yet. The caller has waited on their
        # work, but gloo's thread runs the callback (which adds the ms and the timeline's phase) just
        # after, and on a loaded machine that can be after the step ended: `report` waits for it.
        self.pending, self._lock = 0, threading.Lock()

    def reset(self) -> None:
        self.rows.clear()

    def add(self, dim: str, kind: str, payload: int, wire: float, ms: float) -> None:
        """One call."""
        r = self.rows[(dim, kind)]
        r["calls"] += 1
        r["payload_bytes"] += payload
        r["wire_bytes"] += wire
        r["ms"] += ms

    def launched(self) -> None:
        """An asynchronous call was issued; `completed` follows from its callback."""
        with self._lock:
            self.pending += 1

    def completed(self) -> None:
        with self._lock:
            self.pending -= 1

    def report(self, wait_s: float = 5.0) -> dict[str, dict[str, float]]:
        """{"tp/all_reduce": {"calls", "payload_bytes", "wire_bytes", "ms"}, ...}, once every asynchronous
        call's callback has run (up to `wait_s`: a call never waited on would be a bug of the caller), so
        that its ms are in the same step as the timeline's phase the callback adds."""
        deadline = time.monotonic() + wait_s
        while self.pending > 0 and time.monotonic() < deadline:
            time.sleep(0.0005)  # sleeping releases the GIL that gloo's thread needs to run the callback
        return {f"{d}/{k}": dict(v) for (d, k), v in sorted(self.rows.items())}

    @contextmanager
    def counting(self) -> Iterator["Wire"]:
        """Start from zero; the counts of the block are in `report()` afterwards."""
        self.reset()
        yield self


WIRE = Wire()  # one per rank process; strategies reset it per measured step


def _size(group: Any) -> int:
    return dist.get_world_size(group)


def _now(clock: Any) -> tuple[float, Any]:
    """(host ms, the clock's stamp) for one end of a call: the wire's ms are host time, the timeline's
    phase the clock's stamps. On CPU both are ONE reading of perf_counter: two readings taken apart could
    straddle a switch of Python's GIL to another thread (its interval is 5 ms), and an HSDP step then
    showed 6.4 ms of dp all-reduce in the record against 11.2 ms of the same calls on the timeline. On
    CUDA the stamp is an event on the stream (the device's time), a different clock by design."""
    host_ms = time.perf_counter() * 1e3
    if clock is None:
        return host_ms, None
    return host_ms, host_ms if isinstance(clock.stamps, HostStamps) else clock.now()


def _record(dim: str, kind: str, clock: Any, start: tuple[float, Any], end: tuple[float, Any]) -> None:
    """Add one call's ms to its row and its phase ("<dim> <kind>") to the clock's timeline."""
    WIRE.rows[(dim, kind)]["ms"] += end[0] - start[0]
    if clock is not None:
        clock.add_phase(f"{dim} {kind}", "comm", start[1], end[1])


@contextmanager
def _timed(dim: str, kind: str, payload: int, wire: float) -> Iterator[None]:
    clock = WIRE.clock  # the timeline shows each dimension's calls
    start = _now(clock)
    yield
    end = _now(clock)
    WIRE.add(dim, kind, payload, wire, 0.0)
    _record(dim, kind, clock, start, end)


def _nbytes(t: torch.Tensor) -> int:
    return t.numel() * t.element_size()


def all_reduce(t: torch.Tensor, group: Any = None, dim: str = "tp") -> torch.Tensor:
    """Sum `t` in place over the group."""
    n = _size(group)
    with _timed(dim, "all_reduce", _nbytes(t), ring_factor("all_reduce", n) * _nbytes(t)):
        dist.all_reduce(t, group=group)
    return t


def all_gather(t: torch.Tensor, along: int, group: Any = None, dim: str = "tp") -> torch.Tensor:
    """Concatenate every rank's `t` along dimension `along` (in rank order)."""
    n = _size(group)
    t = t.contiguous()
    parts = [torch.empty_like(t) for _ in range(n)]
    with _timed(dim, "all_gather", n * _nbytes(t), ring_factor("all_gather", n) * n * _nbytes(t)):
        dist.all_gather(parts, t, group=group)
    return torch.cat(parts, dim=along)


def reduce_scatter(t: torch.Tensor, along: int, group: Any = None, dim: str = "tp") -> torch.Tensor:
    """Sum over the group, then keep this rank's 1/n slice along dimension `along`."""
    n = _size(group)
    parts = [c.contiguous() for c in t.chunk(n, dim=along)]
    out = torch.empty_like(parts[0])
    with _timed(dim, "reduce_scatter", _nbytes(t), ring_factor("reduce_scatter", n) * _nbytes(t)):
        dist.reduce_scatter(out, parts, group=group)
    return out


def all_to_all(t: torch.Tensor, send_counts: list[int], recv_counts: list[int], group: Any = None,
               dim: str = "ep") -> torch.Tensor:
    """Rows of `t` (dim 0) go to ranks in blocks of `send_counts`; returns the rows received.

    gloo's list `all_to_all` needs equal sizes, so uneven splits use `all_to_all_single`."""
    t = t.contiguous()
    row = math.prod(t.shape[1:]) * t.element_size()
    me = dist.get_rank(group)
    sent = sum(c for i, c in enumerate(send_counts) if i != me) * row
    out = t.new_empty((sum(recv_counts), *t.shape[1:]))
    with _timed(dim, "all_to_all", sent, sent):
        dist.all_to_all_single(out, t, recv_counts, send_counts, group=group)
    return out


def isend(t: torch.Tensor, dst: int, group: Any = None, dim: str = "cp", tag: int = 0) -> Any:
    """Non-blocking send to global rank `dst` (counted when posted; keep `t` alive until waited)."""
    with _timed(dim, "send", _nbytes(t), _nbytes(t)):
        return dist.isend(t, dst, group=group, tag=tag)


def irecv(t: torch.Tensor, src: int, group: Any = None, dim: str = "cp", tag: int = 0) -> Any:
    """Non-blocking receive from global rank `src` into `t` (not counted: its sender counts it)."""
    return dist.irecv(t, src, group=group, tag=tag)


class FunctionalCollectives:
    """Counts the collectives torch's DTensor issues (functional `_c10d_functional` ops) in a block,
    with the same payload and ring-wire rules; `with FunctionalCollectives("tp") as w: ...; w.report()`.

    A TorchDispatchMode sees every op, backward's too (CPU autograd runs on the calling thread)."""

    KINDS = {"all_reduce": "all_reduce", "all_gather_into_tensor": "all_gather",
             "reduce_scatter_tensor": "reduce_scatter", "all_to_all_single": "all_to_all"}

    def __init__(self, dim: str = "tp") -> None:
        from torch.utils._python_dispatch import TorchDispatchMode
        self.wire, counter = Wire(), self

        class _Mode(TorchDispatchMode):
            def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # type: ignore[no-untyped-def]
                counter._see(func, args)
                return func(*args, **(kwargs or {}))
        self.dim, self.mode = dim, _Mode()

    def _see(self, func: Any, args: tuple[Any, ...]) -> None:
        if func.namespace != "_c10d_functional":
            return
        kind = self.KINDS.get(func._opname)
        if kind is None:
            return
        from torch.distributed.distributed_c10d import _resolve_process_group
        t, n = args[0], dist.get_world_size(_resolve_process_group(args[-1]))  # the group's name is last
        nb = _nbytes(t) * (n if kind == "all_gather" else 1)
        wire = ring_factor(kind, n) * nb if kind != "all_to_all" else nb
        self.wire.add(self.dim, kind, nb, wire, 0.0)

    def __enter__(self) -> "Wire":
        self.mode.__enter__()
        return self.wire

    def __exit__(self, *exc: Any) -> None:
        self.mode.__exit__(*exc)


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
            start = _now(clock)
            work = call(output_tensor, input_tensor, *a, **kw)
            n = payload(output_tensor, input_tensor)
            WIRE.add(self.dim, kind, n, ring_factor(kind, self.size) * n, 0.0)  # counted at the call

            def done(_f: Any = None) -> None:
                _record(self.dim, kind, clock, start, _now(clock))
                if kind == "reduce_scatter" and self.reduced is not None:
                    self.reduced()

            def done_async(f: Any) -> None:
                try:
                    done(f)
                finally:
                    WIRE.completed()
            if work is None:
                done()
            else:
                WIRE.launched()
                then(work.get_future(), done_async)
            return work
        return timed


def install_fsdp_comms(module: Any, log: Any) -> bool:
    """Route one FSDP2 module's all-gathers and reduce-scatters through `log.wrap(kind, call, payload)`
    (a CustomCollectives, or the fsdp strategy's log) with FSDP2's set_custom_* API; False where this
    torch lacks it (the caller says so)."""
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
        self.start: tuple[tuple[float, Any], Any] | None = None  # (_now(clock), clock)

    def reduced(self) -> None:
        clock = WIRE.clock
        self.start = (_now(clock), clock)

    def install(self, module: Any) -> None:
        module.set_all_reduce_hook(self._all_reduced)

    def _all_reduced(self, reduce_output: torch.Tensor) -> None:
        if self.start is None:  # FSDP2 never called reduced(): the order above changed in this torch
            raise RuntimeError("FSDP2 ran HSDP's all-reduce without a reduce-scatter before it; the kit cannot "
                               "time it in this torch (parallel/wire.py ReplicaAllReduce)")
        start, clock = self.start
        end = _now(clock)
        self.start = None
        n = reduce_output.numel() * reduce_output.element_size()
        WIRE.add(self.dim, "all_reduce", n, ring_factor("all_reduce", self.size) * n, 0.0)
        _record(self.dim, "all_reduce", clock, start, end)


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
