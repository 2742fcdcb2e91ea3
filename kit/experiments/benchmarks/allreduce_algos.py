"""All-reduce by hand, for teaching: a ring and a gather-to-root + broadcast, with send/recv.

Both give what `dist.all_reduce(SUM)` gives; what differs is who sends how much:

- ring (Patarasuk & Yuan 2009; the bandwidth-optimal algorithm NCCL and gloo use for large
  messages): the tensor is cut into N chunks. Reduce-scatter: N-1 steps, each rank sends one
  chunk to its right neighbour and adds the chunk arriving from its left; afterwards rank r
  holds the full sum of chunk (r+1) % N. All-gather: N-1 more steps pass the finished chunks
  round. Every rank sends 2(N-1)/N * S bytes, whatever N is.
- gather-to-root + broadcast: every rank sends its whole tensor to rank 0, which sums and sends
  the result back to each. Simple, but rank 0 receives and sends (N-1) * S: its link is the
  bottleneck and grows with N (the parameter-server picture).

`bench_algos` (worker side) checks each against `dist.all_reduce` and times them;
`allreduce_algorithms_benchmark` (kernel side) returns "kit.collectives/1" records that
`kit.plots.bandwidth` draws beside the built-in collective.
"""
from __future__ import annotations

import time
from typing import Any

from kit.experiments.theory.links import ring_factor
from kit import _renamed

__all__ = ["hand_ring_all_reduce", "hand_root_all_reduce", "bench_algos", "allreduce_algorithms_benchmark",
           "ALGOS", "wire_bytes_per_rank", "records_from"]
__getattr__ = _renamed.renamed_getattr(__name__)  # this release's old names, for one release

ALGOS = ("dist.all_reduce", "ring (hand-written)", "gather-to-root + broadcast (hand-written)")


def wire_bytes_per_rank(algo: str, nbytes: int, world_size: int) -> dict[str, float]:
    """Bytes sent per rank by the algorithm (predicted): the busiest rank and the average."""
    n = world_size
    if algo.startswith("gather"):  # the root broadcasts (n-1) x S, every other rank sends it S: 2(n-1) S in all
        root = (n - 1) * nbytes
        return {"busiest_rank": root, "mean": 2 * root / n}
    ring = ring_factor("all_reduce", n) * nbytes  # dist.all_reduce: gloo's ring for large messages
    return {"busiest_rank": ring, "mean": ring}


def hand_ring_all_reduce(t: Any) -> Any:
    """Sum `t` over all ranks in place with a ring: reduce-scatter, then all-gather."""
    import torch
    import torch.distributed as dist
    n, r = dist.get_world_size(), dist.get_rank()
    if n == 1:
        return t
    flat = t.view(-1)
    chunks = list(flat.tensor_split(n))  # views into t; sizes differ by at most one element
    right, left = (r + 1) % n, (r - 1) % n

    def exchange(send: Any, recv: Any) -> None:
        # Post both at once: with blocking send/recv every rank would send first and wait forever
        # (each send needs a matching receive that has not been posted yet).
        ops = [dist.P2POp(dist.isend, send, right), dist.P2POp(dist.irecv, recv, left)]
        for w in dist.batch_isend_irecv(ops):
            w.wait()

    for s in range(n - 1):  # reduce-scatter
        i_send, i_recv = (r - s) % n, (r - s - 1) % n
        incoming = torch.empty_like(chunks[i_recv])
        exchange(chunks[i_send].contiguous(), incoming)
        chunks[i_recv].add_(incoming)
    for s in range(n - 1):  # all-gather: chunk (r+1) % n is complete here, pass it on
        i_send, i_recv = (r + 1 - s) % n, (r - s) % n
        incoming = torch.empty_like(chunks[i_recv])
        exchange(chunks[i_send].contiguous(), incoming)
        chunks[i_recv].copy_(incoming)
    return t


