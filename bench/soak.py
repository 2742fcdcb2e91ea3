"""Soak: the pool survives many faulty cells without leaking processes, descriptors or memory.

Runs N cells on one 2-rank cluster, alternating a faulty cell (raise on one rank, interrupt via
`_thread.interrupt_main`, mismatched collective) with a healthy one that checks variables and an
all_reduce. Prints pids, open file descriptors (kernel and workers, /proc/<pid>/fd) and kernel RSS
before and after. Exit status 1 if anything grew beyond noise or a cell misbehaved.

    python bench/soak.py            # 200 cells
    python bench/soak.py --cells 40
"""
from __future__ import annotations

import _thread
import argparse
import gc
import os
import sys
import threading
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from kit.engine.cluster import Cluster  # noqa: E402
from kit.config import LaunchConfig  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _kernel import alive, descendants  # noqa: E402

FAULTS = {
    "raise": "if rank == 1:\n    raise ValueError('soak')\nt = torch.ones(2)\ndist.all_reduce(t)",
    "interrupt": "while True:\n    pass",
    "mismatch": "t = torch.ones(2 + rank)\ndist.all_reduce(t)",
}
HEALTHY = "t = torch.ones(2) * (rank + 1)\ndist.all_reduce(t)\n(kept, t.sum().item())"
RSS_NOISE_MIB = 20.0


def _fds(pid: int) -> int:
    try:
        return len(os.listdir(f"/proc/{pid}/fd"))
    except OSError:
        return -1


def _rss_mib(pid: int) -> float:
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    return 0.0


def _children() -> list[int]:
    """Every live process under this one: forked ranks are the rank template's children, not ours."""
    return sorted(p for p in descendants(os.getpid()) if alive(p))


def snapshot(c: Cluster) -> dict[str, object]:
    gc.collect()
    return {"children": _children(), "workers": sorted(c.pids.values()), "threads": threading.active_count(), "kernel_fds": _fds(os.getpid()),
            "worker_fds": {r: _fds(p) for r, p in c.pids.items()}, "kernel_rss_mib": round(_rss_mib(os.getpid()), 1),
            "worker_rss_mib": {r: round(_rss_mib(p), 1) for r, p in c.pids.items()}}


def run_cell(c: Cluster, kind: str) -> str | None:
    """Run one cell; return a complaint, or None when it behaved as expected."""
    if kind == "healthy":
        r = c.run(HEALTHY, on_output=lambda *a: None)
        return None if r.values == {0: (0, 6.0), 1: (1, 6.0)} else f"healthy cell gave {r.values} {r.failures}"
    timer = threading.Timer(0.3, _thread.interrupt_main) if kind == "interrupt" else None
    if timer:
        timer.start()
    try:
        r = c.run(FAULTS[kind], on_output=lambda *a: None)
    finally:
        if timer:
            timer.join()
    if r.ok or c.state != "ready":
        return f"{kind} cell: ok={r.ok} state={c.state}"
    return None


def soak(cells: int, warmup: int = 6) -> tuple[dict[str, object], dict[str, object], list[str]]:
    problems: list[str] = []
    c = Cluster(LaunchConfig(world_size=2, pg_timeout_s=5.0)).start()
    try:
        c.run("kept = rank", on_output=lambda *a: None)
        kinds = [k for f in FAULTS for k in (f, "healthy")]
        for i in range(warmup):  # first use of each path allocates caches once
            run_cell(c, kinds[i % len(kinds)])
        before = snapshot(c)
        t0 = time.monotonic()
        for i in range(cells):
            complaint = run_cell(c, kinds[i % len(kinds)])
            if complaint:
                problems.append(f"cell {i}: {complaint}")
        after = snapshot(c)
        after["seconds"] = round(time.monotonic() - t0, 1)
    finally:
        c.shutdown()
    if after["children"] != before["children"]:
        problems.append(f"child processes changed: {before['children']} -> {after['children']}")
    if after["kernel_fds"] > before["kernel_fds"] or after["threads"] > before["threads"]:
        problems.append("kernel fds or threads grew")
    for r, n in after["worker_fds"].items():  # type: ignore[union-attr]
        if n > before["worker_fds"][r]:  # type: ignore[index]
            problems.append(f"rank {r} fds grew {before['worker_fds'][r]} -> {n}")  # type: ignore[index]
    if after["kernel_rss_mib"] - before["kernel_rss_mib"] > RSS_NOISE_MIB:  # type: ignore[operator]
        problems.append(f"kernel RSS grew by more than {RSS_NOISE_MIB} MiB")
    return before, after, problems


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--cells", type=int, default=200)
    n = ap.parse_args().cells
    before, after, problems = soak(n)
    print(f"{n} cells ({n // 2} faulty: raise / interrupt / mismatch; {n - n // 2} healthy) in {after['seconds']} s")
    for key in ("children", "threads", "kernel_fds", "worker_fds", "kernel_rss_mib", "worker_rss_mib"):
        print(f"  {key:15} before {before[key]}  after {after[key]}")
    print("PASS: nothing grew beyond noise" if not problems else "FAIL:\n  " + "\n  ".join(problems))
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
