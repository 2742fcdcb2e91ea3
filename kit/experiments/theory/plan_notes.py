"""A planned layout in words (`explain`), and why the best layout of a plan does or does not interleave its
pipeline (pure Python, predicted).

Interleaved 1F1B (v chunks per GPU) trades a bubble (p-1)/v micro-batch times long for v times the
pipeline sends and 1 + (p-1)/(p v) times the first stage's in-flight activations (layout_time.py,
layout_memory.py). It wins when the bubble is large (few micro-batches per pipeline stage) and the
sends are cheap; it loses when the extra activations do not fit or force more recomputation, or when
the sends cross a slow link. `interleaving_note` says which, with the numbers, for the plan's best layout.
"""
from __future__ import annotations

from dataclasses import replace
from typing import Any, Sequence

from kit.experiments.theory.cluster import ClusterSpec
from kit.experiments.theory.layout_memory import ParallelConfig, memory_per_gpu
from kit.experiments.theory.layout_time import step_time
from kit.experiments.theory.models import ModelSpec
from kit.experiments.theory.plan_rules import refusal

__all__ = ["interleaving_note", "explain"]


def _shape(c: ParallelConfig) -> tuple[int, ...]:
    """The degrees; the micro-batch and recompute may differ: both trade memory."""
    return c.tp, c.pp, c.dp, c.cp, c.ep, c.zero


def _counterpart(out: Sequence[Any], best: Any, v: int) -> Any | None:
    """The fastest fitting layout of the same degrees as `best` with v virtual stages."""
    same = [x for x in out if x.fits and x.config.virtual_stages == v and _shape(x.config) == _shape(best.config)]
    return min(same, key=lambda x: x.step_s, default=None)


def _trade(base: Any, inter: Any) -> str:
    """From `base` (v = 1) to `inter` (v > 1): bubble saved against sends and activations added."""
    link = dict(inter.time.links)["pp"]
    tb, ti = base.time, inter.time
    rest = (inter.step_s - base.step_s) - (ti.bubble_s - tb.bubble_s) - (ti.pp_p2p_s - tb.pp_p2p_s)
    how = lambda x: f"mb{x.config.micro_batch}x{x.config.micro_batches} recompute={x.config.recompute}"  # noqa: E731
    return (f"v={inter.config.virtual_stages} ({how(inter)}) against v=1 ({how(base)}): bubble "
            f"{base.time.bubble_s:.2f} -> {inter.time.bubble_s:.2f} s, pipeline sends on {link} "
            f"{base.time.pp_p2p_s:.2f} -> {inter.time.pp_p2p_s:.2f} s, activations "
            f"{base.memory.activations_gib:.1f} -> {inter.memory.activations_gib:.1f} GiB, "
            + (f"everything else changes by {rest:+.2f} s, " if abs(rest) >= 0.005 else "")
            + f"step {base.step_s:.2f} -> {inter.step_s:.2f} s (predicted)")


def interleaving_note(m: ModelSpec, c: ClusterSpec, seq_len: int, batch: int, utilisation: float | None, framework: str,
                      out: Sequence[Any], tried: Sequence[int], most_recompute: str = "full") -> str:
    """One sentence on the best layout (out[0]): interleaved and why, or why not. Empty when pp = 1.
    `tried`: the virtual stages plan() enumerated; `most_recompute`: the most recomputation it tried."""
    best = out[0]
    pc = best.config
    if pc.pp == 1:
        return ""
    if pc.virtual_stages > 1:
        base = _counterpart(out, best, 1)
        return "Interleaving chosen: " + (_trade(base, best) if base else f"v={pc.virtual_stages} (fixed)") + "."
    alts = [x for x in (_counterpart(out, best, v) for v in tried if v > 1) if x is not None]
    if alts:
        alt = min(alts, key=lambda x: x.step_s)
        return f"Interleaving not chosen: {_trade(best, alt)}: no faster."
    for v in (v for v in tried if v > 1):
        pv = replace(pc, schedule="interleaved_1f1b", virtual_stages=v)
        if refusal(m, c, pv, seq_len, batch, framework):
            continue
        mem = memory_per_gpu(m, replace(pv, recompute=most_recompute), seq_len)
        t = step_time(m, pv, c, seq_len, utilisation)
        return (f"Interleaving not chosen: v={v} would need {mem.total_gib:.1f} GiB per GPU even with "
                f"recompute={most_recompute} ({c.accelerator.memory_gib:.0f} GiB on the GPU; the first stage holds "
                f"1 + (p-1)/(p v) times the activations) for a bubble of {t.bubble_s:.2f} s instead of "
                f"{best.time.bubble_s:.2f} s.")
    v = min((v for v in tried if v > 1), default=1)
    # every v > 1 was refused (the loop above returns otherwise): name the smallest's reason
    why_not = refusal(m, c, replace(pc, schedule="interleaved_1f1b", virtual_stages=v), seq_len, batch,
                      framework) if v > 1 else None
    return f"Interleaving not possible for the best layout: {why_not.reason if why_not else 'virtual_stages=1 was fixed'}."


