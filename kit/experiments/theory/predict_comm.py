"""The communication half of a prediction: links, collective costs, and overlap on a FIFO link.

Pure Python (no torch): the kernel predicts, the ranks never see this.

A link is a chain of `LinkPreset`s whose costs add: one preset for a real network, or
[loopback fit, emulated preset] for a run on the virtual interconnect, which charges its time
*after* the real gloo all-reduce finished (interconnect.py), so the two add.

Collective costs (ring algorithms; Thakur, Rabenseifner & Gropp 2005; links.py):
    all_reduce      base + 2(p-1) hop + 2(p-1)/p n / bw(n)
    reduce_scatter  base +  (p-1) hop +  (p-1)/p n / bw(n)     (n = the full array)
    all_gather      base +  (p-1) hop +  (p-1)/p n / bw(n)
"""
from __future__ import annotations

import math
from typing import Any, Mapping, Sequence

from kit.experiments.theory.links import LINKS, LinkPreset, link_collective_s, ring_factor, ring_steps

__all__ = ["resolve_link", "describe_link", "collective_ms", "fifo", "backward_overlap", "zero3_pass",
           "bucket_layout", "link_from_fit"]

LinkSpec = Any  # str | (alpha_us, gbps) | LinkPreset | kit.collectives/1 record | a list of those


def link_from_fit(rec: Mapping[str, Any]) -> LinkPreset:
    """A link from a collective-benchmark all_reduce record (`kit.collectives/1`).

    The fit is t = alpha + S / beta (S the array); the ring's bandwidth term is 2(p-1)/p S / bw,
    so the per-direction bandwidth is bw = beta * 2(p-1)/p (the busbw), and the hop latency is
    alpha over the ring's 2(p-1) steps (the fit's alpha_per_step_us).
    """
    if rec.get("op") != "all_reduce":
        raise ValueError(f"a link fit needs the all_reduce record of the benchmark, got op={rec.get('op')!r}")
    p = int(rec["world_size"])
    fit = rec["fit"]
    steps = ring_steps("all_reduce", p)
    hop = fit.get("alpha_per_step_us") or (fit["alpha_us"] / steps if steps else 0.0)
    return LinkPreset(hop_us=float(hop), gbps=float(fit["beta_gbps"]) * ring_factor("all_reduce", p),
                      source=f"fit: collective benchmark, all_reduce on {p} {rec.get('backend', '')} ranks")


def resolve_link(link: LinkSpec) -> list[LinkPreset]:
    """Every accepted spelling of a link -> a chain of presets whose costs add."""
    if isinstance(link, LinkPreset):
        return [link]
    if isinstance(link, str):
        if link not in LINKS:
            raise ValueError(f"link={link!r} is not a preset; choose one of {sorted(LINKS)} "
                             "or pass (alpha_us, gbps)")
        return [LINKS[link]]
    if isinstance(link, Mapping):
        return [link_from_fit(link)]
    if isinstance(link, tuple) and len(link) == 2 and all(isinstance(x, (int, float)) for x in link):
        a, g = float(link[0]), float(link[1])
        if a < 0 or g <= 0:
            raise ValueError(f"link=(alpha_us={a}, gbps={g}) needs alpha_us >= 0 and gbps > 0")
        return [LinkPreset(hop_us=a, gbps=g, source="custom (alpha per ring step, GB/s per direction)")]
    if isinstance(link, (list, tuple)) and link:
        return [p for part in link for p in resolve_link(part)]
    raise ValueError(f"link={link!r}: pass a preset name {sorted(LINKS)}, (alpha_us, gbps), "
                     "a collective-benchmark all_reduce record, or a list of those (their costs add)")


def describe_link(chain: Sequence[LinkPreset]) -> list[dict[str, Any]]:
    return [{"hop_us": p.hop_us, "gbps": p.gbps, "base_us": p.base_us, "efficiency": p.efficiency,
             "chunk_half_bytes": p.chunk_half_bytes, "source": p.source,
             "name": next((k for k, v in LINKS.items() if v == p), "custom")} for p in chain]


def collective_ms(op: str, chain: Sequence[LinkPreset], nbytes: float, p: int) -> float:
    """Predicted time (ms) of one ring collective of `nbytes` (the full array) on p ranks."""
    if p <= 1 or nbytes <= 0:
        return 0.0
    total_s = 0.0
    for link in chain:   # the links a chain names add their costs
        total_s += link_collective_s(op, link, nbytes, p)
    return 1e3 * total_s


def fifo(ready_ms: Sequence[float], dur_ms: Sequence[float], free_ms: float = 0.0) -> list[tuple[float, float]]:
    """A link carries one transfer at a time: each starts when it is ready and the link is free."""
    out = []
    for r, d in zip(ready_ms, dur_ms):
        s = max(r, free_ms)
        free_ms = s + d
        out.append((s, free_ms))
    return out


def backward_overlap(ready_ms: Sequence[float], dur_ms: Sequence[float], bwd_start_ms: float,
                     bwd_end_ms: float) -> dict[str, float]:
    """DDP's overlap: bucket i's all-reduce starts when its gradients are ready (and the link is
    free); what runs inside [backward start, backward end] is overlapped, the rest exposed."""
    iv = fifo(ready_ms, dur_ms)
    total = sum(dur_ms)
    over = sum(max(0.0, min(e, bwd_end_ms) - max(s, bwd_start_ms)) for s, e in iv)
    end = iv[-1][1] if iv else bwd_end_ms
    return {"comm_ms": total, "comm_overlap_ms": over, "comm_exposed_ms": max(0.0, total - over),
            "comm_end_ms": max(end, bwd_end_ms)}


def zero3_pass(chunk_ms: Sequence[float], gather_ms: Sequence[float], scatter_ms: Sequence[float]
               ) -> dict[str, float]:
    """One forward or backward pass under ZeRO-3/FSDP, chunk by chunk, from t = 0.

    Chunk k needs its parameters all-gathered first; the gather of chunk k+1 is issued when
    chunk k starts (prefetch of one), the reduce-scatter of chunk k's gradients when it ends
    (backward only; pass zeros for forward). Everything shares one FIFO link, and issue times
    grow monotonically, so serving in loop order is serving in issue order.
    """
    free = 0.0
    ag_end = [0.0] * len(chunk_ms)
    if chunk_ms:
        free = ag_end[0] = gather_ms[0]
    t = 0.0
    for k, c in enumerate(chunk_ms):
        start = max(t, ag_end[k])
        if k + 1 < len(chunk_ms):
            free = ag_end[k + 1] = max(start, free) + gather_ms[k + 1]
        t = start + c
        if scatter_ms[k] > 0:
            free = max(t, free) + scatter_ms[k]
    end = max(t, free)
    comm = sum(gather_ms) + sum(scatter_ms)
    compute = sum(chunk_ms)
    exposed = end - compute
    return {"pass_ms": end, "comm_ms": comm, "comm_exposed_ms": exposed,
            "comm_overlap_ms": max(0.0, comm - exposed)}


def bucket_layout(total_bytes: float, cap_bytes: float) -> list[float]:
    """Equal buckets of at most `cap_bytes` when only the total is known (a record without DDP
    buckets). DDP fills buckets parameter by parameter, so real buckets differ; a DDP record's
    own layout is used whenever there is one."""
    if total_bytes <= 0:
        return []
    n = max(1, math.ceil(total_bytes / cap_bytes))
    return [total_bytes / n] * n
