"""Context parallelism: ring attention by hand (Liu et al. 2023, arXiv:2310.01889).

Each of t ranks holds s/t of the sequence: its queries stay put, and the key/value blocks travel
around the ring (rank r sends to r+1, receives from r-1; `isend`/`irecv`), so after t-1 hops every
query has seen every key. Softmax is computed online (Milakov & Gimelshein 2018; the flash-attention
update): a running max m, denominator l and output o per query, rescaled as each block arrives, so
no rank ever holds the s x s scores or the whole sequence's keys at once in forward.

Causal masks make a contiguous split unfair: rank 0's queries see only its own block, rank t-1's
see all t blocks, so the last rank works t times as long as the first and the others wait. The
zig-zag split (used by Megatron-LM's context parallelism and torch's `context_parallel` load
balancer) gives rank r chunks r and 2t-1-r of 2t, so every rank does the same work.

Backward is written by hand too (one autograd Function; flash-attention's backward per block from
the saved log-sum-exp): K and V go round the ring again, and each block's dK/dV accumulator
travels with it and comes home after t hops. Each rank keeps only its own q, k, v, output and
log-sum-exp. Bytes per attention and step, blocks of b*(s/t)*h elements: forward 2(t-1), backward
2(t-1) + 2t. Every hop is posted (`isend`/`irecv`) before the block in hand is computed, so the
transfer overlaps the compute.
"""
from __future__ import annotations

import math
import statistics
import time
from typing import Any, Iterator

import torch
import torch.distributed as dist
from torch import nn

from kit.experiments.models import Block
import kit.experiments.parallel.wire as wire
from kit.experiments.parallel.reference import check_result
from kit.experiments.theory.comm_bytes import predict_cp_bytes

__all__ = ["chunk_starts", "split_sequence", "gather_sequence", "ring_attention",
           "check_ring_attention", "ContextParallelGPT"]


