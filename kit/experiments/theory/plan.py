"""Plan a training run: every layout of a model on a cluster, its predicted memory and step time, best first.

    from kit.experiments import plan
    p = plan("llama3-70b", nodes=128, gpus_per_node=8, accelerator="h100", seq_len=4096)
    print(p.describe())      # the top layouts in words; p.table() for the rest; p[0].config.tp, p[0].mfu ...

Pure Python, never imports torch (tests/test_plan.py checks it in a subprocess). The formulas are in
layout_memory.py and layout_time.py beside this file, their sources in docs/predicting.md
("Planning a run"); what it refuses, and why, in plan_rules.py. Every number here is predicted, none measured.

Enumerated: tp dividing the GPUs of a node and the query and KV heads; cp (at most 32) dividing the sequence;
pp up to the number of layers; dp the rest; ep dividing the experts and dp (MoE only); ZeRO 0-3 under the
framework's rules (plan_rules.refusal: DeepSpeed refuses ZeRO-2/3 with pp > 1, Megatron-LM has ZeRO-1 only;
FSDP beside a pipeline is torchtitan's way); micro-batch 1, 2, 4, 8; sequence parallel whenever tp > 1;
1F1B, and interleaved 1F1B with v = 2 or 4 virtual stages per GPU where Megatron-LM allows it (pp > 1, the
layers split into pp x v chunks, the micro-batches a multiple of pp; less bubble, v times the pipeline sends,
more activations). For each, the least recomputation that fits (none, then the framework's selective kind,
then full: more recomputation only adds time). Ranked by step time (the global batch is fixed, so the same
as throughput), then by memory. How far to trust it: bench/bench_plan_published.py (published runs).
"""
from __future__ import annotations

import itertools
import math
import time
from dataclasses import dataclass, replace
from typing import Iterator

from kit.experiments.theory.cluster import ClusterSpec, make_cluster
from kit.experiments.theory.layout import Layout
from kit.experiments.theory.layout_memory import MemoryBreakdown, ParallelConfig, memory_per_gpu
from kit.experiments.theory.layout_time import step_time
from kit.experiments.theory.models import ModelSpec, get_model
from kit.experiments.theory.plan_notes import interleaving_note
from kit.experiments.theory.plan_rules import (
    PlanError, check_arguments, check_fixed, divisors, interleaving_refusal, refusal,
)
from kit import _renamed

__all__ = ["plan", "Plan", "Layout", "PlanError", "layout_of", "refusal", "DEFAULT_BATCH_TOKENS"]
__getattr__ = _renamed.renamed_getattr(__name__)  # this release's old names, for one release

# Llama 3 405B's pre-training started at 4M tokens per step (Dubey et al. 2024, Sec. 3.4.1).
DEFAULT_BATCH_TOKENS = 4 * 2**20
MICRO_BATCHES = (1, 2, 4, 8)
VIRTUAL_STAGES = (1, 2, 4)  # chunks per GPU; Megatron-LM's configs use a few (e.g. its 530B-scale runs)
# least recomputation first; the selective kind each framework has: Korthikanti's (the attention core) in
# Megatron-LM and DeepSpeed, torchtitan's per-op policy in torch (with fused attention Korthikanti's saves nothing)
RECOMPUTES = {"torch": ("none", "op", "full"), "megatron": ("none", "selective", "full"),
              "deepspeed": ("none", "selective", "full")}
UNFIT = "unfit"  # Plan.refused's kind for a layout that fits with none of the recomputes (the rules' kinds: plan_rules)