def explain(layout: Any) -> str:
    """One sentence on a planned Layout: which dimension crosses which link, what it costs, what dominates."""
    x, t, links = layout.config, layout.time, dict(layout.time.links)
    parts = []
    if x.tp > 1:
        overlap = ", overlapped: what the matmuls cannot cover" if x.tp_overlap else ""
        parts.append(f"tp={x.tp} on {links['tp']} (all-reduces {t.tp_s / t.step_s:.0%} of the step{overlap})")
    if x.cp > 1:
        parts.append(f"cp={x.cp} on {links['cp']} ({t.cp_exposed_s / t.step_s:.0%} exposed)")
    if x.ep > 1:
        parts.append(f"ep={x.ep} on {links['ep']} (all-to-alls {t.ep_s / t.step_s:.0%})")
    if x.pp > 1:
        v = x.virtual_stages
        inter = (f", interleaved over v={v} chunks per GPU; sends {t.pp_p2p_s / t.step_s:.0%}, v times "
                 "the messages" if v > 1 else "")
        parts.append(f"pp={x.pp} on {links['pp']} (bubble {t.bubble_s / t.step_s:.0%} "
                     f"with {x.micro_batches} micro-batches{inter})")
    if x.dp * x.cp > 1:
        # exposed includes what the overlapped collectives slow the compute beside them (theory/overlap.py)
        hidden = ("hidden behind backward" if t.dp_exposed_s < 0.01 * t.step_s
                  else f"{t.dp_exposed_s:.2f} s exposed, the slowed compute beside it included")
        how = " per-layer gathers and reduce-scatters" if x.zero == 3 else ""
        # Gradients are reduced (and ZeRO shards) over dp x cp, as torchtitan does: with cp > 1 the data-parallel
        # group is larger than dp, and "dp=1 ZeRO-2" alone would read as a contradiction.
        group = f"dp={x.dp}" if x.cp == 1 else f"dp x cp = {x.dp} x {x.cp}"
        parts.append(f"{group}{f' ZeRO-{x.zero}' if x.zero else ''} on {links['dp']} "
                     f"({x.framework}{how}: traffic {t.dp_s:.2f} s, {hidden})")
    costs = {"compute": t.compute_s, "TP all-reduces": t.tp_s, "the pipeline bubble": t.bubble_s,
             "pipeline sends": t.pp_p2p_s,
             "exposed data-parallel traffic": t.dp_exposed_s, "expert all-to-alls": t.ep_s}
    top = max(costs, key=lambda k: costs[k])
    return (("; ".join(parts) or "one GPU, no communication") +
            f"; {layout.memory_gib:.0f} of {layout.capacity_gib:.0f} GiB; {top} dominates "
            f"({costs[top] / t.step_s:.0%} of {t.step_s:.2f} s); matmuls at {t.matmul_efficiency:.0%} of peak; "
            f"MFU {t.mfu:.0%}, HFU {t.hfu:.0%} (predicted)")
