"""One planned layout (`Layout`: its degrees and schedule, its predicted memory and step time) and `explain`, the
sentence that says what it costs. Its own module so that plan.py (which makes Layouts) and plan_notes.py (which
compares them) both import it, one way (pure Python, predicted).
"""
from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

from kit import _renamed
from kit.experiments.theory.layout_memory import MemoryBreakdown, ParallelConfig
from kit.experiments.theory.layout_time import TimeBreakdown

__all__ = ["Layout", "explain"]


@dataclass(frozen=True)
class Layout:
    """One layout (`config`, its degrees and schedule) and what it is predicted to cost (every number predicted)."""
    config: ParallelConfig
    memory: MemoryBreakdown = field(repr=False)
    time: TimeBreakdown = field(repr=False)
    capacity_gib: float = field(repr=False, default=0.0)
    __getattr__ = _renamed.renamed_attributes("kit.experiments.theory.layout:Layout")  # layout.tp: layout.config.tp

    @property
    def memory_gib(self) -> float:
        return self.memory.total_gib

    @property
    def step_s(self) -> float:
        return self.time.step_s

    @property
    def mfu(self) -> float:
        return self.time.mfu

    @property
    def fits(self) -> bool:
        return self.memory.total_gib <= self.capacity_gib

    @property
    def why(self) -> str:
        """One sentence: which dimension crosses which link, what it costs, what dominates."""
        return explain(self)

    def describe(self) -> str:
        return f"{self.name()}: {self.why}\n  memory: {self.memory.text()}"

    def as_dict(self) -> dict[str, Any]:
        """Plain JSON-safe values (the breakdowns as dicts, `why` included), every number predicted."""
        out = asdict(self)
        out["time"]["links"] = dict(self.time.links)
        out["memory"]["total_gib"] = self.memory.total_gib
        return _renamed.RenamedKeys("Layout.as_dict()", {  # ["tp"] (the previous release's): ["config"]["tp"]
            **out, "memory_gib": self.memory_gib, "step_s": self.step_s, "mfu": self.mfu, "fits": self.fits,
            "why": self.why, "predicted": True})

    def __repr__(self) -> str:
        """The layout and its predicted cost in one line (the dataclass's repr showed only `config=`: a cell
        ending in `p[0]` gave the degrees and none of the numbers the plan is for)."""
        fits = "" if self.fits or not self.capacity_gib else f" (over the {self.capacity_gib:.0f} GiB)"
        return (f"<Layout {self.name()}: {self.memory_gib:.1f} GiB{fits}, {self.step_s:.2f} s per step, MFU "
                f"{self.mfu:.1%} (predicted); .config, .why, .memory.text()>")

    def name(self) -> str:
        c = self.config
        z = f" ZeRO-{c.zero}" if c.zero else ""
        e = f" ep{c.ep}" if c.ep > 1 else ""
        v = f" v{c.virtual_stages}" if c.virtual_stages > 1 else ""
        return f"tp{c.tp} pp{c.pp}{v} dp{c.dp} cp{c.cp}{e}{z} mb{c.micro_batch}x{c.micro_batches} recompute={c.recompute}"


def explain(layout: Layout) -> str:
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
