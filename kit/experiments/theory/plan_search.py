"""plan()'s search: every layout it considers, each refused (a plan_rules kind) or priced with the least recompute
that fits, ranked best first; and, as it goes, the interleaved layouts (v > 1) it did not keep and why, so that the
note on interleaving (plan_notes.py) reads what the search found instead of planning again. Pure Python, predicted.
"""
from __future__ import annotations

import itertools
import math
from dataclasses import dataclass, field, replace
from typing import Iterator

from kit.experiments.theory.cluster import ClusterSpec
from kit.experiments.theory.layout import Layout
from kit.experiments.theory.layout_memory import MemoryBreakdown, ParallelConfig, memory_per_gpu
from kit.experiments.theory.layout_time import step_time
from kit.experiments.theory.models import ModelSpec
from kit.experiments.theory.plan_notes import Unkept
from kit.experiments.theory.plan_rules import Refusal, divisors, interleaving_refusal, refusal

__all__ = ["search", "Search", "layout_of", "unkept_of", "MICRO_BATCHES", "VIRTUAL_STAGES", "UNFIT"]

MICRO_BATCHES = (1, 2, 4, 8)
VIRTUAL_STAGES = (1, 2, 4)  # chunks per GPU; Megatron-LM's configs use a few (e.g. its 530B-scale runs)
UNFIT = "unfit"  # Plan.refused's kind for a layout that fits with none of the recomputes (the rules' kinds: plan_rules)
Tried = list[tuple[ParallelConfig, MemoryBreakdown]]  # a layout with each recompute tried, least first


@dataclass
class Search:
    """What the search found. `virtual` and `unfit_v` hold the interleaved layouts (v > 1) it did not keep:
    why Megatron-LM refuses v for pp stages and that many micro-batches (no candidate then), and, by (tp, pp, dp,
    cp, ep, zero, micro_batch, v), each recompute tried (config and memory, unpriced) for a candidate that fits
    with none of them."""
    layouts: list[Layout] = field(default_factory=list)   # ranked: fitting ones first, fastest first
    considered: int = 0
    refused: dict[str, int] = field(default_factory=dict)  # kind -> how many layouts broke it
    first: dict[str, str] = field(default_factory=dict)    # kind -> its first concrete reason
    smallest: Layout | None = None                          # the unfit layout needing least memory
    virtual: dict[tuple[int, int], list[tuple[int, Refusal | None]]] = field(default_factory=dict)
    unfit_v: dict[tuple[int, ...], Tried] = field(default_factory=dict)


def _key(pc: ParallelConfig, v: int) -> tuple[int, ...]:
    return pc.tp, pc.pp, pc.dp, pc.cp, pc.ep, pc.zero, pc.micro_batch, v


def layout_of(m: ModelSpec, c: ClusterSpec, pc: ParallelConfig, seq_len: int,
              utilisation: float | None = None, mem: MemoryBreakdown | None = None) -> Layout:
    """One layout's predicted memory and time (no validity check: see `refusal`)."""
    return Layout(pc, mem or memory_per_gpu(m, pc, seq_len), step_time(m, pc, c, seq_len, utilisation),
                  c.accelerator.memory_gib)


def _least_recompute(m: ModelSpec, c: ClusterSpec, pc: ParallelConfig, seq: int, utilisation: float | None,
                     recomputes: list[str], include_unfit: bool, below_gib: float
                     ) -> tuple[list[Layout], Layout | None, int, Tried]:
    """(the layout with the least recompute that fits, or every one with include_unfit; the smallest
    that did not fit, if under `below_gib`; how many recomputes were tried before one fit, all if none;
    each recompute tried with its memory)."""
    # the smallest unfit one is priced (step_time) only when it is kept: most are beaten by a smaller one
    unfit: tuple[ParallelConfig, MemoryBreakdown] | None = None
    found: list[Layout] = []
    tried: Tried = []
    for i, rc in enumerate(recomputes):
        pc_rc = replace(pc, recompute=rc) if rc != pc.recompute else pc
        mem = memory_per_gpu(m, pc_rc, seq)
        tried.append((pc_rc, mem))
        if mem.total_gib <= c.accelerator.memory_gib or include_unfit:
            found.append(layout_of(m, c, pc_rc, seq, utilisation, mem))
            if not include_unfit:
                return found, _priced(m, c, unfit, seq, utilisation), i, tried
        elif mem.total_gib < (unfit[1].total_gib if unfit else below_gib):
            unfit = (pc_rc, mem)
    return found, _priced(m, c, unfit, seq, utilisation), len(recomputes), tried