@dataclass(frozen=True)
class Plan:
    """Layouts best first (iterate, index, len), what was considered and why others were refused."""
    model: ModelSpec
    cluster: ClusterSpec
    seq_len: int
    global_batch: int           # sequences per optimizer step
    layouts: tuple[Layout, ...]
    considered: int
    refused: tuple[tuple[str, int], ...]   # (first reason of a kind, how many layouts were refused for that kind)
    smallest: Layout | None     # the layout needing least memory (says how far off a plan that fits nothing is)
    elapsed_s: float
    interleaving: str = ""      # why the best layout does or does not interleave (empty when pp = 1)

    def __iter__(self) -> Iterator[Layout]:
        return iter(self.layouts)

    def __len__(self) -> int:
        return len(self.layouts)

    def __getitem__(self, i: int) -> Layout:
        return self.layouts[i]

    def table(self, top: int = 10) -> str:
        head = f"{'#':>3} {'tp':>3} {'pp':>3} {'v':>2} {'dp':>5} {'cp':>3} {'ep':>3} {'zero':>4} {'mb':>3} " \
               f"{'m':>5} {'recompute':>9} {'GiB':>6} {'step s':>8} {'MFU':>5}"
        rows = [head + "   (all predicted)"]
        for i, x in enumerate(self.layouts[:top]):
            c = x.config
            rows.append(f"{i + 1:>3} {c.tp:>3} {c.pp:>3} {c.virtual_stages:>2} {c.dp:>5} {c.cp:>3} {c.ep:>3} "
                        f"{c.zero:>4} {c.micro_batch:>3} {c.micro_batches:>5} {c.recompute:>9} {x.memory_gib:>6.1f} "
                        f"{x.step_s:>8.2f} {x.mfu:>5.1%}")
        return "\n".join(rows)

    def describe(self, top: int = 3) -> str:
        c, m = self.cluster, self.model
        lines = [f"Plan (predicted) for {m.name} ({m.params() / 1e9:.2f}B parameters), seq {self.seq_len}, "
                 f"{self.global_batch} sequences per step, on {c.describe()}.",
                 f"{self.considered} layouts (each with the least recompute that fits) considered in "
                 f"{self.elapsed_s * 1e3:.0f} ms; {len(self.layouts)} fit "
                 f"in {c.accelerator.memory_gib:.0f} GiB."]
        if not self.layouts:
            lines.append("Nothing fits." + (f" The smallest, {self.smallest.name()}, needs "
                                            f"{self.smallest.memory_gib:.1f} GiB per GPU." if self.smallest else "")
                         + " More GPUs, a shorter sequence, or a smaller model.")
        for i, x in enumerate(self.layouts[:top]):
            lines.append(f"{i + 1}. {x.describe()}")
        if self.interleaving:
            lines.append(self.interleaving)
        if self.refused:
            lines.append("Refused: " + "; ".join(f"{r} ({n} like it)" for r, n in self.refused))
        return "\n".join(lines)


def layout_of(m: ModelSpec, c: ClusterSpec, pc: ParallelConfig, seq_len: int,
              utilisation: float | None = None, mem: MemoryBreakdown | None = None) -> Layout:
    """One layout's predicted memory and time (no validity check: see `refusal`)."""
    return Layout(pc, mem or memory_per_gpu(m, pc, seq_len), step_time(m, pc, c, seq_len, utilisation),
                  c.accelerator.memory_gib)


def _least_recompute(m: ModelSpec, c: ClusterSpec, pc: ParallelConfig, seq: int, utilisation: float | None,
                     recomputes: list[str], include_unfit: bool, below_gib: float
                     ) -> tuple[list[Layout], Layout | None, int]:
    """(the layout with the least recompute that fits, or every one with include_unfit; the smallest
    that did not fit, if under `below_gib`; how many recomputes were tried before one fit, all if none)."""
    # the smallest unfit one is priced (step_time) only when it is kept: most are beaten by a smaller one
    unfit: tuple[ParallelConfig, MemoryBreakdown] | None = None
    found: list[Layout] = []
    for i, rc in enumerate(recomputes):
        pc_rc = replace(pc, recompute=rc) if rc != pc.recompute else pc
        mem = memory_per_gpu(m, pc_rc, seq)
        if mem.total_gib <= c.accelerator.memory_gib or include_unfit:
            found.append(layout_of(m, c, pc_rc, seq, utilisation, mem))
            if not include_unfit:
                return found, _priced(m, c, unfit, seq, utilisation), i
        elif mem.total_gib < (unfit[1].total_gib if unfit else below_gib):
            unfit = (pc_rc, mem)
    return found, _priced(m, c, unfit, seq, utilisation), len(recomputes)


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


