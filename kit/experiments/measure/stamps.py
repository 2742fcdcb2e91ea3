"""Time stamps that mean "the device got here", on CPU and on GPU.

Why two kinds: on CPU a `time.perf_counter()` read *is* the moment the work happened. On a GPU
the host only queues work: with NCCL a collective's future completes at enqueue, a gradient
hook fires when autograd *queues* the kernel, and a host stamp says nothing about when the
device ran it. So on CUDA a stamp is a `torch.cuda.Event` recorded on the current stream, and
it is turned into milliseconds only after the step (`resolve`), by `elapsed_time` from an
origin event recorded while the device was idle at `begin()`. The resolved numbers sit on the
host's perf_counter axis (origin event == host origin), so the overlapped/exposed arithmetic
in timing.py and the common clock in clocks.py are the same for both kinds.

`cycles_per_ms` calibrates `torch.cuda._sleep` (a spin kernel counting clock cycles) so the
virtual link can hold a bucket *on the device stream* for a chosen number of milliseconds.
"""
from __future__ import annotations

import time
from statistics import median
from typing import Any, Protocol, Union

import torch

__all__ = ["Stamp", "Stamps", "HostStamps", "CudaStamps", "stamps_for", "cycles_per_ms"]

Stamp = Union[float, Any]  # float ms (host) or torch.cuda.Event (device)


class Stamps(Protocol):
    """What StepClock needs from a time source (tests pass a fake clock with this shape)."""

    def begin(self) -> None: ...
    def stamp(self) -> Stamp: ...
    def resolve(self, s: Stamp) -> float: ...


class HostStamps:
    """CPU: a stamp is perf_counter in ms; CPU work is done when the call returns."""

    def begin(self) -> None:
        pass

    def stamp(self) -> float:
        return time.perf_counter() * 1e3

    def resolve(self, s: Stamp) -> float:
        return float(s)


class CudaStamps:
    """GPU: a stamp is an event on the current stream, resolved after the step."""

    def __init__(self) -> None:
        self.ev0: Any = None
        self.host0_ms = 0.0

    def begin(self) -> None:
        # The origin event is recorded on an idle device and waited for, so its device time and
        # the host perf_counter read right after it are the same instant (to ~10 us).
        torch.cuda.synchronize()
        self.ev0 = torch.cuda.Event(enable_timing=True)
        self.ev0.record()
        self.ev0.synchronize()
        self.host0_ms = time.perf_counter() * 1e3

    def stamp(self) -> Any:
        ev = torch.cuda.Event(enable_timing=True)
        ev.record()  # on the *current* stream: a comm callback's stream waits on the collective
        return ev

    def resolve(self, s: Stamp) -> float:
        if isinstance(s, float):
            return s
        s.synchronize()
        return self.host0_ms + self.ev0.elapsed_time(s)


def stamps_for(device_type: str) -> Stamps:
    return CudaStamps() if device_type == "cuda" else HostStamps()


_CYCLES_PER_MS: dict[int, float] = {}


def cycles_per_ms(device: int | None = None) -> float:
    """GPU clock cycles `torch.cuda._sleep` spins per millisecond (median of 3, cached per device)."""
    dev = torch.cuda.current_device() if device is None else device
    if dev not in _CYCLES_PER_MS:
        n = 2_000_000
        torch.cuda._sleep(n)  # warm up: the first launch pays module loading
        rates = []
        for _ in range(3):
            s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            s.record()
            torch.cuda._sleep(n)
            e.record()
            e.synchronize()
            rates.append(n / max(s.elapsed_time(e), 1e-6))
        _CYCLES_PER_MS[dev] = median(rates)
    return _CYCLES_PER_MS[dev]
