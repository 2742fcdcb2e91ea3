"""A plan's layouts side by side: predicted memory per GPU (left) and predicted step time (right).

    from kit.experiments import plan
    from kit.plots import plan_layouts
    plan_layouts(plan("llama3-70b", nodes=8, seq_len=4096))   # a Figure

Why stacked bars of the parts rather than one number per layout: a plan is chosen on *why* one
layout beats another (activations vs optimizer state, bubble vs TP traffic), and the parts show it.
Every bar is a formula's output, so all are hatched as predicted; the dashed line is the GPU's memory.
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Any

from kit.plots._style import COLUMN_WIDTH_IN, OKABE_ITO, PREDICTED_HATCH, add_marking_legend, new_figure

if TYPE_CHECKING:
    from matplotlib.figure import Figure

__all__ = ["plan_layouts", "plan_vs_published"]

_MEMORY = (("params_gib", "parameters", OKABE_ITO["blue"]), ("grads_gib", "gradients", OKABE_ITO["sky"]),
           ("optimizer_gib", "optimizer state", OKABE_ITO["green"]),
           ("activations_gib", "activations", OKABE_ITO["orange"]),
           ("gathered_gib", "ZeRO-3 gathered", OKABE_ITO["yellow"]), ("logits_gib", "logits", OKABE_ITO["purple"]),
           ("allowance_gib", "context + fragmentation", OKABE_ITO["grey"]))
_TIME = (("compute_s", "compute", OKABE_ITO["blue"]), ("tp_s", "TP all-reduces", OKABE_ITO["orange"]),
         ("bubble_s", "pipeline bubble", OKABE_ITO["grey"]),
         ("dp_exposed_s", "exposed DP traffic", OKABE_ITO["vermillion"]),
         ("ep_s", "expert all-to-all", OKABE_ITO["purple"]),
         ("cp_exposed_s", "exposed CP traffic", OKABE_ITO["yellow"]),
         ("pp_p2p_s", "pipeline sends", OKABE_ITO["sky"]), ("optimizer_s", "optimizer step", OKABE_ITO["green"]))


def _stack(ax: Any, labels: list[str], rows: list[Any], parts: tuple[tuple[str, str, str], ...]) -> list[Any]:
    left = [0.0] * len(rows)
    handles = []
    for key, label, colour in parts:
        vals = [float(getattr(r, key)) for r in rows]
        if not any(v > 0 for v in vals):
            continue
        handles.append(ax.barh(labels, vals, left=left, color=colour, hatch=PREDICTED_HATCH, edgecolor="white",
                               linewidth=0.3, label=label))
        left = [a + b for a, b in zip(left, vals)]
    ax.invert_yaxis()  # best layout on top
    ax.grid(axis="x", alpha=0.3)
    ax.spines[["top", "right"]].set_visible(False)
    return handles


def _top_aligned(handles: list[Any], rows: int) -> list[Any]:
    """A two-column key's entries filled out with blank ones to `rows` rows, its own entries on top: both keys
    sit at the figure's bottom, and a time key of one line sat level with the memory key's last (4 lines)."""
    from matplotlib.patches import Patch

    blank = Patch(facecolor="none", edgecolor="none", label=" ")  # a legend drops "" labels: " " keeps the row
    left = handles[:-(-len(handles) // 2)]
    right = handles[len(left):]
    # matplotlib fills a key's columns one after the other, the first column the longer
    return left + [blank] * (rows - len(left)) + right + [blank] * (rows - len(right))


def plan_layouts(plan: Any, top: int = 10, title: str | None = None) -> Figure:
    """The first `top` layouts of a `kit.experiments.plan` result (best on top)."""
    from matplotlib.patches import Patch

    layouts = list(plan.layouts[:top]) or ([plan.smallest] if plan.smallest else [])
    if not layouts:
        raise ValueError("this plan has no layout to draw (nothing was possible); see plan.describe()")
    # 9.6 in: a laptop's notebook column shows it at about 90% (11 in: 77%, its text too small); the memory
    # panel, with the layouts' names beside it, gets the wider share
    fig = new_figure(COLUMN_WIDTH_IN, 0.45 * len(layouts) + 3.2, mosaic="MT", gridspec_kw={"width_ratios": [1.7, 1]})
    ax_mem, ax_t = fig.axes
    labels = [f"{i + 1}. {x.name().replace(' recompute=', ' rc=')}" for i, x in enumerate(layouts)]
    mem_handles = _stack(ax_mem, labels, [x.memory for x in layouts], _MEMORY)
    cap = plan.cluster.accelerator.memory_gib
    ax_mem.axvline(cap, color="black", linestyle="--", linewidth=1)
    ax_mem.set_xlabel(f"memory per GPU (GiB, predicted)\ndashed: {cap:.0f} GiB on the GPU")
    ax_mem.tick_params(axis="y", labelsize="small")
    time_handles = _stack(ax_t, labels, [x.time for x in layouts], _TIME)
    ax_t.set_yticks(range(len(layouts)), [f"MFU {x.mfu:.0%}" for x in layouts], fontsize="small")
    ax_t.set_xlabel("step time (s, predicted)")
    ax_mem.set_ylabel("layout (best first)")
    # each panel's key below the figure on its side ("outside": constrained layout makes room), not under its
    # axes, where the keys' widths set the columns' and left the memory bars 2.5 of the 9.6 inches
    keys = [mem_handles + [Patch(facecolor="white", edgecolor="black", hatch=PREDICTED_HATCH,
                                 label="predicted (formula)")], time_handles]
    rows = max(-(-len(k) // 2) for k in keys)
    for handles, loc in zip(keys, ("outside lower left", "outside lower right")):
        fig.legend(handles=_top_aligned(handles, rows), loc=loc, ncols=2, fontsize="small", frameon=False)
    m = plan.model
    none_fit = "" if plan.layouts else "\nnothing fits: the smallest layout shown, over the GPU's memory"
    fig.suptitle(title or f"Plan for {m.name}, seq {plan.seq_len}, {plan.global_batch} sequences per step, on "
                          f"{plan.cluster.world} x {plan.cluster.accelerator.name} (all predicted){none_fit}")
    return fig


def plan_vs_published(rows: Any, band: float = 0.15, title: str | None = None) -> Figure:
    """The planner's throughput over the published one, one bar per run (`compare_published` rows):
    1.0 = predicted as measured; the shaded band is +-`band`. Each run in its source's convention.

    Runs the planner cannot express (`run.comparable` False: Float8 arithmetic) are drawn grey and left out
    of the title's count, as `published_check.summarise` leaves them out (the plan panel prints both: a
    title counting all 48 said 36 where the summary beside it said 34 of 42)."""
    from matplotlib.patches import Patch

    shown = [r for r in rows if r.ratio is not None]
    if not shown:
        raise ValueError("no run with a published throughput to compare; see bench/bench_plan_published.py")
    fig = new_figure(8.0, 0.28 * len(shown) + 2.4)
    ax = fig.axes[0]
    labels = [r.run.id for r in shown]
    ratios = [r.ratio for r in shown]
    ax.axvspan(1 - band, 1 + band, color=OKABE_ITO["grey"], alpha=0.2)
    ax.axvline(1.0, color="black", linewidth=1)
    colours = [OKABE_ITO["grey"] if not r.run.comparable else OKABE_ITO["blue"] if abs(x - 1) <= band
               else OKABE_ITO["vermillion"] for r, x in zip(shown, ratios)]
    ax.barh(labels, [x - 1 for x in ratios], left=1.0, color=colours, hatch=PREDICTED_HATCH, edgecolor="white")
    ax.invert_yaxis()
    ax.tick_params(axis="y", labelsize="small")
    ax.set_ylabel("published run (id)")
    ax.set_xlabel("predicted / published throughput\n(predicted by the planner; published: measured by its source)")
    ax.spines[["top", "right"]].set_visible(False)
    handles = [Patch(color=OKABE_ITO["grey"], alpha=0.2, label=f"within {band:.0%}"),
               Patch(color=OKABE_ITO["blue"], label=f"predicted within {band:.0%}"),
               Patch(color=OKABE_ITO["vermillion"], label=f"predicted outside {band:.0%}")]
    if not all(r.run.comparable for r in shown):  # a key for grey bars only where some are drawn
        handles.append(Patch(color=OKABE_ITO["grey"], label="not comparable (Float8)"))
    from matplotlib.transforms import ScaledTranslation
    under = ax.transAxes + ScaledTranslation(0, -0.75, fig.dpi_scale_trans)  # below the two-line x label
    add_marking_legend(ax, handles, predicted=True, loc="upper center", bbox_to_anchor=(0.5, 0),
                       bbox_transform=under, ncol=2)
    comparable = [x for r, x in zip(shown, ratios) if r.run.comparable]
    within = sum(abs(x - 1) <= band for x in comparable)
    left_out = len(shown) - len(comparable)
    fig.suptitle(title or f"The planner against {len(shown)} published runs: {within} of {len(comparable)} "
                          f"comparable within {band:.0%}" + (f"; {left_out} grey" if left_out else ""))
    return fig
