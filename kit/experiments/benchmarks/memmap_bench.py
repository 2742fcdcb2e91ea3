"""Data larger than memory, kernel side: `memmap_benchmark(size_mb=...)` writes a dataset file,
has every rank read it through np.memmap + DistributedSampler, and returns one record.

No torch here (the kernel stays light). What the record shows, per configuration
(memmap with each `num_workers`, then the in-memory copy memmap replaces):
- per rank: peak RSS and PSS above the rank's level before the dataset was opened, rank plus
  its DataLoader workers; and for the ranks together the peak over time of their sum (samples
  on one clock). RSS counts every mapped file page in every process that maps it (the kernel
  maps up to 16 cached neighbours per fault, so a rank's RSS nears the whole file in a warm
  epoch); PSS shares each page out, so the ranks' PSS together comes to about one copy of the
  file, where the in-memory copy costs a full private copy per rank.
- per epoch: samples/s over all ranks and the fraction of the file in the page cache before
  it (epoch 0 cold after POSIX_FADV_DONTNEED, epoch 1 warm: served from RAM, no disk).

Binder gives 1-2 GB for the kernel and the ranks together (about 220 MB per torch rank):
`memmap_benchmark(size_mb=1536, in_memory=False, budget_mb=2048)` there reads a file bigger
than any rank could hold; the in-memory copy of it is refused, with the arithmetic.
"""
from __future__ import annotations

import os
import shutil
import tempfile
import time
from typing import Any, Sequence

from kit.units import MIB


__all__ = ["memmap_benchmark", "MemmapBenchError", "mem_available_mib", "fs_type", "summarize", "cached_before_line"]

SCHEMA = "kit.memmap/1"
COLD_METHOD = ("fsync + posix_fadvise(POSIX_FADV_DONTNEED) on the file before each configuration (no root "
               "needed; drop_caches is root-only); cached_before = page-cache fraction from mincore(2)")


class MemmapBenchError(ValueError):
    """An impossible or unsafe request; the message says what to change."""


def mem_available_mib() -> float | None:
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) / 1024.0
    except OSError:
        pass
    return None


def fs_type(path: str) -> str:
    """The filesystem type of the mount holding `path` (longest matching mount point)."""
    best, kind = "", "unknown"
    try:
        with open("/proc/mounts") as f:
            for line in f:
                parts = line.split()
                if len(parts) > 2 and (path == parts[1] or path.startswith(parts[1].rstrip("/") + "/")) \
                        and len(parts[1]) >= len(best):
                    best, kind = parts[1], parts[2]
    except OSError:
        pass
    return kind


def _check(size_mb: float, world_size: int, batch_size: int, num_workers: Sequence[int], epochs: int,
           sample_kib: float, directory: str, in_memory: bool, budget_mb: float | None) -> int:
    """Validate; returns the number of samples (a multiple of world_size: no padding, no drops)."""
    for name, v, low in (("size_mb", size_mb, 0.0), ("sample_kib", sample_kib, 0.0)):
        if isinstance(v, bool) or not isinstance(v, (int, float)) or v <= low:
            raise MemmapBenchError(f"{name}={v!r} must be a number > 0 (e.g. size_mb=64 here, 1536 on Binder)")
    for name, v, low in (("world_size", world_size, 1), ("batch_size", batch_size, 1), ("epochs", epochs, 2)):
        if isinstance(v, bool) or not isinstance(v, int) or v < low:
            extra = " (epoch 0 is read cold, epoch 1 warm: the comparison needs both)" if name == "epochs" else ""
            raise MemmapBenchError(f"{name}={v!r} must be an integer >= {low}{extra}")
    if not num_workers or any(isinstance(w, bool) or not isinstance(w, int) or w < 0 for w in num_workers):
        raise MemmapBenchError(f"num_workers={list(num_workers)!r} must be a list of integers >= 0, e.g. [0, 2]")
    sample_bytes = int(sample_kib * 1024) // 4 * 4
    if sample_bytes < 8:
        raise MemmapBenchError(f"sample_kib={sample_kib} is below 8 bytes (an index and one value)")
    n = int(size_mb * MIB) // sample_bytes // world_size * world_size
    if n < world_size:
        raise MemmapBenchError(f"size_mb={size_mb} holds fewer than one sample of {sample_kib} KiB per rank; "
                               "use a larger size_mb or a smaller sample_kib")
    if not os.path.isdir(directory) or not os.access(directory, os.W_OK):
        raise MemmapBenchError(f"directory={directory!r} is not a writable folder")
    if fs_type(os.path.realpath(directory)) in ("tmpfs", "ramfs"):
        raise MemmapBenchError(f"{directory!r} is on {fs_type(os.path.realpath(directory))}: a file there lives "
                               "in RAM, so memmap saves nothing and no epoch is cold; pass directory= on a disk")
    free_mib = shutil.disk_usage(directory).free / MIB
    if size_mb > 0.9 * free_mib:
        raise MemmapBenchError(f"size_mb={size_mb:g} does not fit the {free_mib:.0f} MiB free in {directory!r}")
    if in_memory:
        need = world_size * size_mb  # every rank holds a private copy: what memmap avoids
        avail = mem_available_mib()
        if budget_mb is not None and need > budget_mb:
            raise MemmapBenchError(
                f"the in-memory copy needs {world_size} x {size_mb:g} = {need:g} MiB in the ranks, over "
                f"budget_mb={budget_mb:g}: that is the point of memmap. Pass in_memory=False to read the "
                "file through memmap only, or a size_mb under the budget to see both")
        if avail is not None and need > 0.8 * avail:
            raise MemmapBenchError(
                f"the in-memory copy needs {need:g} MiB but this machine has {avail:.0f} MiB available; "
                "pass in_memory=False (memmap alone) or a smaller size_mb")
    return n