def chunk_starts(seq: int, rank: int, t: int, zigzag: bool) -> list[tuple[int, int]]:
    """(start, length) of the sequence chunks rank `rank` holds: one contiguous s/t chunk, or
    zig-zag chunks r and 2t-1-r of 2t."""
    if zigzag:
        c = seq // (2 * t)
        return [(rank * c, c), ((2 * t - 1 - rank) * c, c)]
    return [(rank * (seq // t), seq // t)]


def split_sequence(x: torch.Tensor, rank: int, t: int, zigzag: bool = False, dim: int = -2) -> torch.Tensor:
    """This rank's part of `x` along dimension `dim` (the sequence)."""
    seq = x.shape[dim]
    if seq % (2 * t if zigzag else t):
        raise ValueError(f"sequence length {seq} must divide into {2 * t if zigzag else t} equal chunks")
    return torch.cat([x.narrow(dim, s, n) for s, n in chunk_starts(seq, rank, t, zigzag)], dim=dim)


def gather_sequence(x: torch.Tensor, group: Any, zigzag: bool = False, dim: int = -2) -> torch.Tensor:
    """The whole sequence back from every rank's part, in position order (collective)."""
    t = dist.get_world_size(group)
    parts = [torch.empty_like(x) for _ in range(t)]
    dist.all_gather(parts, x.contiguous(), group=group)
    seq = x.shape[dim] * t
    pieces: list[tuple[int, torch.Tensor]] = []
    for r, p in enumerate(parts):
        off = 0
        for s, n in chunk_starts(seq, r, t, zigzag):
            pieces.append((s, p.narrow(dim, off, n)))
            off += n
    return torch.cat([p for _, p in sorted(pieces, key=lambda sp: sp[0])], dim=dim)


def _start_hop(x: torch.Tensor, group: Any, tag: int) -> tuple[torch.Tensor, list[Any]]:
    """Post the send of `x` to the next rank and the receive from the previous; wait later."""
    r, t = dist.get_rank(group), dist.get_world_size(group)
    dst, src = (r + 1) % t, (r - 1) % t
    if group is not None:  # send/recv take global ranks
        dst, src = dist.get_global_rank(group, dst), dist.get_global_rank(group, src)
    x = x.contiguous()
    buf = torch.empty_like(x)  # after .contiguous(): empty_like keeps a transposed input's strides
    return buf, [wire.isend(x, dst, group, "cp", tag), wire.irecv(buf, src, group, "cp", tag), x]


def _finish(pending: list[Any]) -> None:
    for work in pending[:2]:
        work.wait()


def _pairs(q: torch.Tensor, k: torch.Tensor, seq: int, r: int, src: int, t: int, zigzag: bool,
           causal: bool) -> Iterator[tuple[int, slice, slice, torch.Tensor | None, int]]:
    """(query chunk index, query slice, key slice, mask of hidden pairs or None, entries kept) of
    every (query chunk, key chunk) pair that the causal mask does not hide entirely."""
    mine, theirs = chunk_starts(seq, r, t, zigzag), chunk_starts(seq, src, t, zigzag)
    qo = 0
    for i, (qs, qn) in enumerate(mine):
        ko = 0
        for ks, kn in theirs:
            if not (causal and ks > qs + qn - 1):  # else: every key is after every query
                hide = None
                if causal and ks + kn - 1 > qs:  # the diagonal crosses this pair
                    hide = (torch.arange(ks, ks + kn, device=q.device).unsqueeze(0)
                            > torch.arange(qs, qs + qn, device=q.device).unsqueeze(1))
                kept = qn * kn - (int(hide.sum()) if hide is not None else 0)
                yield i, slice(qo, qo + qn), slice(ko, ko + kn), hide, kept
            ko += kn
        qo += qn


def _scores(q: torch.Tensor, k: torch.Tensor, hide: torch.Tensor | None) -> torch.Tensor:
    s = q @ k.transpose(-1, -2) / math.sqrt(q.shape[-1])
    return s if hide is None else s.masked_fill(hide, float("-inf"))


def _ring_forward(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, group: Any, causal: bool, zigzag: bool,
                  stats: dict[str, float]) -> tuple[torch.Tensor, torch.Tensor]:
    """Output and log-sum-exp per query; the next K/V block travels while this one is used."""
    r, t = dist.get_rank(group), dist.get_world_size(group)
    seq = q.shape[-2] * t
    m = torch.full(q.shape[:-1], float("-inf"), device=q.device)  # running max per query
    l = torch.zeros(q.shape[:-1], device=q.device)  # running denominator
    o = torch.zeros_like(q)
    for step in range(t):
        if step < t - 1:  # the last block needs no further hop
            (k_next, pk), (v_next, pv) = _start_hop(k, group, 0), _start_hop(v, group, 1)
        t0 = time.perf_counter()
        for _, qs, ks, hide, kept in _pairs(q, k, seq, r, (r - step) % t, t, zigzag, causal):
            sc = _scores(q[..., qs, :], k[..., ks, :], hide)
            m_new = torch.maximum(m[..., qs], sc.amax(-1))
            p = torch.exp(sc - m_new.unsqueeze(-1))
            fix = torch.exp(m[..., qs] - m_new)
            l[..., qs] = l[..., qs] * fix + p.sum(-1)
            o[..., qs, :] = o[..., qs, :] * fix.unsqueeze(-1) + p @ v[..., ks, :]
            m[..., qs] = m_new
            stats["score_entries"] += kept
        stats["compute_ms"] += (time.perf_counter() - t0) * 1e3
        if step < t - 1:
            _finish(pk), _finish(pv)
            k, v = k_next, v_next
    return o / l.unsqueeze(-1), m + torch.log(l)


def _ring_backward(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, out: torch.Tensor, lse: torch.Tensor,
                   dout: torch.Tensor, group: Any, causal: bool, zigzag: bool) -> tuple[torch.Tensor, ...]:
    """Flash-attention's backward, block by block: K/V go round again (t-1 hops) and each block's
    dK/dV accumulator travels with it and comes home after t hops."""
    r, t = dist.get_rank(group), dist.get_world_size(group)
    seq, scale = q.shape[-2] * t, 1 / math.sqrt(q.shape[-1])
    delta = (dout * out).sum(-1, keepdim=True)  # D_i = rowsum(dO * O)
    dq, dk, dv = torch.zeros_like(q), torch.zeros_like(k), torch.zeros_like(v)
    for step in range(t):
        for _, qs, ks, hide, _ in _pairs(q, k, seq, r, (r - step) % t, t, zigzag, causal):
            p = torch.exp(_scores(q[..., qs, :], k[..., ks, :], hide) - lse[..., qs].unsqueeze(-1))
            dv[..., ks, :] += p.transpose(-1, -2) @ dout[..., qs, :]
            ds = p * (dout[..., qs, :] @ v[..., ks, :].transpose(-1, -2) - delta[..., qs, :])
            dq[..., qs, :] += ds @ k[..., ks, :] * scale
            dk[..., ks, :] += ds.transpose(-1, -2) @ q[..., qs, :] * scale
        if t == 1:  # one rank: dK and dV are already home (a hop to itself fails on gloo)
            break
        hops = [_start_hop(x, group, tag) for x, tag in ((dk, 2), (dv, 3))]
        if step < t - 1:
            hops += [_start_hop(x, group, tag) for x, tag in ((k, 0), (v, 1))]
        for _, pending in hops:
            _finish(pending)
        dk, dv = hops[0][0], hops[1][0]
        if step < t - 1:
            k, v = hops[2][0], hops[3][0]
    return dq, dk, dv


class _RingAttention(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, group: Any, causal: bool,
                zigzag: bool, stats: dict[str, float]) -> torch.Tensor:
        out, lse = _ring_forward(q, k, v, group, causal, zigzag, stats)
        ctx.save_for_backward(q, k, v, out, lse)
        ctx.group, ctx.causal, ctx.zigzag = group, causal, zigzag
        return out

    @staticmethod
    def backward(ctx: Any, dout: torch.Tensor) -> tuple[Any, ...]:
        q, k, v, out, lse = ctx.saved_tensors
        return (*_ring_backward(q, k, v, out, lse, dout.contiguous(), ctx.group, ctx.causal, ctx.zigzag),
                None, None, None, None)


def ring_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, group: Any = None, causal: bool = True,
                   zigzag: bool = False, stats: dict[str, Any] | None = None) -> torch.Tensor:
    """softmax(q k^T / sqrt(d)) v for this rank's queries over the whole sequence's keys.

    q, k, v: (batch, heads, s/t, head_dim), this rank's part (`split_sequence`). `stats`, if
    given, receives `score_entries` (query-key pairs computed: the work) and `compute_ms`."""
    st = {"score_entries": 0, "compute_ms": 0.0}
    out = _RingAttention.apply(q, k, v, group, causal, zigzag, st)
    if stats is not None:
        stats.update(st)
    return out




class ContextParallelGPT(nn.Sequential):
    """The gpt with each rank holding its part of the sequence and attention done by ring attention.
    Same module names as the single-process model; `positions` are this rank's token positions."""

    def __init__(self, *mods: nn.Module, group: Any = None, zigzag: bool = True):
        super().__init__(*mods)
        self.group, self.zigzag = group, zigzag

    def block(self, blk: Block, h: torch.Tensor, work: dict[str, float] | None = None) -> torch.Tensor:
        """One block; `work` accumulates ring attention's score entries and compute ms."""
        b, s, d = h.shape
        q, k, v = blk.qkv(blk.ln1(h)).view(b, s, 3, blk.heads, d // blk.heads).unbind(2)
        st: dict[str, Any] = {}
        y = ring_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), self.group, True, self.zigzag, st)
        for key, val in st.items():
            if work is not None:
                work[key] = work.get(key, 0) + val
        h = h + blk.proj(y.transpose(1, 2).reshape(b, s, d))
        return h + blk.mlp(blk.ln2(h))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        t, r = dist.get_world_size(self.group), dist.get_rank(self.group)
        pos = torch.cat([torch.arange(s, s + n) for s, n in chunk_starts(x.shape[1] * t, r, t, self.zigzag)])
        h = self[0].tok(x) + self[0].pos[pos]
        work: dict[str, float] = {}
        for blk in list(self)[1:-1]:
            h = self.block(blk, h, work)
        self.attention_work = work  # this forward's, every layer: the record's work per rank
        return self[-1](h)


def _forward_ms(local: list[torch.Tensor], group: Any, causal: bool, zigzag: bool, repeats: int) -> float:
    """This rank's attention ms in one ring forward: the median of `repeats` forwards that follow one
    untimed forward. The first call pays allocation and first-use costs (the causal mask's first
    masked_fill, ...), so whichever split a lesson times first read slower than the other."""
    with torch.no_grad():
        ring_attention(*local, group=group, causal=causal, zigzag=zigzag)  # warm-up: not timed
        times = []
        for _ in range(repeats):
            st: dict[str, Any] = {}
            ring_attention(*local, group=group, causal=causal, zigzag=zigzag, stats=st)
            times.append(st["compute_ms"])
    return statistics.median(times)


def check_ring_attention(batch: int = 2, heads: int = 2, seq: int = 64, head_dim: int = 16, causal: bool = True,
                         zigzag: bool = False, group: Any = None, device: str = "cpu", repeats: int = 5) -> dict[str, Any]:
    """Ring attention against full attention in one process (every rank calls this): max |diff|
    of the output and of q, k, v's gradients, bytes measured and predicted, work per rank
    (`compute_ms_per_rank`: the median of `repeats` forwards after an untimed one)."""
    if repeats < 1:
        raise ValueError(f"repeats={repeats}: the forward's milliseconds need at least 1 timed forward; pass repeats=5")
    r, t = dist.get_rank(group), dist.get_world_size(group)
    g = torch.Generator().manual_seed(0)
    full = [torch.randn(batch, heads, seq, head_dim, generator=g).to(device).requires_grad_() for _ in range(3)]
    dout = torch.randn(batch, heads, seq, head_dim, generator=g).to(device)
    ref = torch.nn.functional.scaled_dot_product_attention(*full, is_causal=causal)
    ref.backward(dout)
    local = [split_sequence(x.detach(), r, t, zigzag).requires_grad_() for x in full]
    forward_ms = _forward_ms(local, group, causal, zigzag, repeats)  # before counting: its hops are not the check's
    stats: dict[str, Any] = {}
    with wire.WIRE.counting() as w:
        out = ring_attention(*local, group=group, causal=causal, zigzag=zigzag, stats=stats)
        out.backward(split_sequence(dout, r, t, zigzag))
    diffs = {"out": (gather_sequence(out.detach(), group, zigzag) - ref.detach()).abs().max()}
    for name, x, xl in zip("qkv", full, local):
        diffs[f"grad_{name}"] = (gather_sequence(xl.grad, group, zigzag) - x.grad).abs().max()
    work = torch.tensor([float(stats["score_entries"]), forward_ms], device=device)
    every = [torch.zeros(2, device=device) for _ in range(t)]
    dist.all_gather(every, work, group=group)
    return check_result({k: float(v) for k, v in diffs.items()}, w.report(),
                        predict_cp_bytes(batch, seq, heads * head_dim, t), causal=causal, zigzag=zigzag, cp=t,
                        score_entries_per_rank=[int(e[0]) for e in every],
                        compute_ms_per_rank=[float(e[1]) for e in every],
                        compute_ms_of=f"median of {repeats} forwards after an untimed one")
