"""The pipeline bubble on a workload built to show it: balanced stages, compute-bound micro-batches.

GPipe's bubble (p-1)/(m+p-1) (Huang et al. 2018, arXiv:1811.06965) assumes equal stages and free
communication. The kit's mlp and gpt cut into uneven stages, and their micro-batches shrink as m
grows (the batch is fixed), so per-micro-batch overhead grows with m and the measured bubble can
rise with m. Here every virtual stage is the same stack of square Linear layers and every
micro-batch has the same rows, so each one costs the same compute whatever m is.

Virtual stages (interleaving, Narayanan et al., *Efficient Large-Scale Language Model Training on GPU
Clusters Using Megatron-LM*, SC 2021, arXiv:2104.04473): each of p ranks holds v chunks, chunk c of
rank r being stage c*p + r of p*v. Run breadth-first (every micro-batch through chunk 0, then
chunk 1, ...; Lamy-Poirier 2022, arXiv:2211.05953), the pipe fills in p-1 chunk-slots of 1/v the
size, so the bubble is (p-1)/(v*m + p-1): divided by about v. Megatron's interleaved 1F1B has the
same bubble to first order, (p-1)/(v*m), and holds fewer micro-batches' activations.

Measured two ways, on `time.perf_counter` (one host: CLOCK_MONOTONIC is shared by processes):
`measured` as the run loop measures it (theory/bubble.py), 1 - sum of each rank's compute time /
(p x the global span): every moment a rank is not computing, including per-op overhead (send,
Python, being descheduled on a busy machine); and `waiting`, the time ranks sit in a blocking
recv for a neighbour (plus before their first and after their last op): the schedule's bubble
proper, what the formula predicts.
"""
from __future__ import annotations

import statistics
import time
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

__all__ = ["pipeline_bubble", "predicted_interleaved_bubble"]


def predicted_interleaved_bubble(stages: int, micro_batches: int, virtual: int = 1) -> float:
    """(p-1)/(v m + p-1); v=1 is GPipe's (p-1)/(m+p-1). With v > 1 it needs m >= p: with fewer
    micro-batches than stages, micro-batch 0 comes back to rank 0 for its next chunk before rank 0
    has anything else to do (Megatron-LM requires m to be a multiple of p); then each chunk round
    costs p slots for m micro-batches' work: bubble 1 - m/p."""
    if virtual > 1 and micro_batches < stages:
        return 1 - micro_batches / stages
    return (stages - 1) / (virtual * micro_batches + stages - 1)


def _chunks(p: int, v: int, layers: int, width: int, seed: int) -> list[nn.Sequential]:
    """This rank's v chunks, each `layers` square Linear+Tanh layers (the same on every rank)."""
    torch.manual_seed(seed)
    every = [nn.Sequential(*[m for _ in range(layers) for m in (nn.Linear(width, width), nn.Tanh())])
             for _ in range(p * v)]
    r = dist.get_rank()
    return [every[c * p + r] for c in range(v)]


def _step(chunks: list[nn.Sequential], m: int, rows: int, width: int) -> tuple[float, float, float, float]:
    """One breadth-first step; returns (compute ms, ms waiting in recv, first compute start, last
    compute end)."""
    p, r, v = dist.get_world_size(), dist.get_rank(), len(chunks)
    prev, nxt = (r - 1) % p, (r + 1) % p
    busy, first, last, waited = 0.0, float("inf"), 0.0, 0.0
    held: dict[tuple[int, int], tuple[torch.Tensor, torch.Tensor]] = {}
    sends: list[Any] = []

    def compute(fn: Any) -> Any:
        nonlocal busy, first, last
        t0 = time.perf_counter()
        out = fn()
        t1 = time.perf_counter()
        busy, first, last = busy + t1 - t0, min(first, t0), max(last, t1)
        return out

    def recv(buf: torch.Tensor, src: int, tag: int) -> None:
        nonlocal waited
        t0 = time.perf_counter()
        dist.recv(buf, src, tag=tag)
        if first < float("inf"):  # waits before this rank's first op are the previous step's skew
            waited += time.perf_counter() - t0

    for c in range(v):
        for i in range(m):
            if r == 0 and c == 0:
                x = torch.randn(rows, width)
            else:
                x = torch.empty(rows, width)
                recv(x, prev, 0)
            x.requires_grad_()
            out = compute(lambda: chunks[c](x))
            if c == v - 1 and r == p - 1:
                out = compute(lambda: (out ** 2).mean() / m)
            else:
                sends.append(dist.isend(out.detach().contiguous(), nxt, tag=0))
            held[(c, i)] = (x, out)
    for c in reversed(range(v)):
        for i in range(m):
            x, out = held.pop((c, i))
            if c == v - 1 and r == p - 1:
                compute(lambda: out.backward())
            else:
                g = torch.empty_like(out)
                recv(g, nxt, 1)
                compute(lambda: out.backward(g))
            if not (r == 0 and c == 0):
                sends.append(dist.isend(x.grad.contiguous(), prev, tag=1))
    for w in sends:
        w.wait()
    return busy * 1e3, waited * 1e3, first * 1e3, last * 1e3


def pipeline_bubble(micro_batches: int, virtual: int = 1, steps: int = 3, rows: int = 256, width: int = 512,
                    layers_per_rank: int = 8, threads: int = 1) -> dict[str, Any]:
    """Measured bubble of a balanced, compute-bound pipeline over every rank (all ranks call this).

    Each rank holds `layers_per_rank` layers in `virtual` chunks; each micro-batch has `rows` rows.
    Returns the formula, the bubble of every timed step and their median (fractions, 0..1)."""
    p = dist.get_world_size()
    if layers_per_rank % virtual:
        raise ValueError(f"layers_per_rank={layers_per_rank} does not split into virtual={virtual} chunks")
    before = torch.get_num_threads()
    torch.set_num_threads(threads)  # one thread per rank: compute-bound and not fighting the other rank
    try:
        chunks = _chunks(p, virtual, layers_per_rank // virtual, width, seed=0)
        bubbles, waits = [], []
        for s in range(steps + 1):  # +1: the first step pays allocation
            busy, waited, first, last = _step(chunks, micro_batches, rows, width)
            every = [torch.zeros(4, dtype=torch.float64) for _ in range(p)]
            dist.all_gather(every, torch.tensor([busy, waited, first, last], dtype=torch.float64))
            span = max(float(t[3]) for t in every) - min(float(t[2]) for t in every)
            if s:
                bubbles.append(1 - sum(float(t[0]) for t in every) / (p * span))
                # the first rank idles before its first op and the last after its last: count them too
                edges = sum(float(t[2]) - min(float(u[2]) for u in every) + max(float(u[3]) for u in every)
                            - float(t[3]) for t in every)
                waits.append((sum(float(t[1]) for t in every) + edges) / (p * span))
    finally:
        torch.set_num_threads(before)
    return {"stages": p, "micro_batches": micro_batches, "virtual": virtual,
            "formula": predicted_interleaved_bubble(p, micro_batches, virtual),
            "measured": statistics.median(bubbles), "measured_per_step": bubbles,
            "waiting": statistics.median(waits), "waiting_per_step": waits}
