"""Virtual interconnect: make a slow (or fast) network visible on one CPU machine.

The real all_reduce still runs (gloo over loopback, so results are exact); then the bucket
travels the emulated link, so its completion comes that much later:

    t_bucket = base + 2(n-1) alpha + bytes * 2(n-1)/n / bw(bytes)    (ring all-reduce, links.py)

Buckets queue on the link one after another (a link carries one transfer at a time), and the
delay is asynchronous: backward keeps computing while a bucket is "on the wire", exactly the
overlap DDP relies on. Link presets live in links.py (sources in docs/hardware.md).
Runs that use it are labelled emulated. Sleep granularity on Linux is ~0.1 ms, so links whose
per-bucket time is below that (NVLink at small buckets) show little difference from loopback.

On GPUs (`DeviceLink`) the delay is a `torch.cuda._sleep` spin kernel on one dedicated "link"
stream, calibrated in cycles per ms: NCCL futures complete at enqueue, so a host wait would
delay nothing the device does. The link stream waits for the real all-reduce, spins for the
bucket's link time, and the consumer stream waits for the spin; one stream makes buckets queue
in order, like the CPU link. Cost of the emulation: the spin occupies one thread block on one
SM while it runs (compute kernels keep the other SMs).
"""
from __future__ import annotations

import queue
import threading
import time
from typing import Any

import torch

from kit.experiments.theory.links import LinkPreset, link_allreduce_s
from kit.experiments.measure.callbacks import then
from kit import _renamed

__all__ = ["VirtualLink", "DeviceLink"]
__getattr__ = _renamed.renamed_getattr(__name__)  # this release's old names, for one release


class _Cost:
    def __init__(self, alpha_us: float, gbps: float, world_size: int, preset: LinkPreset | None = None):
        # the link this cost is of: alpha and gbps (a named link's are its preset's: config.link), with a named
        # link's base latency and size efficiency; without a preset, plain alpha-beta
        self.link = LinkPreset(alpha_us, gbps) if preset is None else \
            LinkPreset(alpha_us, gbps, preset.base_us, preset.efficiency, preset.chunk_half_bytes, preset.source)
        self.world_size = world_size

    def cost_s(self, nbytes: int) -> float:
        return link_allreduce_s(self.link, nbytes, self.world_size)


class VirtualLink(_Cost):
    """A FIFO link: each transfer starts when the previous one left the wire (host thread; CPU)."""

    def __init__(self, alpha_us: float, gbps: float, world_size: int, preset: LinkPreset | None = None):
        super().__init__(alpha_us, gbps, world_size, preset)
        self.free_at_s = 0.0
        self.q: "queue.Queue[tuple[Any, float, Any] | None]" = queue.Queue()
        self.thread = threading.Thread(target=self._deliver, name="kit-virtual-link", daemon=True)
        self.thread.start()

    def delay(self, fut: torch.futures.Future, nbytes: int) -> torch.futures.Future:
        """A future that completes with `fut`'s value once the emulated transfer is over.

        The emulated transfer starts when the real all_reduce has finished and the link is
        free, so the link's time is *added* to the real (loopback) time, as the issue asks:
        comm grows by alpha + bytes * 2(n-1)/n / beta per bucket, measurably, on any machine.
        """
        out: torch.futures.Future = torch.futures.Future()
        self.q.put((fut, self.cost_s(nbytes), out))
        return out

    def _deliver(self) -> None:
        # One thread serves buckets in launch order: a link carries one transfer at a time.
        while (item := self.q.get()) is not None:
            fut, cost_s, out = item
            try:
                value = fut.wait()
                start_s = max(time.perf_counter(), self.free_at_s)
                self.free_at_s = start_s + cost_s
                time.sleep(max(0.0, self.free_at_s - time.perf_counter()))
                out.set_result(value)
            except Exception as e:  # surface gloo errors to DDP instead of hanging it
                out.set_exception(e)

    def close(self) -> None:
        self.q.put(None)


class DeviceLink(_Cost):
    """The same FIFO link on a GPU: a calibrated spin on one link stream (see the module doc)."""

    def __init__(self, alpha_us: float, gbps: float, world_size: int, preset: LinkPreset | None = None):
        from kit.experiments.measure.stamps import cycles_per_ms
        super().__init__(alpha_us, gbps, world_size, preset)
        self.stream = torch.cuda.Stream()
        self.cycles_per_ms = cycles_per_ms()

    def delay(self, fut: torch.futures.Future, nbytes: int) -> torch.futures.Future:
        cycles = int(self.cost_s(nbytes) * 1e3 * self.cycles_per_ms)
        link = self.stream

        def on_wire(f: torch.futures.Future) -> Any:
            # Runs on a stream that already waits for the collective (CUDA future semantics).
            cur = torch.cuda.current_stream()
            link.wait_stream(cur)          # start when the data is reduced and the link is free
            with torch.cuda.stream(link):
                torch.cuda._sleep(cycles)  # the bucket on the wire
            cur.wait_stream(link)          # consumers of the value wait for the wire
            return f.value()

        return then(fut, on_wire)

    def close(self) -> None:
        pass
