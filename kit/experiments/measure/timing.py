"""Where the time of one training step went, measured on each rank.

Method (say it, then validate it in the tests):
- Every boundary is a *stamp* from stamps.py: perf_counter on CPU; on CUDA an event recorded on
  the current stream, resolved to ms after the step, so a stamp means "the device got here",
  not "the CPU queued it" (NCCL futures complete at enqueue; hooks fire at enqueue).
- Phase boundaries (forward / backward / optimizer) are stamps around each phase.
- Backward *compute* ends when the last parameter gradient is accumulated: a
  `register_post_accumulate_grad_hook` on every parameter stamps the time; we keep the latest.
- Communication: each all_reduce is an interval [launched, completed]; the DDP comm hook
  stamps the launch and a `.then` callback on its future stamps the completion (on CUDA that
  callback runs on a stream that waits for the collective, so its event is device completion).
- overlapped = length of (union of comm intervals) inside [backward start, backward compute end];
  exposed = the rest of the union, i.e. comm the step had to wait for after compute was done.
  So comm_ms == comm_overlap_ms + comm_exposed_ms by construction. `breakdown_ms` is that
  arithmetic alone (pure floats), so a test drives it with a fake clock.
- The optimizer phase, and only it, is also timed in CPU time (`opt_cpu_ms`: `time.process_time`,
  every thread of the rank's process; no other phase reads that clock): the work, where `opt_ms`
  (the wall clock) also holds the time the rank waited for a core on a busy machine. No collective
  runs in that phase (ZeRO-1's broadcast is its own), so no other thread's CPU time is in it. On a
  GPU it is the host's CPU time (queuing kernels), not the device's.
"""
from __future__ import annotations

import time
from contextlib import contextmanager
from typing import Any, Callable, Iterator

from kit.experiments.measure.stamps import Stamp, Stamps, stamps_for

__all__ = ["StepClock", "union_ms", "clip_ms", "breakdown_ms"]

Event = tuple[str, str, float, float]  # (name, kind, start_ms, end_ms)


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


def breakdown_ms(events: list[Event], comm: list[tuple[float, float]], last_grad_ms: float) -> dict[str, float]:
    """Phase sums and overlapped/exposed comm of one step, from resolved times (ms).

    `comm` holds the hook-measured intervals; events of kind "comm" (naive DP's blocking
    all-reduce, pipeline sends) count as comm too.
    """
    out = {"fwd_ms": 0.0, "bwd_ms": 0.0, "opt_ms": 0.0, "comm_ms": 0.0, "comm_overlap_ms": 0.0,
           "comm_exposed_ms": 0.0}
    intervals = list(comm)
    for name, kind, s, e in events:
        key = {"forward": "fwd_ms", "optimizer": "opt_ms"}.get(name)
        if key:
            out[key] += e - s
        if kind == "comm":
            intervals.append((s, e))
    merged = union_ms(intervals)
    comm_total = sum(e - s for s, e in merged)
    overlap = 0.0
    for n, _, s, e in events:
        if n != "backward":
            continue
        # Backward compute ends at the last gradient stamp (inside backward()), or at
        # backward()'s return when no hook fired (e.g. no parameters on this rank).
        c_end = last_grad_ms if s <= last_grad_ms <= e else e
        out["bwd_ms"] += c_end - s
        overlap += clip_ms(merged, s, c_end)
    out["comm_ms"], out["comm_overlap_ms"] = comm_total, overlap
    out["comm_exposed_ms"] = max(0.0, comm_total - overlap)
    return out


