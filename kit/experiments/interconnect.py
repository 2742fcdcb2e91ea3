"""Virtual interconnect: make a slow (or fast) network visible on one CPU machine.

The real all_reduce still runs (gloo over loopback, so results are exact); then the bucket
travels the emulated link, so its completion comes that much later:

    t_bucket = alpha + bytes * 2(n-1)/n / beta        (ring all-reduce, perf-theory.md §1)

Buckets queue on the link one after another (a link carries one transfer at a time), and the
delay is asynchronous: backward keeps computing while a bucket is "on the wire", exactly the
overlap DDP relies on. Link presets live in `config.INTERCONNECTS` (numbers cited there).
Runs that use it are labelled emulated. Sleep granularity on Linux is ~0.1 ms, so links whose
per-bucket time is below that (NVLink at small buckets) show little difference from loopback.
"""
from __future__ import annotations

import queue
import threading
import time
from typing import Any

import torch

__all__ = ["VirtualLink", "ring_allreduce_s"]


def ring_allreduce_s(nbytes: int, world_size: int, alpha_us: float, gbps: float) -> float:
    """Seconds for one ring all-reduce of `nbytes` on a link of `gbps` (1e9 bytes/s) and `alpha_us`."""
    return alpha_us * 1e-6 + nbytes * 2 * (world_size - 1) / world_size / (gbps * 1e9)


class VirtualLink:
    """A FIFO link: each transfer starts when the previous one left the wire."""

    def __init__(self, alpha_us: float, gbps: float, world_size: int):
        self.alpha_us, self.gbps, self.world_size = alpha_us, gbps, world_size
        self.free_at_s = 0.0
        self.q: "queue.Queue[tuple[Any, float, Any] | None]" = queue.Queue()
        self.thread = threading.Thread(target=self._deliver, name="kit-virtual-link", daemon=True)
        self.thread.start()

    def cost_s(self, nbytes: int) -> float:
        return ring_allreduce_s(nbytes, self.world_size, self.alpha_us, self.gbps)

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
