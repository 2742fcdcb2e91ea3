"""The planner held against published runs: one comparison per run and a summary against the targets.

Pure Python, no torch. `compare_published(run)` plans the published layout (its stated knobs fixed, the rest the
planner's pick) and the whole space of layouts on the same cluster, model, sequence and batch, and
returns predicted against published throughput in the source's own convention, predicted against
measured memory, whether the published layout fits, its rank and its gap to the planner's best.
`summarise(rows)` holds the rows to `TARGETS` (below: which share of runs must fit, predict their throughput
close, their memory and their layout's rank); bench/bench_plan_published.py prints both.
"""
from __future__ import annotations

import statistics
from dataclasses import dataclass
from typing import Any, Sequence

from kit import _renamed
from kit.experiments.theory.layout import Layout
from kit.experiments.theory.plan import PlanError, plan
from kit.experiments.theory.published import METRICS, PublishedRun, source_flops_per_step

__all__ = ["Comparison", "compare_published", "summarise", "TARGETS", "published_step_s"]
__getattr__ = _renamed.renamed_getattr(__name__)  # this release's old names, for one release

TARGETS = {"fits": 1.0, "throughput_within_15pct": 0.80, "memory_median_error": 0.15, "within_10pct_of_best": 0.80}
A100_PEAK = 312e12  # the peak the MFU sources divide by (docs/published-runs.md)


@dataclass(frozen=True)
class Comparison:
    run: PublishedRun
    layout: Layout | None        # the published layout as the planner predicts it (None: not expressible)
    why_not: str = ""            # why the planner refused it
    rank: int = 0                # 1 = the planner's first choice; 0 = not ranked (nothing fits)
    gap: float = 0.0             # predicted step time over the best layout's, minus 1
    best: Layout | None = None   # among the layouts the run's software could run (run.limits)
    gap_today: float = 0.0       # the same gap against every layout the planner tries (later features too)

    @property
    def predicted(self) -> float | None:
        """The predicted throughput in the source's convention."""
        if self.layout is None or self.run.published is None:
            return None
        return self.run.published * published_step_s(self.run) / self.layout.step_s

    @property
    def ratio(self) -> float | None:
        return None if self.predicted is None or not self.run.published else self.predicted / self.run.published

    @property
    def memory_ratio(self) -> float | None:
        if self.layout is None or not self.run.memory_gib:
            return None
        return self.layout.memory_gib / self.run.memory_gib

    def __repr__(self) -> str:
        """What the comparison found, each number labelled measured (the paper's) or predicted (the planner's); the
        dataclass repr was about 2,300 characters of nested specs and no sentence."""
        head = f"<Comparison {self.run.id} ({self.run.run}): "
        if self.layout is None:
            return head + f"the planner cannot express it: {self.why_not}>"
        unit = METRICS.get(self.run.metric, self.run.metric).split(",")[0]
        said = []
        if self.predicted is not None:
            v = self.predicted
            said.append(f"{unit} published {self.run.published:g} (measured), predicted "
                        f"{f'{v:,.0f}' if v >= 100 else f'{v:.3g}'} (ratio {self.ratio:.2f})")
        if self.run.memory_gib:
            said.append(f"memory per GPU published {self.run.memory_gib:g} GiB, predicted {self.layout.memory_gib:.1f}")
        if self.rank == 1:
            said.append("its layout is the planner's first choice (predicted)")
        elif self.rank:
            said.append(f"its layout ranks {self.rank} among the planner's, {self.gap:.0%} slower than the best "
                        "(predicted)")
        return head + "; ".join(said or ["nothing to compare"]) + "; .layout, .best, .why_not>"


def published_step_s(run: PublishedRun) -> float:
    """The step time the published figure implies, by the source's own FLOP count."""
    work, gpus, v = source_flops_per_step(run), run.cluster.world, float(run.published or 0)
    per_gpu = {"tflops_eq3": v * 1e12, "mfu_eq7": v * A100_PEAK, "mfu_6n": v * A100_PEAK, "tokens": v}[run.metric]
    return work / (gpus * per_gpu)


