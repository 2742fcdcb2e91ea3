"""Plan a training run: every layout of a model on a cluster, its predicted memory and step time, best first.

    from kit.experiments import plan
    p = plan("llama3-70b", nodes=128, gpus_per_node=8, accelerator="h100", seq_len=4096)
    print(p.describe())      # the top layouts in words; p.table() for the rest; p[0].config.tp, p[0].mfu ...

Pure Python, never imports torch (tests/test_plan.py checks it in a subprocess). The formulas are in
layout_memory.py and layout_time.py beside this file, their sources in docs/predicting.md
("Planning a run"); what it refuses, and why, in plan_rules.py; the search itself in plan_search.py, which also
keeps the interleaved layouts it did not keep for plan_notes.py's sentence (that note plans nothing itself).
Every number here is predicted, none measured.

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

import time
from dataclasses import dataclass
from typing import Iterator

from kit.experiments.theory.cluster import ClusterSpec, cluster_spec
from kit.experiments.theory.layout import Layout
from kit.experiments.theory.models import ModelSpec, get_model
from kit.experiments.theory.plan_notes import interleaving_note
from kit.experiments.theory.plan_rules import NEAR_KEYWORDS, PlanError, check_arguments, check_fixed, refusal
from kit.experiments.theory.plan_search import UNFIT, VIRTUAL_STAGES, layout_of, search, unkept_of
from kit.keywords import names_unknown_keywords
from kit import _renamed

__all__ = ["plan", "Plan", "Layout", "PlanError", "layout_of", "refusal", "DEFAULT_BATCH_TOKENS"]
__getattr__ = _renamed.renamed_getattr(__name__)  # this release's old names, for one release

# Llama 3 405B's pre-training started at 4M tokens per step (Dubey et al. 2024, Sec. 3.4.1).
DEFAULT_BATCH_TOKENS = 4 * 2**20
# least recomputation first; the selective kind each framework has: Korthikanti's (the attention core) in
# Megatron-LM and DeepSpeed, torchtitan's per-op policy in torch (with fused attention Korthikanti's saves nothing)
RECOMPUTES = {"torch": ("none", "op", "full"), "megatron": ("none", "selective", "full"),
              "deepspeed": ("none", "selective", "full")}


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

    def __repr__(self) -> str:
        """A few lines, not the dataclass's every layout (a notebook cell ending in `p` printed ~900,000
        characters for Llama-3 70B on 1024 GPUs); describe() and table() say more."""
        b, s = (self[0] if self.layouts else None), self.smallest  # nothing fits: no p[0] to point at
        found = (f"{sum(1 for x in self.layouts if x.fits)} of {self.considered} layouts fit; best {b.name()}: "
                 f"{b.memory_gib:.1f} GiB, {b.step_s:.2f} s per step, MFU {b.mfu:.1%}. print(p.describe()) for the top "
                 "3 in words, print(p.table(10)) for a table, p[0] for the best" if b else
                 f"none of {self.considered} layouts fit" + (f"; the smallest, {s.name()}, needs {s.memory_gib:.1f} "
                                                             "GiB per GPU" if s else "") + ". print(p.describe()) says what to change")
        return (f"<Plan (predicted) for {self.model.name} on {self.cluster.nodes} x {self.cluster.gpus_per_node} "
                f"{self.cluster.accelerator.name}, seq {self.seq_len}: {found}>")

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


@names_unknown_keywords(near=NEAR_KEYWORDS)  # plan(m, gpu_per_node=8): 'did you mean gpus_per_node=?'
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
    c = cluster or cluster_spec(int(nodes), int(gpus_per_node), accelerator)
    batch = int(global_batch or max(1, DEFAULT_BATCH_TOKENS // seq))
    check_fixed(m, c, seq, batch, knobs, precision, framework)
    recomputes = [str(recompute)] if recompute else list(RECOMPUTES[framework])
    s = search(m, c, seq, batch, knobs, precision, framework, tp_overlap, utilisation, recomputes, include_unfit)
    out = s.layouts
    if s.considered and not out and not s.refused.get(UNFIT) and not include_unfit:
        raise PlanError("no layout is possible: " + "; ".join(s.first.values()))
    tried = [int(virtual_stages)] if virtual_stages else list(VIRTUAL_STAGES)
    note = (interleaving_note(out, tried, unkept_of(m, c, seq, utilisation, s, out[0], tried))
            if out and out[0].fits else "")
    return Plan(m, c, seq, batch, tuple(out), s.considered,
                tuple(sorted(((s.first[k], n) for k, n in s.refused.items()), key=lambda kv: -kv[1])),
                s.smallest, time.perf_counter() - t0, note)
