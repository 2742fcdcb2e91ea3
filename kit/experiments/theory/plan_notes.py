"""Why the best layout of a plan does or does not interleave its pipeline (pure Python, predicted; a layout in
words is `layout.explain`).

Interleaved 1F1B (v chunks per GPU) trades a bubble (p-1)/v micro-batch times long for v times the
pipeline sends and 1 + (p-1)/(p v) times the first stage's in-flight activations (layout_time.py,
layout_memory.py). It wins when the bubble is large (few micro-batches per pipeline stage) and the
sends are cheap; it loses when the extra activations do not fit or force more recomputation, or when
the sends cross a slow link. `interleaving_note` says which, with the numbers, for the plan's best layout.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Mapping, Sequence

from kit.experiments.theory.layout import Layout
from kit.experiments.theory.layout_memory import ParallelConfig
from kit.experiments.theory.plan_rules import Refusal
from kit import _renamed

__all__ = ["interleaving_note", "Unkept"]
__getattr__ = _renamed.renamed_getattr(__name__)  # this release's old names, for one release


@dataclass(frozen=True)
class Unkept:
    """An interleaved layout (v virtual stages) of the best layout's degrees, zero and micro-batch that plan()'s
    search did not keep: the rule that refused it, or (it fits with none of the recomputes) it priced with the
    best's recompute and its memory per GPU with the most recompute the search tried (plan_search.unkept_of)."""
    v: int
    refused: Refusal | None = None
    priced: Layout | None = None
    most_recompute: str = ""
    most_recompute_gib: float = 0.0


def _shape(c: ParallelConfig) -> tuple[int, ...]:
    """The degrees; the micro-batch and recompute may differ: both trade memory."""
    return c.tp, c.pp, c.dp, c.cp, c.ep, c.zero


def _counterpart(out: Sequence[Layout], best: Layout, v: int) -> Layout | None:
    """The fastest fitting layout of the same degrees as `best` with v virtual stages."""
    same = [x for x in out if x.fits and x.config.virtual_stages == v and _shape(x.config) == _shape(best.config)]
    return min(same, key=lambda x: x.step_s, default=None)


def _trade(base: Layout, inter: Layout) -> str:
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


def interleaving_note(out: Sequence[Layout], tried: Sequence[int], unkept: Mapping[int, Unkept]) -> str:
    """One sentence on the best layout (out[0]): interleaved and why, or why not. Empty when pp = 1.
    `tried`: the virtual stages plan() enumerated; `unkept`: the best's interleaved layouts it did not keep.
    It reads what the search found and computes nothing: only plan() plans."""
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
    for u in (unkept[v] for v in tried if v > 1 and v in unkept):
        if u.priced is not None:  # the first v that no rule refused: it fits with none of the recomputes
            return (f"Interleaving not chosen: v={u.v} would need {u.most_recompute_gib:.1f} GiB per GPU even with "
                    f"recompute={u.most_recompute} ({best.capacity_gib:.0f} GiB on the GPU; the first stage holds "
                    f"1 + (p-1)/(p v) times the activations) for a bubble of {u.priced.time.bubble_s:.2f} s "
                    f"instead of {best.time.bubble_s:.2f} s.")
    v = min((v for v in tried if v > 1), default=1)
    # every v > 1 was refused (the loop above returns otherwise): name the smallest's reason
    why_not = unkept[v].refused if v in unkept else None
    return f"Interleaving not possible for the best layout: {why_not.reason if why_not else 'virtual_stages=1 was fixed'}."