def _plan(run: PublishedRun, **knobs: Any) -> Any:
    return plan(run.model, cluster=run.cluster, seq_len=run.seq_len, global_batch=run.global_batch,
                precision=run.precision, framework=run.framework, **knobs)


def compare_published(run: PublishedRun) -> Comparison:
    try:
        mine = _plan(run, include_unfit=True, **run.knobs)
    except PlanError as e:
        return Comparison(run, None, str(e))
    if not len(mine):
        return Comparison(run, None, "; ".join(r for r, _ in mine.refused) or "nothing possible")
    layout = mine[0]
    recompute = {"recompute": run.knobs["recompute"]} if "recompute" in run.knobs else {}
    # every layout the run's software could run, with the recompute the source chose (or the least that fits)
    space = _plan(run, **recompute, **dict(run.limits))
    if not len(space):
        return Comparison(run, layout)
    best = space[0]
    today = _plan(run, **recompute)[0] if run.limits else best
    faster = sum(1 for x in space if x.step_s < layout.step_s * 0.999)
    return Comparison(run, layout, rank=faster + 1, gap=layout.step_s / best.step_s - 1, best=best,
                      gap_today=layout.step_s / today.step_s - 1)


def _sc21_order(rows: Sequence[Comparison]) -> tuple[int, int, bool]:
    """(GPU counts where PTD-P is predicted above ZeRO-3, counts compared, ZeRO-3 predicted falling)."""
    t2 = {r.run.id: r for r in rows if r.run.id.startswith("sc21-t2") and r.predicted}
    won = total = 0
    falling = True
    for size in ("174.6B", "529.6B"):
        z = sorted(((r.run.cluster.world, r.predicted) for k, r in t2.items() if f"zero3-{size}" in k))
        p = sorted(((r.run.cluster.world, r.predicted) for k, r in t2.items() if f"ptd-{size}" in k))
        falling &= len(z) > 1 and all(a[1] > b[1] for a, b in zip(z, z[1:]))
        for (_, zv), (_, pv) in zip(z, p):   # the i-th smallest count of each (560 with 640 for 529.6B)
            total += 1
            won += pv > zv
    return won, total, falling


def summarise(rows: Sequence[Comparison]) -> dict[str, Any]:
    """The targets, each as (measured share or value, target, met)."""
    shown = [r for r in rows if r.layout is not None]
    fits = sum(r.layout.fits for r in shown)  # type: ignore[union-attr]
    comparable = [r for r in shown if r.run.comparable and r.ratio is not None]
    within = sum(abs(r.ratio - 1) <= 0.15 for r in comparable)  # type: ignore[operator]
    mem = [abs(r.memory_ratio - 1) for r in shown if r.memory_ratio is not None]  # type: ignore[operator]
    ranked = [r for r in shown if r.rank]
    near = sum(r.gap <= 0.10 for r in ranked)
    near_today = sum(r.gap_today <= 0.10 for r in ranked)
    won, total, falling = _sc21_order(rows)
    ratios = [r.ratio for r in comparable]
    return {
        "expressible": (len(shown), len(rows)),
        "fits": (fits, len(shown), fits == len(shown)),
        "throughput_within_15pct": (within, len(comparable), within >= TARGETS["throughput_within_15pct"] * len(comparable)),
        "median_predicted_over_published": statistics.median(ratios) if ratios else float("nan"),
        "memory_median_error": (statistics.median(mem) if mem else float("nan"), len(mem),
                                bool(mem) and statistics.median(mem) <= TARGETS["memory_median_error"]),
        "sc21_table2_order": (won, total, falling, won == total and falling),
        "within_10pct_of_best": (near, len(ranked), near >= TARGETS["within_10pct_of_best"] * len(ranked)),
        "within_10pct_of_best_today": (near_today, len(ranked)),
        "first_choice": (sum(r.rank == 1 for r in ranked), len(ranked)),
        "top5": (sum(1 <= r.rank <= 5 for r in ranked), len(ranked)),
    }