def memmap_benchmark(size_mb: float = 64.0, world_size: int = 2, batch_size: int = 64,
                     num_workers: Sequence[int] = (0, 2), epochs: int = 2, in_memory: bool = True,
                     sample_kib: float = 4.0, directory: str | None = None, budget_mb: float | None = None,
                     seed: int = 0, track_ids: bool = False, cluster: Any = None,
                     device: str = "cpu") -> dict[str, Any]:
    """Write a `size_mb` file, read it on `world_size` ranks per config, return the record.

    `budget_mb`: the memory the ranks may use together (Binder: 1-2 GB with the kernel); the
    record marks it and the in-memory copy is refused when it would not fit. `track_ids`:
    return every sample index each rank read (tests; large for big files).
    """
    directory = directory or tempfile.gettempdir()
    n = _check(size_mb, world_size, batch_size, list(num_workers), epochs, sample_kib, directory, in_memory,
               budget_mb)
    floats = int(sample_kib * 1024) // 4
    from kit.experiments.api import cluster_for  # the shared ranks when they fit (Binder: one set)
    c = cluster_for(world_size, cluster, device)
    fd, path = tempfile.mkstemp(prefix="kit-memmap-", suffix=".npy", dir=directory)
    os.close(fd)
    try:
        t0 = time.perf_counter()
        c.call("kit.experiments.benchmarks.memmap_data:write_dataset", path, n, floats, seed, ranks=[0])
        write_s = time.perf_counter() - t0
        file_mib = os.path.getsize(path) / MIB
        per_rank = c.call("kit.experiments.benchmarks.memmap_data:memmap_rank", path, batch_size, list(num_workers),
                          epochs, in_memory, seed, track_ids)
    finally:
        os.unlink(path)  # a fresh file each call: nothing large is left behind
    cfg = {"size_mb": size_mb, "world_size": world_size, "batch_size": batch_size, "num_workers": list(num_workers),
           "epochs": epochs, "in_memory": in_memory, "sample_kib": sample_kib, "budget_mb": budget_mb, "seed": seed}
    file = {"mib": file_mib, "samples": n, "sample_bytes": 4 * floats, "fs_type": fs_type(os.path.realpath(directory)),
            "directory": directory, "write_s": write_s}
    return summarize([per_rank[r] for r in sorted(per_rank)], cfg, file, track_ids)


def _coverage(parts: list[dict[str, Any]], run_i: int, n: int) -> dict[str, Any]:
    """Every sample exactly once per epoch over the ranks; a new split per epoch (set_epoch)."""
    epochs = len(parts[0]["runs"][run_i]["epochs"])
    once, per_rank_sets = True, []
    for e in range(epochs):
        ids = [i for p in parts for i in p["runs"][run_i]["epochs"][e]["ids"]]
        once = once and sorted(ids) == list(range(n))
        per_rank_sets.append(sorted(parts[0]["runs"][run_i]["epochs"][e]["ids"]))
    reshuffled = len(parts) == 1 or any(s != per_rank_sets[0] for s in per_rank_sets[1:])
    return {"each_sample_once_per_epoch": once, "rank0_set_changes_between_epochs": reshuffled}


