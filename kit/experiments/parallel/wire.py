"""Every collective the hand-written strategies issue goes through here: counted and timed.

`payload_bytes` is the tensor a collective is about (all-reduce: the tensor; all-gather: the
gathered output; reduce-scatter: the input before scattering; all-to-all and send: the bytes
this rank sends to *other* ranks). `wire_bytes` is what one rank sends under the
bandwidth-optimal ring algorithm: all-reduce 2(t-1)/t x N, all-gather and reduce-scatter
(t-1)/t x N, point-to-point and all-to-all their own bytes (Patarasuk & Yuan 2009; see
docs/strategies.md). Counts and payloads are measured at the call; wire bytes follow from them.
Each call is labelled with its mesh dimension ("tp", "dp", ...), so a 2-D mesh reports each
dimension's collectives separately. FSDP2's own collectives are counted the same way in wire_fsdp.py.
"""
from __future__ import annotations

import math
import threading
import time
import warnings
from collections import defaultdict
from contextlib import contextmanager
from typing import Any, Iterator

import torch
import torch.distributed as dist

from kit.experiments.measure.stamps import HostStamps
from kit.experiments.theory.links import ring_factor

__all__ = ["WIRE", "Wire", "FunctionalCollectives", "read_clock", "all_reduce", "all_gather", "reduce_scatter",
           "all_to_all", "isend", "irecv"]


class Wire:
    """Calls, payload bytes, ring wire bytes and wall ms per (dimension, collective kind)."""

    def __init__(self) -> None:
        self.rows: dict[tuple[str, str], dict[str, float]] = defaultdict(
            lambda: {"calls": 0, "payload_bytes": 0, "wire_bytes": 0, "ms": 0.0})
        self.clock: Any = None  # a StepClock: each call becomes a "comm" phase named "<dim> <kind>"
        # Asynchronous calls (FSDP2's, wire_fsdp.py) whose completion callback is due: the caller has waited
        # on their work, but gloo's thread runs the callback (the call's ms and its timeline phase) just
        # after, on a loaded machine after the step ended; `report` waits for them. `reset` starts a new
        # generation: the callback of a call from before it (a step stopped mid-collective) is dropped.
        # The lock: the callbacks write `rows` from gloo's thread while the rank's thread counts calls.
        self.callbacks_due, self.generation, self._lock = 0, 0, threading.Lock()

    def reset(self) -> None:
        with self._lock:
            self.rows.clear()
            self.callbacks_due, self.generation = 0, self.generation + 1

    def add(self, dim: str, kind: str, payload: int, wire: float, ms: float) -> None:
        """One call."""
        with self._lock:
            r = self.rows[(dim, kind)]
            r["calls"] += 1
            r["payload_bytes"] += payload
            r["wire_bytes"] += wire
            r["ms"] += ms

    def callback_due(self) -> int:
        """An asynchronous call was issued: its callback will call `record(..., generation=)` with this."""
        with self._lock:
            self.callbacks_due += 1
            return self.generation

    def record(self, dim: str, kind: str, clock: Any, start: tuple[float, Any], end: tuple[float, Any],
               generation: int | None = None) -> bool:
        """Add one call's ms to its row and its phase ("<dim> <kind>") to the clock's timeline, both from
        the same two `read_clock` pairs. A callback passes its `generation`: False, and nothing added,
        when a `reset` came between the call and its callback."""
        with self._lock:
            if generation is not None:
                if generation != self.generation:
                    return False
                self.callbacks_due -= 1
            self.rows[(dim, kind)]["ms"] += end[0] - start[0]
            if clock is not None:
                clock.add_phase(f"{dim} {kind}", "comm", start[1], end[1])
            return True

    def report(self, wait_s: float = 5.0) -> dict[str, dict[str, float]]:
        """{"tp/all_reduce": {"calls", "payload_bytes", "wire_bytes", "ms"}, ...}, once every asynchronous
        call's callback has run, so that its ms are in the same step as the phase the callback adds. After
        `wait_s` (a call whose work was never waited on) it reports without them and says so."""
        deadline = time.monotonic() + wait_s
        while self.callbacks_due > 0 and time.monotonic() < deadline:
            time.sleep(0.0005)  # sleeping releases the GIL that gloo's thread needs to run the callback
        with self._lock:
            if self.callbacks_due > 0:
                warnings.warn(f"kit: {self.callbacks_due} asynchronous collective(s) had not completed "
                              f"{wait_s:g} s after the step; their time is left out of this step's "
                              "communication record (kit/experiments/parallel/wire.py)", stacklevel=2)
            return {f"{d}/{k}": dict(v) for (d, k), v in sorted(self.rows.items())}

    @contextmanager
    def counting(self) -> Iterator["Wire"]:
        """Start from zero; the counts of the block are in `report()` afterwards."""
        self.reset()
        yield self


WIRE = Wire()  # one per rank process; strategies reset it per measured step


def _size(group: Any) -> int:
    return dist.get_world_size(group)


def read_clock(clock: Any) -> tuple[float, Any]:
    """(host ms, the clock's stamp) for one end of a call: the record's ms are host time, the timeline's
    phase the clock's stamps. On CPU both are ONE reading of perf_counter: two readings taken apart could
    straddle a switch of Python's GIL to another thread (its interval is 5 ms), and an HSDP step then
    showed 6.4 ms of dp all-reduce in the record against 11.2 ms of the same calls on the timeline. On
    CUDA the stamp is an event on the stream (the device's time), a different clock by design; a
    disabled clock (instrument=False) takes no stamp at all."""
    host_ms = time.perf_counter() * 1e3
    if clock is None or not getattr(clock, "enabled", True):
        return host_ms, None
    return host_ms, host_ms if isinstance(clock.stamps, HostStamps) else clock.now()


@contextmanager
def _timed(dim: str, kind: str, payload: int, wire: float) -> Iterator[None]:
    clock = WIRE.clock  # the timeline shows each dimension's calls
    start = read_clock(clock)
    yield
    end = read_clock(clock)
    WIRE.add(dim, kind, payload, wire, 0.0)
    WIRE.record(dim, kind, clock, start, end)


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