class StepClock:
    """Per-step phase timer. With `enabled=False` only the whole step is timed (the baseline
    for measuring the instrumentation's own overhead). `stamps` overrides the time source
    (tests pass a fake clock)."""

    def __init__(self, enabled: bool = True, device_type: str = "cpu", stamps: Stamps | None = None,
                 cpu_s: Callable[[], float] = time.process_time):
        self.enabled = enabled
        self.stamps = stamps or stamps_for(device_type)
        self.cpu_s = cpu_s  # the process's CPU time in s (tests pass a fake)
        self._opt_cpu_ms = 0.0  # this step's CPU ms in the optimizer phase, the only one reported
        self.rows: list[dict[str, Any]] = []
        self.events: list[Event] = []  # resolved after end(); raw stamps while the step runs
        self.comm: list[tuple[float, float]] = []
        self.last_grad_ms = 0.0
        self.t0 = 0.0
        # The run's common origin in this rank's clock (clocks.py); timelines are relative to it.
        self.origin_ms: float | None = None
        self._raw: list[tuple[str, str, Stamp, Stamp]] = []
        self._raw_comm: list[tuple[Stamp, Stamp]] = []
        self._last_grad: Stamp | None = None
        self._t0: Stamp = 0.0

    def now(self) -> Stamp:
        """A stamp (float ms on CPU, a CUDA event on GPU); resolved to ms at end()."""
        return self.stamps.stamp()

    # -- hooks ---------------------------------------------------------------------------------
    def watch_grads(self, params: Any) -> list[Any]:
        """Stamp the time every gradient lands; the latest stamp is the end of backward compute."""
        if not self.enabled:
            return []

        def stamp(_p: Any) -> None:
            self._last_grad = self.stamps.stamp()

        return [p.register_post_accumulate_grad_hook(stamp) for p in params if p.requires_grad]

    def comm_interval(self, start: Stamp, end: Stamp) -> None:
        self._raw_comm.append((start, end))

    def add_phase(self, name: str, kind: str, start: Stamp, end: Stamp) -> None:
        """A phase timed elsewhere: an asynchronous collective, from its launch to its completion."""
        if self.enabled:
            self._raw.append((name, kind, start, end))

    # -- phases -----------------------------------------------------------------------------------
    def begin(self) -> None:
        self._raw, self._raw_comm, self._last_grad, self._opt_cpu_ms = [], [], None, 0.0
        self.stamps.begin()
        self._t0 = self.stamps.stamp()

    @contextmanager
    def phase(self, name: str, kind: str = "compute") -> Iterator[None]:
        """Time a block; repeated names (micro-batches) add up. Only the optimizer phase also reads
        the CPU clock (`opt_cpu_ms`): the other phases pay for their wall-clock stamps alone."""
        if not self.enabled:
            yield
            return
        cpu = name == "optimizer"
        s, c = self.stamps.stamp(), (self.cpu_s() if cpu else 0.0)
        try:
            yield
        finally:
            self._raw.append((name, kind, s, self.stamps.stamp()))
            if cpu:
                self._opt_cpu_ms += 1e3 * (self.cpu_s() - c)

    def resolved_events(self) -> list[Event]:
        """The current step's events so far, in ms (on CUDA this waits for the device)."""
        r = self.stamps.resolve
        return [(n, k, r(s), r(e)) for n, k, s, e in self._raw]

    def end(self, step: int, rank: int, loss: float, samples: int, keep: bool) -> dict[str, Any]:
        t_end = self.stamps.stamp()
        r = self.stamps.resolve
        self.t0 = r(self._t0)
        self.events = self.resolved_events()
        self.comm = [(r(s), r(e)) for s, e in self._raw_comm]
        self.last_grad_ms = r(self._last_grad) if self._last_grad is not None else 0.0
        row: dict[str, Any] = {"step": step, "rank": rank, "step_ms": r(t_end) - self.t0, "loss": float(loss),
                               "samples": int(samples)}
        if self.enabled:
            row.update(breakdown_ms(self.events, self.comm, self.last_grad_ms))
        else:
            row.update(breakdown_ms([], [], 0.0))
        row["opt_cpu_ms"] = self._opt_cpu_ms
        if keep:
            self.rows.append(row)
        return row

    def timeline(self, rank: int, step: int | None = None) -> list[dict[str, Any]]:
        """The last step's events, relative to the run's common origin when one was agreed
        (so ranks line up), else to this rank's step start."""
        origin = self.t0 if self.origin_ms is None else self.origin_ms
        extra = {} if step is None else {"step": step}
        out = []
        for name, kind, s, e in self.events:
            if name == "backward" and s <= self.last_grad_ms <= e:
                e = self.last_grad_ms  # the rest of backward() is waiting for comm
            out.append({"rank": rank, "name": name, "kind": kind, "start_ms": s - origin, "end_ms": e - origin,
                        **extra})
        for i, (s, e) in enumerate(sorted(self.comm)):
            out.append({"rank": rank, "name": f"all_reduce #{i}", "kind": "comm",
                        "start_ms": s - origin, "end_ms": e - origin, **extra})
        return sorted(out, key=lambda ev: ev["start_ms"])
