"""How many CPUs this process may really use, and so how many torch threads each rank gets.

`os.cpu_count()` counts the host's cores: on Binder or in a container with a 1-2 CPU quota it says
16, and 16 threads per rank fight over two CPUs. The CPUs this process may run on (its affinity,
`taskset`) and the cgroup's CPU quota (v2 `cpu.max`, v1 `cpu.cfs_quota_us`) bound what it gets.
An explicit OMP_NUM_THREADS (Binder's start script sets 1) is the user's choice and wins over
the even split. Plain Python: the kernel, the ranks and the shared config use it.
"""
from __future__ import annotations

import math
import os

__all__ = ["usable_cpus", "threads_per_rank"]


def usable_cpus(cgroup_file: str = "/proc/self/cgroup", cgroup_root: str = "/sys/fs/cgroup") -> int:
    """CPUs this process may use: its affinity, bounded by the cgroup CPU quota (rounded up), at least 1."""
    try:
        cpus = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):  # not Linux
        cpus = os.cpu_count() or 1
    quota = _quota_cpus(cgroup_file, cgroup_root)
    if quota is not None:
        cpus = min(cpus, max(1, math.ceil(quota)))
    return max(1, cpus)


def threads_per_rank(world_size: int, environ: dict[str, str] | None = None) -> int:
    """An explicit, positive OMP_NUM_THREADS; else the usable CPUs split evenly over the ranks, at least 1."""
    omp = (os.environ if environ is None else environ).get("OMP_NUM_THREADS", "").strip()
    if omp.isdigit() and int(omp) > 0:
        return int(omp)
    return max(1, usable_cpus() // max(1, world_size))


def _quota_cpus(cgroup_file: str, root: str) -> float | None:
    """The smallest CPU quota (in CPUs) on this process's cgroup path and its parents, or None."""
    try:
        with open(cgroup_file) as f:
            lines = f.read().splitlines()
    except OSError:
        return None
    found: list[float] = []
    for line in lines:
        _, controllers, path = (line.split(":", 2) + ["", ""])[:3]
        if controllers == "":  # cgroup v2: <root>/<path>/cpu.max holds "max 100000" or "200000 100000"
            found += [q for d in _dirs(root, path) if (q := _read_v2(os.path.join(d, "cpu.max"))) is not None]
        elif "cpu" in controllers.split(","):  # v1: cpu.cfs_quota_us (-1: none) / cpu.cfs_period_us
            base = os.path.join(root, controllers)
            if not os.path.isdir(base):
                base = os.path.join(root, "cpu")
            found += [q for d in _dirs(base, path) if (q := _read_v1(d)) is not None]
    return min(found) if found else None


def _dirs(base: str, path: str) -> list[str]:
    """The cgroup's directory and its parents up to the mount (in a container the path may be "/")."""
    parts = [p for p in path.strip("/").split("/") if p and p != ".."]
    return [os.path.join(base, *parts[:i]) for i in range(len(parts), -1, -1)]


def _read_v2(name: str) -> float | None:
    try:
        with open(name) as f:
            quota, period = (f.read().split() + ["100000"])[:2]
        return None if quota == "max" else int(quota) / int(period)
    except (OSError, ValueError, ZeroDivisionError):
        return None


def _read_v1(directory: str) -> float | None:
    try:
        with open(os.path.join(directory, "cpu.cfs_quota_us")) as f:
            quota = int(f.read())
        with open(os.path.join(directory, "cpu.cfs_period_us")) as f:
            period = int(f.read())
        return None if quota <= 0 else quota / period
    except (OSError, ValueError, ZeroDivisionError):
        return None
