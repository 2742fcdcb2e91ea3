"""Rank side of `--profile` and `run(..., profile=PATH)`: torch.profiler on this rank, plus the
kit's own spans (the cell, an experiment's phases, every collective the ledger sees), all put on
this rank's perf_counter clock in microseconds. The kernel merges the ranks (kit/engine/trace.py).

Why a clock conversion: torch's profiler (Kineto) stamps events with the system clock
(CLOCK_REALTIME, ns since the epoch; its exported `ts` is relative to `baseTimeNanoseconds`),
while the kit stamps with perf_counter (CLOCK_MONOTONIC: one clock for every process on a host,
see kit/experiments/measure/clocks.py) and the ledger with time.monotonic. Reading two clocks back to
back, keeping the tightest of a few pairs, gives their offset to well under a microsecond.

Nothing here runs unless profiling was asked for: without it no profiler object exists.
"""
from __future__ import annotations

import contextlib
import gzip
import json
import os
import shutil
import socket
import sys
import tempfile
import time
from typing import Any, Callable, Iterator

from kit.rank import ledger as _ledger
from kit.units import MIB

__all__ = ["Recorder", "start", "stop", "boot_id", "clock_gap_ns", "MAX_EVENTS"]

MAX_EVENTS = 300_000  # per rank; about 60 MB of JSON. Beyond it the earliest events are kept, with a count.
RAW_CAP_BYTES = int(16 * MIB)  # torch's own trace file, gzipped, sent to the kernel up to this size (a reply holds 64 MiB)
_KEEP_PH = ("X", "s", "f")  # complete events and flow arrows; torch's metadata and bookkeeping instants are rebuilt
KIT_ROW, COMM_ROW = "kit", "kit: collectives"


def boot_id() -> str:
    """Same boot id (and host name) means the same kernel, so the same CLOCK_MONOTONIC."""
    try:
        with open("/proc/sys/kernel/random/boot_id") as f:
            return socket.gethostname() + ":" + f.read().strip()
    except OSError:
        return socket.gethostname()


def clock_gap_ns(a: Callable[[], int], b: Callable[[], int], tries: int = 9) -> int:
    """b - a, read back to back; the pair with the shortest read window is the tightest."""
    best: tuple[int, int] = (1 << 62, 0)
    for _ in range(tries):
        t0 = time.perf_counter_ns()
        va, vb = a(), b()
        width = time.perf_counter_ns() - t0
        if width < best[0]:
            best = (width, vb - va)
    return best[1]


@contextlib.contextmanager
def _quiet_fd2() -> Iterator[None]:
    """Kineto prints "USDT: ... profiler_start/stop" from C on fd 2 at every start and stop; on a
    rank that would be a red line per rank per cell. Only those two calls run with fd 2 muted."""
    sys.stderr.flush()
    saved = os.dup(2)
    try:
        null = os.open(os.devnull, os.O_WRONLY)
        os.dup2(null, 2)
        os.close(null)
        yield
    finally:
        os.dup2(saved, 2)
        os.close(saved)


class Recorder:
    """One profiling session on this rank: torch.profiler plus the kit's spans."""

    def __init__(self, rank: int, offset_us: float | None = None):
        self.rank = rank
        self.offset_us = offset_us  # this clock minus rank 0's, when the kit measured it (experiments)
        self.spans: list[dict[str, Any]] = []
        self._prof: Any = None
        self.start_us = self.end_us = 0.0
        self.requests: list[tuple[str, float]] = []  # (label, began at, perf us) of each request while profiling

    # -- the kit's spans -------------------------------------------------------------------------
    def span(self, name: str, start_us: float, end_us: float, cat: str = "kit", row: str = KIT_ROW,
             **args: Any) -> None:
        self.spans.append({"name": name, "cat": cat, "row": row, "start_us": start_us,
                           "end_us": max(end_us, start_us), "args": args})

    def _collective(self, entry: Any) -> None:
        """Ledger observer: every collective a rank's Python code calls, as one span."""
        if entry.ended_s is None:
            return
        shift = self._mono_to_perf_ns / 1e3
        self.span(entry.op, entry.started_s * 1e6 + shift, entry.ended_s * 1e6 + shift, cat="collective",
                  row=COMM_ROW, signature=entry.sig, line=entry.line, cell=entry.cell,
                  **({"error": entry.error.splitlines()[0]} if entry.error else {}))

    def _request(self, label: str) -> None:
        self.requests.append((label, time.perf_counter_ns() / 1e3))

    # -- lifecycle -------------------------------------------------------------------------------
    def start(self) -> "Recorder":
        torch = sys.modules.get("torch") or __import__("torch")
        from torch.profiler import ProfilerActivity, profile

        activities = [ProfilerActivity.CPU]
        if torch.cuda.is_available() and torch.cuda.is_initialized():
            activities.append(ProfilerActivity.CUDA)
        self._mono_to_perf_ns = clock_gap_ns(time.monotonic_ns, time.perf_counter_ns)
        self._prof = profile(activities=activities)
        with _quiet_fd2():
            self._prof.start()
        _ledger.observers.append(self._collective)
        _ledger.request_observers.append(self._request)
        self.start_us = time.perf_counter_ns() / 1e3
        return self

    def stop(self) -> dict[str, Any]:
        """Stop torch's profiler; this rank's events on its perf_counter clock (us)."""
        self.end_us = time.perf_counter_ns() / 1e3
        for hooks, hook in ((_ledger.observers, self._collective), (_ledger.request_observers, self._request)):
            if hook in hooks:
                hooks.remove(hook)
        prof, self._prof = self._prof, None
        with _quiet_fd2():
            prof.stop()
        wall_minus_perf_ns = clock_gap_ns(time.perf_counter_ns, time.time_ns)
        events, threads, dropped, raw_gz = _torch_events(prof, wall_minus_perf_ns)
        return {"rank": self.rank, "pid": os.getpid(), "boot_id": boot_id(), "offset_us": self.offset_us,
                "wall_minus_perf_us": wall_minus_perf_ns / 1e3, "start_us": self.start_us,
                "end_us": self.end_us, "spans": self.spans, "events": events, "threads": threads,
                "dropped": dropped, "torch_trace_gz": raw_gz}