def _priced(m: ModelSpec, c: ClusterSpec, unfit: tuple[ParallelConfig, MemoryBreakdown] | None, seq: int,
            utilisation: float | None) -> Layout | None:
    return layout_of(m, c, unfit[0], seq, utilisation, unfit[1]) if unfit else None


def _fixed(value: int | None, options: list[int]) -> list[int]:
    return options if value is None else [value]


def _degrees(m: ModelSpec, c: ClusterSpec, knobs: dict[str, int | str | None]) -> Iterator[tuple[int, ...]]:
    """Every (tp, cp <= 32, pp, dp, ep) using the whole cluster: tp divides a node's GPUs, cp and pp what tp
    leaves, dp is the rest, ep divides the experts and dp. A fixed knob is kept as given, whether it divides
    or not, for `refusal` to judge (its reason names the value)."""
    world = c.world
    tps = _fixed(knobs["tp"], divisors(c.gpus_per_node))
    cps = _fixed(knobs["cp"], [d for d in divisors(world) if d <= 32])
    pps = _fixed(knobs["pp"], divisors(world))
    for tp, cp, pp in itertools.product(tps, cps, pps):
        rest = world // tp if world % tp == 0 else 0   # GPUs per tp group; 0: tp does not divide them
        if knobs["cp"] is None and not (rest and rest % cp == 0):
            continue
        if knobs["pp"] is None and not (rest and rest % cp == 0 and (rest // cp) % pp == 0):
            continue
        dp = world // (tp * cp * pp) if world % (tp * cp * pp) == 0 else 0
        if knobs["dp"] is not None and dp != knobs["dp"]:
            # a fixed dp wins over the one that would fill the cluster: the layout then uses more
            # or fewer GPUs than the cluster has, and plan_rules.refusal refuses it, naming the count
            dp = int(knobs["dp"])
        eps = [1] if m.experts == 1 else [e for e in divisors(m.experts) if dp and dp % e == 0]
        yield from ((tp, cp, pp, dp, ep) for ep in _fixed(knobs["ep"], eps))


def _candidates(m: ModelSpec, c: ClusterSpec, batch: int, knobs: dict[str, int | str | None], precision: str,
                framework: str, tp_overlap: bool, virtual: dict[tuple[int, int], list[tuple[int, Refusal | None]]]
                ) -> Iterator[ParallelConfig]:
    """Every layout of `_degrees` with each ZeRO stage, micro-batch size and number of virtual stages
    (plan picks the recompute), in the order of the degrees, then zero, micro_batch, virtual_stages. A v > 1
    that Megatron-LM does not allow (plan_rules.interleaving_refusal) is no candidate; `virtual` keeps why."""
    shapes = itertools.product(_degrees(m, c, knobs), _fixed(knobs["zero"], [0, 1, 2, 3]),
                               _fixed(knobs["micro_batch"], list(MICRO_BATCHES)))
    for (tp, cp, pp, dp, ep), zero, micro_batch in shapes:
        micro_batches = max(batch // (max(dp, 1) * micro_batch), 1)
        options = virtual.get((pp, micro_batches))
        if options is None:
            options = virtual[(pp, micro_batches)] = _virtual(m, pp, micro_batches, knobs["virtual_stages"])
        for virtual_stages, why_not in options:
            if why_not:
                continue
            yield ParallelConfig(
                tp=tp, pp=pp, dp=max(dp, 1), cp=cp, ep=ep, zero=zero, micro_batch=micro_batch,
                micro_batches=micro_batches, recompute="none", sp=tp > 1,
                schedule="interleaved_1f1b" if virtual_stages > 1 else "1f1b", precision=precision,
                virtual_stages=virtual_stages, framework=framework, tp_overlap=tp_overlap and tp > 1)


def _virtual(m: ModelSpec, pp: int, micro_batches: int, fixed: int | str | None) -> list[tuple[int, Refusal | None]]:
    """Each v with why Megatron-LM does not allow it (plan_rules.interleaving_refusal), None when it does; a fixed
    v is kept as given, for `refusal` to judge."""
    if fixed is not None:
        return [(int(fixed), None)]
    return [(stages, interleaving_refusal(m, pp, micro_batches, stages)) for stages in VIRTUAL_STAGES]


def search(m: ModelSpec, c: ClusterSpec, seq: int, batch: int, knobs: dict[str, int | str | None], precision: str,
           framework: str, tp_overlap: bool, utilisation: float | None, recomputes: list[str], include_unfit: bool
           ) -> Search:
    """Each candidate refused (counted by kind) or priced with the least recompute that fits, ranked."""
    s = Search()
    floor: dict[tuple[int, ...], int] = {}  # (degrees, micro-batch) -> index of the least recompute v = 1 fit with
    for pc in _candidates(m, c, batch, knobs, precision, framework, tp_overlap, s.virtual):
        s.considered += 1
        why_not = refusal(m, c, pc, seq, batch, framework)
        if why_not:  # one line per kind of reason in the summary, with the first layout's reason
            s.first.setdefault(why_not.kind, why_not.reason)
            s.refused[why_not.kind] = s.refused.get(why_not.kind, 0) + 1
            continue
        # Less recomputation is never slower, so keep the least that fits (all of them with include_unfit).
        # v > 1 holds more activations than v = 1 (the candidate just before it): start where that one fit.
        shape = (pc.tp, pc.pp, pc.dp, pc.cp, pc.ep, pc.zero, pc.micro_batch)
        start = floor.get(shape, 0) if pc.virtual_stages > 1 and not include_unfit else 0
        found, unfit, fitted, tried = _least_recompute(m, c, pc, seq, utilisation, recomputes[start:], include_unfit,
                                                       s.smallest.memory_gib if s.smallest else math.inf)
        s.layouts += found
        if pc.virtual_stages == 1:
            floor[shape] = start + fitted
        elif not any(x.fits for x in found):
            s.unfit_v[_key(pc, pc.virtual_stages)] = tried
        s.smallest = unfit or s.smallest
        if not found:
            s.first.setdefault(UNFIT, f"does not fit in memory (even with recompute={recomputes[-1]})")
            s.refused[UNFIT] = s.refused.get(UNFIT, 0) + 1
    # Ties (within 0.1%) go to the simpler layout: not ZeRO-3 (1.5x the traffic; ZeRO-1 and 2 move
    # what DDP moves), fewer cp, pp ranks, fewer virtual stages, fewer tp ranks; then to less memory.
    best = min((x.step_s for x in s.layouts), default=1.0)
    s.layouts.sort(key=lambda x: (not x.fits, round(x.step_s / best, 3), x.config.zero == 3, x.config.cp,
                                  x.config.pp, x.config.virtual_stages, x.config.tp, x.memory_gib))
    return s


def unkept_of(m: ModelSpec, c: ClusterSpec, seq: int, utilisation: float | None, s: Search, best: Layout,
              tried: list[int]) -> dict[int, Unkept]:
    """The interleaved layouts of the best one's degrees, zero and micro-batch that the search did not keep, by v:
    refused, or (none of the recomputes fits) priced with the best's recompute, the bubble the note compares. Only
    these few are priced, as the smallest unfit layout is only when kept (`_least_recompute`)."""
    unkept: dict[int, Unkept] = {}
    if best.config.virtual_stages > 1:
        return unkept  # the note compares the best with its v = 1 counterpart in the plan's layouts
    # The best passed every rule with v = 1, and only plan_rules.interleaving_refusal reads v: each of its v > 1
    # was refused there (no candidate), or was a candidate that fit (in the plan's layouts) or did not (unfit_v).
    refused = dict(s.virtual.get((best.config.pp, best.config.micro_batches), []))
    for v in (v for v in tried if v > 1):
        key = _key(best.config, v)
        why_not = refused.get(v)
        if why_not:
            unkept[v] = Unkept(v, refused=why_not)
        elif key in s.unfit_v:
            recomputes = s.unfit_v[key]
            # always there: the search tried v > 1 from the recompute its v = 1 sibling (the best) fit with on,
            # and with include_unfit every recompute
            pc, mem = next((pc, mem) for pc, mem in recomputes if pc.recompute == best.config.recompute)
            unkept[v] = Unkept(v, priced=layout_of(m, c, pc, seq, utilisation, mem),
                               most_recompute=recomputes[-1][0].recompute,
                               most_recompute_gib=recomputes[-1][1].total_gib)
    return unkept