def _candidates(m: ModelSpec, c: ClusterSpec, batch: int, knobs: dict[str, int | str | None],
                precision: str, framework: str, tp_overlap: bool = False) -> Iterator[ParallelConfig]:
    """Every layout of `_degrees` with each ZeRO stage, micro-batch size and number of virtual stages
    (plan picks the recompute), in the order of the degrees, then zero, micro_batch, virtual_stages."""
    shapes = itertools.product(_degrees(m, c, knobs), _fixed(knobs["zero"], [0, 1, 2, 3]),
                               _fixed(knobs["micro_batch"], list(MICRO_BATCHES)))
    for (tp, cp, pp, dp, ep), zero, micro_batch in shapes:
        micro_batches = max(batch // (max(dp, 1) * micro_batch), 1)
        for virtual_stages in _virtual(m, pp, micro_batches, knobs["virtual_stages"]):
            yield ParallelConfig(
                tp=tp, pp=pp, dp=max(dp, 1), cp=cp, ep=ep, zero=zero, micro_batch=micro_batch,
                micro_batches=micro_batches, recompute="none", sp=tp > 1,
                schedule="interleaved_1f1b" if virtual_stages > 1 else "1f1b", precision=precision,
                virtual_stages=virtual_stages, framework=framework, tp_overlap=tp_overlap and tp > 1)


def _virtual(m: ModelSpec, pp: int, micro_batches: int, fixed: int | str | None) -> list[int]:
    """v = 1, and the v > 1 Megatron-LM allows (plan_rules.interleaving_refusal); a fixed v is kept as
    given, for `refusal` to judge."""
    if fixed is not None:
        return [int(fixed)]
    return [stages for stages in VIRTUAL_STAGES if interleaving_refusal(m, pp, micro_batches, stages) is None]


def _search(m: ModelSpec, c: ClusterSpec, seq: int, batch: int, knobs: dict[str, int | str | None], precision: str,
            framework: str, tp_overlap: bool, utilisation: float | None, recomputes: list[str], include_unfit: bool
            ) -> tuple[list[Layout], int, dict[str, int], dict[str, str], Layout | None]:
    """Each candidate refused (counted by kind) or priced with the least recompute that fits: (the layouts
    ranked, how many were considered, refused per kind, each kind's first concrete reason, the smallest unfit)."""
    out: list[Layout] = []
    refused: dict[str, int] = {}
    first: dict[str, str] = {}  # kind -> its first concrete reason
    considered = 0
    smallest: Layout | None = None
    floor: dict[tuple[int, ...], int] = {}  # (degrees, micro-batch) -> index of the least recompute v = 1 fit with
    for pc in _candidates(m, c, batch, knobs, precision, framework, tp_overlap):
        considered += 1
        why_not = refusal(m, c, pc, seq, batch, framework)
        if why_not:  # one line per kind of reason in the summary, with the first layout's reason
            first.setdefault(why_not.kind, why_not.reason)
            refused[why_not.kind] = refused.get(why_not.kind, 0) + 1
            continue
        # Less recomputation is never slower, so keep the least that fits (all of them with include_unfit).
        # v > 1 holds more activations than v = 1 (the candidate just before it): start where that one fit.
        shape = (pc.tp, pc.pp, pc.dp, pc.cp, pc.ep, pc.zero, pc.micro_batch)
        start = floor.get(shape, 0) if pc.virtual_stages > 1 and not include_unfit else 0
        found, unfit, fitted = _least_recompute(m, c, pc, seq, utilisation, recomputes[start:], include_unfit,
                                                smallest.memory_gib if smallest else math.inf)
        out += found
        if pc.virtual_stages == 1:
            floor[shape] = start + fitted
        smallest = unfit or smallest
        if not found:
            first.setdefault(UNFIT, f"does not fit in memory (even with recompute={recomputes[-1]})")
            refused[UNFIT] = refused.get(UNFIT, 0) + 1
    # Ties (within 0.1%) go to the simpler layout: not ZeRO-3 (1.5x the traffic; ZeRO-1 and 2 move
    # what DDP moves), fewer cp, pp ranks, fewer virtual stages, fewer tp ranks; then to less memory.
    best = min((x.step_s for x in out), default=1.0)
    out.sort(key=lambda x: (not x.fits, round(x.step_s / best, 3), x.config.zero == 3, x.config.cp, x.config.pp,
                            x.config.virtual_stages, x.config.tp, x.memory_gib))
    return out, considered, refused, first, smallest


def plan(model: str | ModelSpec, nodes: int = 1, gpus_per_node: int = 8, accelerator: str = "h100",
         seq_len: int | None = None, global_batch: int | None = None, precision: str = "bf16",
         utilisation: float | None = None, cluster: ClusterSpec | None = None, include_unfit: bool = False,
         tp: int | None = None, pp: int | None = None, dp: int | None = None, cp: int | None = None,
         ep: int | None = None, zero: int | None = None, micro_batch: int | None = None,
         recompute: str | None = None, virtual_stages: int | None = None, framework: str = "torch",
         tp_overlap: bool = False) -> Plan:
    """Every valid layout of `model` on the cluster, predicted, fitting ones best first.

    `global_batch` is in sequences (default: 4M tokens' worth). Fix any knob (tp=8, zero=1,
    virtual_stages=2 for interleaved 1F1B, ...) to
    plan only around it; an impossible fixed knob raises PlanError with the reason.
    `include_unfit=True` also returns the layouts that do not fit (ranked after those that do).
    `utilisation`: the share of the peak FLOP/s every matmul sustains; None (default): by the layer's
    per-GPU width (gemm_efficiency.py, fitted on published runs).
    `framework`: whose rules a layout must follow: "torch" (FSDP2, torchtitan), "megatron" or "deepspeed"
    (which refuses ZeRO-2/3 with pipeline parallelism). `tp_overlap=True`: tensor parallelism's collectives
    overlap the matmuls they feed (async TP), instead of sitting on the critical path.
    """
    t0 = time.perf_counter()
    knobs = {"tp": tp, "pp": pp, "dp": dp, "cp": cp, "ep": ep, "zero": zero, "micro_batch": micro_batch,
             "recompute": recompute, "virtual_stages": virtual_stages, "tp_overlap": tp_overlap}
    check_arguments(model, nodes, gpus_per_node, accelerator, seq_len, global_batch, precision, utilisation,
                    cluster, include_unfit, knobs, framework)  # types and ranges first: a clear message, not a deep TypeError
    m = get_model(model)
    seq = int(seq_len or m.seq_len)
    c = cluster or make_cluster(int(nodes), int(gpus_per_node), accelerator)
    batch = int(global_batch or max(1, DEFAULT_BATCH_TOKENS // seq))
    check_fixed(m, c, seq, batch, knobs, precision, framework)
    recomputes = [str(recompute)] if recompute else list(RECOMPUTES[framework])
    out, considered, refused, first, smallest = _search(m, c, seq, batch, knobs, precision, framework, tp_overlap,
                                                        utilisation, recomputes, include_unfit)
    if considered and not out and not refused.get(UNFIT) and not include_unfit:
        raise PlanError("no layout is possible: " + "; ".join(first.values()))
    tried = [int(virtual_stages)] if virtual_stages else list(VIRTUAL_STAGES)
    note = (interleaving_note(m, c, seq, batch, utilisation, framework, out, tried, recomputes[-1])
            if out and out[0].fits else "")
    return Plan(m, c, seq, batch, tuple(out), considered,
                tuple(sorted(((first[k], n) for k, n in refused.items()), key=lambda kv: -kv[1])),
                smallest, time.perf_counter() - t0, note)

