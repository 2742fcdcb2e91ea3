"""Where the time of one training step went, measured on each rank.

Method (say it, then validate it in the tests):
- Phase boundaries (forward / backward / optimizer) are `time.perf_counter()` stamps; on CUDA
  the device is synchronised first so a stamp means "the GPU finished", not "the CPU queued it".
- Backward *compute* ends when the last parameter gradient is accumulated: a
  `register_post_accumulate_grad_hook` on every parameter stamps the time; we keep the latest.
- Communication: each all_reduce is an interval [launched, completed]; the DDP comm hook
  stamps the launch and a `.then` callback on its future stamps the completion.
- overlapped = length of (union of comm intervals) inside [backward start, backward compute end];
  exposed = the rest of the union, i.e. comm the step had to wait for after compute was done.
  So comm_ms == comm_overlap_ms + comm_exposed_ms by construction.
"""
from __future__ import annotations

import time
from contextlib import contextmanager
from typing import Any, Iterator

import torch

__all__ = ["StepClock", "union_ms", "clip_ms"]


def union_ms(intervals: list[tuple[float, float]]) -> list[tuple[float, float]]:
    """Merge overlapping [start, end] intervals (ms) into disjoint ones."""
    out: list[tuple[float, float]] = []
    for s, e in sorted(intervals):
        if out and s <= out[-1][1]:
            out[-1] = (out[-1][0], max(out[-1][1], e))
        else:
            out.append((s, e))
    return out


def clip_ms(intervals: list[tuple[float, float]], lo: float, hi: float) -> float:
    """Total length of the (disjoint) intervals that falls inside [lo, hi]."""
    return sum(max(0.0, min(e, hi) - max(s, lo)) for s, e in intervals)


class StepClock:
    """Per-step phase timer. With `enabled=False` only the whole step is timed (the baseline
    for measuring the instrumentation's own overhead)."""

    def __init__(self, enabled: bool = True, device_type: str = "cpu"):
        self.enabled = enabled
        self.cuda = device_type == "cuda"
        self.rows: list[dict[str, Any]] = []
        self.events: list[tuple[str, str, float, float]] = []  # (name, kind, start_ms, end_ms)
        self.comm: list[tuple[float, float]] = []
        self.last_grad_ms = 0.0
        self.marks: dict[str, float] = {}
        self.t0 = 0.0

    def now_ms(self) -> float:
        if self.cuda:
            torch.cuda.synchronize()
        return time.perf_counter() * 1e3

    # -- hooks ---------------------------------------------------------------------------------
    def watch_grads(self, params: Any) -> list[Any]:
        """Stamp the time every gradient lands; the latest stamp is the end of backward compute."""
        if not self.enabled:
            return []

        def stamp(_p: torch.Tensor) -> None:
            self.last_grad_ms = time.perf_counter() * 1e3

        return [p.register_post_accumulate_grad_hook(stamp) for p in params if p.requires_grad]

    def comm_interval(self, start_ms: float, end_ms: float) -> None:
        self.comm.append((start_ms, end_ms))

    # -- phases -----------------------------------------------------------------------------------
    def begin(self) -> None:
        self.events, self.comm, self.marks = [], [], {}
        self.last_grad_ms = 0.0
        self.t0 = self.now_ms()

    @contextmanager
    def phase(self, name: str, kind: str = "compute") -> Iterator[None]:
        """Time a block; repeated names (micro-batches) add up."""
        if not self.enabled:
            yield
            return
        s = self.now_ms()
        try:
            yield
        finally:
            e = self.now_ms()
            self.events.append((name, kind, s, e))
            if name in ("backward",):
                self.marks.setdefault("bwd_start", s)
                self.marks["bwd_end_call"] = e

    def end(self, step: int, rank: int, loss: float, samples: int, keep: bool) -> dict[str, Any]:
        t_end = self.now_ms()
        row: dict[str, Any] = {"step": step, "rank": rank, "fwd_ms": 0.0, "bwd_ms": 0.0, "opt_ms": 0.0,
                               "step_ms": t_end - self.t0, "comm_ms": 0.0, "comm_overlap_ms": 0.0,
                               "comm_exposed_ms": 0.0, "loss": float(loss), "samples": int(samples)}
        if self.enabled:
            for name, kind, s, e in self.events:
                key = {"forward": "fwd_ms", "optimizer": "opt_ms"}.get(name)
                if key:
                    row[key] += e - s
                if kind == "comm" and name != "exposed wait":
                    self.comm.append((s, e))
            merged = union_ms(self.comm)
            comm = sum(e - s for s, e in merged)
            bwd = [(s, e) for n, _, s, e in self.events if n == "backward"]
            overlap = 0.0
            if bwd:
                # Backward compute ends at the last gradient stamp (inside backward()), or at
                # backward()'s return when no hook fired (e.g. no parameters on this rank).
                for s, e in bwd:
                    c_end = self.last_grad_ms if s <= self.last_grad_ms <= e else e
                    row["bwd_ms"] += c_end - s
                    overlap += clip_ms(merged, s, c_end)
            row["comm_ms"], row["comm_overlap_ms"] = comm, overlap
            row["comm_exposed_ms"] = max(0.0, comm - overlap)
        if keep:
            self.rows.append(row)
        return row

    def timeline(self, rank: int) -> list[dict[str, Any]]:
        """The last step's events relative to its start (for the timeline plot)."""
        out = []
        for name, kind, s, e in self.events:
            if kind == "comm":
                continue  # listed below with the hook-measured intervals
            if name == "backward" and s <= self.last_grad_ms <= e:
                e = self.last_grad_ms  # the rest of backward() is waiting for comm
            out.append({"rank": rank, "name": name, "kind": kind, "start_ms": s - self.t0, "end_ms": e - self.t0})
        for i, (s, e) in enumerate(sorted(self.comm)):
            out.append({"rank": rank, "name": f"all_reduce #{i}", "kind": "comm",
                        "start_ms": s - self.t0, "end_ms": e - self.t0})
        return sorted(out, key=lambda ev: ev["start_ms"])
