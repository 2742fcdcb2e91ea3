"""Data larger than memory, rank side: a np.memmap dataset read through DistributedSampler, with
the memory and page-cache numbers that show what memmap buys.

- The file: a .npy of n samples x `sample_kib` KiB (float32), written in chunks with pwrite
  (writing through a mapping would put the whole file into the writer's RSS). Column 0 of
  each sample holds its index, so a rank can prove what it read, not only what it asked for.
- Cold first epoch without root (no drop_caches): fsync, then posix_fadvise(POSIX_FADV_DONTNEED)
  drops the file's clean pages; mincore(2) then measures the fraction still cached, so the
  record says how cold "cold" was (pages still mapped by some process are never dropped).
- Memory: RSS and PSS from /proc/<pid>/smaps_rollup for the rank and its DataLoader workers,
  sampled every 10 ms. Touched file pages count fully in every mapper's RSS; PSS splits each
  shared page among its mappers, so the ranks' PSS sums to one copy of the data they share.
"""
from __future__ import annotations

import ctypes
import gc
import mmap
import os
import threading
import time
from typing import Any

import numpy as np
import torch
import torch.distributed as dist
from torch.utils.data import DataLoader, Dataset, DistributedSampler

from kit.units import MIB


__all__ = ["write_dataset", "MemmapDataset", "drop_cache", "cached_fraction", "mem_now", "MemSampler",
           "memmap_rank"]

_CHUNK = int(16 * MIB)  # bytes per pwrite: bounded memory while writing a file of any size


def write_dataset(path: str, n: int, floats: int, seed: int) -> int:
    """Write n x floats float32 (column 0 = sample index) as .npy; returns the data offset."""
    arr = np.lib.format.open_memmap(path, mode="w+", dtype=np.float32, shape=(n, floats))
    offset = int(arr.offset)
    del arr  # only the header and the file's length; the data goes in with pwrite below
    rows = max(1, _CHUNK // (4 * floats))
    # One random chunk, repeated with fresh indices: what is read does not matter here, and
    # generating 1.5 GB of random numbers took 45 s on a busy 2-core box (a lesson cell waits).
    block = np.random.default_rng(seed).random((rows, floats), dtype=np.float32)
    fd = os.open(path, os.O_WRONLY)
    try:
        for start in range(0, n, rows):
            block = block[:min(rows, n - start)]
            block[:, 0] = np.arange(start, start + block.shape[0], dtype=np.float32)
            os.pwrite(fd, block.tobytes(), offset + 4 * floats * start)
        os.fsync(fd)  # dirty pages cannot be dropped: make them clean first
    finally:
        os.close(fd)
    return offset


def drop_cache(path: str) -> None:
    """Ask the kernel to forget the file's cached pages (unprivileged; Binder has no root)."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    finally:
        os.close(fd)


def cached_fraction(path: str) -> float | None:
    """Fraction of the file's pages in the page cache, from mincore(2); None where unavailable."""
    size = os.path.getsize(path)
    if size == 0:
        return 0.0
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.mmap.restype, libc.mmap.argtypes = ctypes.c_void_p, [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int,
                                                                  ctypes.c_int, ctypes.c_int, ctypes.c_long]
        libc.mincore.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_char_p]
        libc.munmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
        fd = os.open(path, os.O_RDONLY)
        try:
            addr = libc.mmap(None, size, mmap.PROT_READ, mmap.MAP_SHARED, fd, 0)
            if addr in (None, ctypes.c_void_p(-1).value):
                return None
            pages = (size + mmap.PAGESIZE - 1) // mmap.PAGESIZE
            vec = ctypes.create_string_buffer(pages)
            ok = libc.mincore(ctypes.c_void_p(addr), size, vec) == 0
            libc.munmap(ctypes.c_void_p(addr), size)
        finally:
            os.close(fd)
        return sum(b & 1 for b in vec.raw) / pages if ok else None
    except (OSError, AttributeError):
        return None


class MemmapDataset(Dataset):
    """Samples from the .npy file through np.memmap: nothing is read until a batch asks."""

    def __init__(self, path: str, in_memory: bool = False):
        # in_memory: the copy memmap replaces (np.load reads the whole file into this process).
        self.x = np.load(path, mmap_mode=None if in_memory else "r")

    def __len__(self) -> int:
        return int(self.x.shape[0])

    def __getitems__(self, idx: list[int]) -> tuple[torch.Tensor, torch.Tensor]:
        # One fancy-index read per batch (sorted: sequential within the file), not one per sample.
        order = np.sort(np.asarray(idx))
        x = torch.from_numpy(np.ascontiguousarray(self.x[order]))
        return x, x[:, 0].long() % 10

    def __getitem__(self, i: int) -> tuple[torch.Tensor, torch.Tensor]:
        x, y = self.__getitems__([i])
        return x[0], y[0]


def _batched(batch: Any) -> Any:
    """collate_fn: __getitems__ already returns one batch (module level: workers pickle it)."""
    return batch


def _rollup(pid: int | str) -> dict[str, float]:
    out = {}
    try:
        with open(f"/proc/{pid}/smaps_rollup") as f:
            for line in f:
                k, _, rest = line.partition(":")
                if k in ("Rss", "Pss", "Pss_File", "Pss_Anon"):
                    out[k] = int(rest.split()[0]) / 1024.0  # kB -> MiB
    except OSError:
        pass  # a worker that just exited
    return out


def _children(pid: int) -> list[int]:
    kids: list[int] = []
    try:
        for tid in os.listdir(f"/proc/{pid}/task"):
            with open(f"/proc/{pid}/task/{tid}/children") as f:
                kids += [int(c) for c in f.read().split()]
    except OSError:
        pass
    return kids