def _torch_events(prof: Any, wall_minus_perf_ns: int) -> tuple[list[dict[str, Any]], dict[str, str], int,
                                                                 bytes | None]:
    """torch's own Chrome trace (export_chrome_trace), its timestamps moved to perf_counter us for the
    merged trace; and the file itself, gzipped, as TensorBoard's profiler plugin and HolisticTraceAnalysis
    read it (its `distributedInfo` names the rank; None past RAW_CAP_BYTES). Written to a private
    directory, read, removed: the kernel writes the files where the user asked, whichever host ran the rank."""
    tmp = tempfile.mkdtemp(prefix="kit-profile-")
    try:
        path = os.path.join(tmp, "trace.json")
        prof.export_chrome_trace(path)
        with open(path, "rb") as f:
            text = f.read()
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    raw = json.loads(text)
    packed = gzip.compress(text, compresslevel=1)
    raw_gz = packed if len(packed) <= RAW_CAP_BYTES else None
    # ts_wall_us = ts + base/1000; perf_us = ts_wall_us - wall_minus_perf/1000. Integers in ns first:
    # epoch microseconds as a float keep only ~0.25 us, perf_counter microseconds keep nanoseconds.
    shift_us = (int(raw.get("baseTimeNanoseconds", 0)) - wall_minus_perf_ns) / 1e3
    threads: dict[str, str] = {}
    events: list[dict[str, Any]] = []
    dropped = 0
    for ev in raw.get("traceEvents", []):
        ph = ev.get("ph")
        if ph == "M" and ev.get("name") == "thread_name":
            threads[f"{ev.get('pid')}/{ev.get('tid')}"] = str((ev.get("args") or {}).get("name", ""))
        if ph not in _KEEP_PH or ev.get("cat") == "Trace" or "ts" not in ev:
            continue
        if len(events) >= MAX_EVENTS:
            dropped += 1
            continue
        ev = dict(ev)
        ev["ts"] = float(ev["ts"]) + shift_us
        events.append(ev)
    return events, threads, dropped, raw_gz


_ACTIVE: dict[str, Recorder] = {}  # the cell being profiled (`%%distributed --profile`)


def start() -> float:
    """Called by the kernel right before a profiled cell; returns this rank's start (perf_counter us)."""
    dist = sys.modules.get("torch.distributed")
    rank = dist.get_rank() if dist is not None and dist.is_initialized() else 0
    old = _ACTIVE.pop("cell", None)
    if old is not None and old._prof is not None:  # a previous profiled cell never got its stop (kernel died)
        old.stop()
    return _ACTIVE.setdefault("cell", Recorder(rank)).start().start_us


def stop() -> dict[str, Any] | None:
    """Called by the kernel right after the profiled cell, even when it failed."""
    rec = _ACTIVE.pop("cell", None)
    if rec is None or rec._prof is None:
        return None
    # The requests seen while profiling: the cell(s), then this stop call. Each request lasts until the
    # next one begins (the wait in between is the kernel's, not the rank's, and is short).
    for (label, began), (_, ended) in zip(rec.requests, rec.requests[1:]):
        rec.span(label, began, ended, cat="cell")
    return rec.stop()