def summarize(parts: list[dict[str, Any]], cfg: dict[str, Any], file: dict[str, Any],
              track_ids: bool = False) -> dict[str, Any]:
    """The ranks' raw numbers -> one JSON-serialisable record (pure: tests drive it directly)."""
    runs = []
    for i, r0 in enumerate(parts[0]["runs"]):
        per_rank, epochs = [], []
        for p in parts:
            r = p["runs"][i]
            peak = {k: max(e["peak_mib"][k] for e in r["epochs"]) for k in ("rss", "pss", "pss_file", "pss_anon")}
            per_rank.append({"rank": p["rank"], "peak_rss_mib": peak["rss"], "peak_pss_mib": peak["pss"],
                             "extra_rss_mib": peak["rss"] - r["base_mib"]["rss"],
                             "extra_pss_mib": peak["pss"] - r["base_mib"]["pss"],
                             "pss_file_mib": peak["pss_file"], "pss_anon_mib": peak["pss_anon"],
                             "baseline_rss_mib": r["base_mib"]["rss"], "load_s": r["load_s"]})
        for e, ep in enumerate(r0["epochs"]):
            secs = max(p["runs"][i]["epochs"][e]["seconds"] for p in parts)  # an epoch ends with its slowest rank
            samples = sum(p["runs"][i]["epochs"][e]["samples"] for p in parts)
            epochs.append({"epoch": e, "seconds": secs, "samples": samples,
                           "samples_per_s": samples / secs if secs else 0.0,
                           "mib_per_s": samples * file["sample_bytes"] / MIB / secs if secs else 0.0,
                           "cached_before": ep["cached_before"], "cold": e == 0 and r0["mode"] == "memmap"})
        together = _peak_of_sum([p["runs"][i] for p in parts])
        run = {"mode": r0["mode"], "num_workers": r0["num_workers"], "label": _label(r0),
               "cached_at_start": r0["cached_at_start"], "per_rank": per_rank, "epochs": epochs,
               "sum_extra_rss_mib": together["rss"], "sum_extra_pss_mib": together["pss"],
               "warm_over_cold": epochs[1]["samples_per_s"] / epochs[0]["samples_per_s"]
               if len(epochs) > 1 and epochs[0]["samples_per_s"] else None}
        if track_ids:
            run["coverage"] = _coverage(parts, i, file["samples"])
            run["ids"] = {p["rank"]: [ep["ids"] for ep in p["runs"][i]["epochs"]] for p in parts}
        runs.append(run)
    notes = [f"cold first epoch: {COLD_METHOD}",
             "extra_* = peak minus the rank's level just before the dataset was opened (torch itself is "
             f"~{parts[0]['baseline_mib']['rss']:.0f} MiB RSS per rank); rank + its DataLoader workers",
             "RSS counts a shared page in every process that maps it; PSS divides it among them, so "
             "sum_extra_pss_mib (the peak over time of the ranks' sum, from 0.1 s samples on one clock) is "
             "the honest total; per-rank peaks happen at different moments and do not add up"]
    if cfg.get("budget_mb") is not None and file["mib"] > cfg["budget_mb"] / cfg["world_size"]:
        notes.append(f"the file ({file['mib']:.0f} MiB) is larger than one rank's share of budget_mb="
                     f"{cfg['budget_mb']:g}: an in-memory copy per rank would not fit")
    return {"schema": SCHEMA, "created_unix_s": time.time(), "config": cfg, "file": file,
            "cold_method": COLD_METHOD, "runs": runs, "notes": notes}


def cached_before_line(result: dict[str, Any]) -> str:
    """How much of the file was in the page cache as each epoch began, over a benchmark's runs, e.g.
    "file's pages in the page cache as each epoch began, 6 runs: epoch 0 0%, epoch 1 100%". A run's
    `cached_before` is a fraction of the file's pages (0-1); None, where mincore could not say, is "not measured"
    (lesson 09 printed the raw pairs, "[(0.0, 1.0)]", and counted None as 0)."""
    runs = result.get("runs") or []
    shown = []
    for e in range(max((len(r["epochs"]) for r in runs), default=0)):
        got = [r["epochs"][e].get("cached_before") for r in runs if e < len(r["epochs"])]
        pct = sorted(round(100 * v) for v in got if v is not None)
        say = "not measured" if not pct else f"{pct[0]}%" if pct[0] == pct[-1] else f"{pct[0]}-{pct[-1]}%"
        missing = got.count(None) if pct else 0
        shown.append(f"epoch {e} {say}" + (f" ({missing} not measured)" if missing else ""))
    return (f"file's pages in the page cache as each epoch began, {len(runs)} run{'s' if len(runs) != 1 else ''}: "
            + (", ".join(shown) or "no epochs"))


def _peak_of_sum(rank_runs: list[dict[str, Any]]) -> dict[str, float]:
    """Peak over time of the ranks' summed extra RSS and PSS (each rank's value at a moment is
    its last sample before it). Not the sum of per-rank peaks: PSS moves as mappers come and
    go, and two ranks' peaks at different moments would count a shared page twice."""
    series = []
    for r in rank_runs:
        base = r["base_mib"]
        series.append([(t, rss - base["rss"], pss - base["pss"]) for e in r["epochs"] for t, rss, pss in e["series"]])
    times = sorted({row[0] for s in series for row in s})
    best = {"rss": 0.0, "pss": 0.0}
    idx = [0] * len(series)
    last: list[tuple[float, float]] = [(0.0, 0.0)] * len(series)
    for t in times:  # one sweep over the merged clock
        for k, s in enumerate(series):
            while idx[k] < len(s) and s[idx[k]][0] <= t:
                last[k] = (s[idx[k]][1], s[idx[k]][2])
                idx[k] += 1
        best["rss"] = max(best["rss"], sum(v[0] for v in last))
        best["pss"] = max(best["pss"], sum(v[1] for v in last))
    return best


def _label(run: dict[str, Any]) -> str:
    return "in-memory copy" if run["mode"] == "in_memory" else f"memmap, num_workers={run['num_workers']}"