def mem_now() -> dict[str, float]:
    """This process plus its children (DataLoader workers), MiB: rss, pss, pss_file, pss_anon."""
    tot = {"rss": 0.0, "pss": 0.0, "pss_file": 0.0, "pss_anon": 0.0}
    for pid in [os.getpid(), *_children(os.getpid())]:
        r = _rollup(pid)
        for k, key in (("Rss", "rss"), ("Pss", "pss"), ("Pss_File", "pss_file"), ("Pss_Anon", "pss_anon")):
            tot[key] += r.get(k, 0.0)
    return tot


class MemSampler:
    """mem_now() while a block runs, from a thread every `every_s`: the peak, and the series on
    time.monotonic() (one clock for every process on this machine), so the kernel can add the
    ranks up at the same moments. 0.1 s: reading smaps_rollup walks the page tables (~15 ms with
    1.5 GB mapped, on this 2-core box), and a faster sampler would slow the epoch it measures."""

    def __init__(self, every_s: float = 0.1):
        self.every_s, self.peak = every_s, mem_now()
        self.series: list[tuple[float, float, float]] = [(time.monotonic(), self.peak["rss"], self.peak["pss"])]
        self._stop = threading.Event()
        self._t = threading.Thread(target=self._run, daemon=True, name="kit-mem-sampler")

    def _run(self) -> None:
        while not self._stop.wait(self.every_s):
            self._take()

    def _take(self) -> None:
        now = mem_now()
        self.series.append((time.monotonic(), now["rss"], now["pss"]))
        self.peak = {k: max(v, now[k]) for k, v in self.peak.items()}

    def __enter__(self) -> "MemSampler":
        self._t.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self._stop.set()
        self._t.join()
        self._take()


def _epoch(loader: DataLoader, track: bool) -> dict[str, Any]:
    seen: list[int] = []
    n, t0, check = 0, time.perf_counter(), 0.0
    with MemSampler() as mem:
        for x, _y in loader:
            check += float(x[:, 1:].sum())  # touch every byte, as a model's first layer would
            n += x.shape[0]
            if track:
                seen += x[:, 0].long().tolist()
    dt = time.perf_counter() - t0
    return {"samples": n, "seconds": dt, "samples_per_s": n / dt if dt else 0.0,
            "peak_mib": mem.peak, "series": [[round(v, 3) for v in row] for row in mem.series],
            "ids": seen if track else None}


class _Rows(MemmapDataset):
    """The same reads over an array already in memory (the warm-up's)."""

    def __init__(self, x: np.ndarray):
        self.x = x


def _warm_up(path: str, batch_size: int) -> None:
    """One pass of the measured code over a small in-memory array, before any baseline. A process's
    first pass allocates for good (the allocator's arenas, numpy's and torch's first buffers, the
    sampler's thread): about 14 MiB on a fresh rank here, which the first config measured would
    otherwise count as its dataset's memory."""
    head = np.load(path, mmap_mode="r")  # the header only: no sample is read
    rows = np.zeros((4 * batch_size, head.shape[1]), dtype=head.dtype)
    del head
    loader = DataLoader(_Rows(rows), batch_size=batch_size, num_workers=0, collate_fn=_batched)
    _epoch(loader, track=True)
    del loader, rows
    gc.collect()


def memmap_rank(path: str, batch_size: int, num_workers: list[int], epochs: int, in_memory: bool,
                seed: int, track_ids: bool) -> dict[str, Any]:
    """Every config on this rank: for each num_workers a cold epoch then warm ones; then the
    in-memory copy. Rank 0 drops the cache between configs (the page cache is machine-wide)."""
    rank, world = (dist.get_rank(), dist.get_world_size()) if dist.is_initialized() else (0, 1)
    barrier = dist.barrier if dist.is_initialized() else (lambda: None)
    _warm_up(path, batch_size)
    out: dict[str, Any] = {"rank": rank, "pid": os.getpid(), "baseline_mib": mem_now(), "runs": []}
    modes = [("memmap", nw) for nw in num_workers] + ([("in_memory", 0)] if in_memory else [])
    for mode, nw in modes:
        barrier()
        if rank == 0:
            drop_cache(path)
        barrier()
        before = cached_fraction(path)
        base = mem_now()
        t_load = time.perf_counter()
        ds = MemmapDataset(path, in_memory=mode == "in_memory")  # in_memory: the whole file, read now
        load_s = time.perf_counter() - t_load
        sampler = DistributedSampler(ds, num_replicas=world, rank=rank, shuffle=True, seed=seed, drop_last=False)
        loader = DataLoader(ds, batch_size=batch_size, sampler=sampler, num_workers=nw, collate_fn=_batched)
        eps = []
        for e in range(epochs):
            sampler.set_epoch(e)  # a new shuffle per epoch, the same on every rank
            barrier()
            cached = cached_fraction(path)
            rec = _epoch(loader, track_ids)
            barrier()  # the epoch ends with its slowest rank
            rec.update(epoch=e, cached_before=cached)
            eps.append(rec)
        barrier()  # no rank unmaps while another still reads: PSS shares pages among current mappers
        after = mem_now()
        del loader, sampler, ds
        gc.collect()  # unmap before the next drop_cache: mapped pages are never dropped
        out["runs"].append({"mode": mode, "num_workers": nw, "cached_at_start": before, "load_s": load_s,
                            "base_mib": base, "end_mib": after, "epochs": eps})
    return out