def hand_root_all_reduce(t: Any, root: int = 0) -> Any:
    """Sum `t` over all ranks in place: everyone sends to `root`, root sums and sends back."""
    import torch
    import torch.distributed as dist
    n, r = dist.get_world_size(), dist.get_rank()
    if r == root:
        buf = torch.empty_like(t)
        for src in range(n):
            if src != root:
                dist.recv(buf, src=src)
                t.add_(buf)
        for dst in range(n):
            if dst != root:
                dist.send(t, dst=dst)
    else:
        dist.send(t, dst=root)
        dist.recv(t, src=root)
    return t


def bench_algos(sizes: list[int], iters: int = 10, warmup: int = 2) -> dict[str, Any]:
    """Worker side: check each algorithm equals dist.all_reduce, then time it (median, max over ranks)."""
    import torch
    import torch.distributed as dist
    fns = {ALGOS[0]: lambda t: dist.all_reduce(t), ALGOS[1]: hand_ring_all_reduce, ALGOS[2]: hand_root_all_reduce}
    from kit.experiments.measure.group_device import group_device
    dev = group_device()  # NCCL sends and reduces GPU tensors only
    gen = torch.Generator().manual_seed(1234 + dist.get_rank())
    sync = torch.cuda.synchronize if dev.type == "cuda" else (lambda: None)
    check: dict[str, float] = {}
    for name, fn in fns.items():
        x = torch.randn(1000 * dist.get_world_size() + 3, generator=gen).to(dev)  # +3: uneven chunks
        ref, got = x.clone(), x.clone()
        dist.all_reduce(ref)
        fn(got)
        check[name] = float((got - ref).abs().max())
    raw: dict[str, list[tuple[int, float]]] = {}
    for name, fn in fns.items():
        pts = []
        for size in sizes:
            t = torch.ones(max(1, size // 4), device=dev)
            for _ in range(warmup):
                fn(t)
            times = []
            for _ in range(iters):
                dist.barrier()  # start together
                sync()
                t0 = time.perf_counter()
                fn(t)
                sync()  # a GPU runs the collective after the call returns: time it done
                times.append((time.perf_counter() - t0) * 1e3)
            ms = torch.tensor([sorted(times)[len(times) // 2]], device=dev)
            dist.all_reduce(ms, op=dist.ReduceOp.MAX)  # done when the last rank is
            pts.append((t.numel() * 4, float(ms.item())))
        raw[name] = pts
    return {"max_abs_err_vs_all_reduce": check, "raw": raw}


def allreduce_algorithms_benchmark(cluster: Any = None, sizes: list[int] | tuple[int, ...] = (2**12, 2**16, 2**20, 2**22),
                                   iters: int = 10, world_size: int = 2) -> list[dict[str, Any]]:
    """Kernel side: one "kit.collectives/1" record per algorithm (busbw uses all_reduce's 2(N-1)/N)."""
    from kit.experiments.api import cluster_for
    c = cluster_for(world_size, cluster, "cpu")
    res = c.call("kit.experiments.benchmarks.allreduce_algos:bench_algos", list(sizes), iters)[0]
    return records_from(res, c.world_size, c.backend, c.device_type)


def records_from(res: dict[str, Any], world_size: int, backend: str, device_type: str) -> list[dict[str, Any]]:
    """Turn bench_algos' result into plot-ready records, with the check and predicted bytes."""
    from kit.experiments.benchmarks.collectives import make_records
    out = []
    for name, pts in res["raw"].items():
        rec = make_records({"all_reduce": pts}, world_size, backend, device_type)[0]
        rec["op"] = name
        rec["max_abs_err_vs_all_reduce"] = res["max_abs_err_vs_all_reduce"][name]
        for p in rec["points"]:
            p["wire_bytes_per_rank_predicted"] = wire_bytes_per_rank(name, p["bytes"], world_size)
        out.append(rec)
    return out
