"""Where a training step's time goes: stacked phases per run (the per-rank timeline is timeline.py).

Why stacked bars: the question a learner asks is "what did this knob change?", and a stack
answers it per phase. Overlapped communication is drawn *inside* the backward segment
(it costs no wall time when it hides well); exposed communication is its own segment because
it is the part that lengthens the step.
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Any, Mapping, Sequence

from kit.experiments.choices import STAGED
from kit.experiments.record_readers import phases_timed, run_center, run_spread
from kit.plots._keys import run_keys
from kit.plots._style import (
    COLORS, COLUMN_WIDTH_IN, EMULATED_HATCH, OKABE_ITO, add_marking_legend, is_emulated, new_figure, newest,
    whisker_note, wrap,
)
from kit.plots.timeline import step_timeline  # noqa: F401  (kept importable from here)

if TYPE_CHECKING:
    from matplotlib.figure import Figure

__all__ = ["step_breakdown", "step_segments", "step_timeline"]

# (key, legend label) in stacking order, bottom to top.
SEGMENTS: tuple[tuple[str, str], ...] = (
    ("fwd", "forward"),
    ("bwd", "backward"),
    ("comm_exposed", "comm exposed (lengthens step)"),
    ("opt", "optimizer"),
    ("other", "other (data, sync, Python)"),
)


# A run made with instrument=False timed whole steps only: one undivided bar, never "other" (its
# zeros for the phases are not measurements, so the stack would say the whole step was data and Python).
UNTIMED_LABEL = "whole step: phases not timed (instrument=False)"
OPT_CPU_LABEL = "optimizer CPU time (not stacked)"

_NAMED_BARS = 4  # bars whose configuration labels fit under them at the notebook's width


def run_key(labels: Sequence[str], first: int = 1) -> list[Any]:
    """Legend entries "5: ddp mlp bs32 ..." for plots that number their runs instead of naming them."""
    from matplotlib.lines import Line2D

    return [Line2D([], [], linestyle="none", label=f"{first + i}: {lb}") for i, lb in enumerate(labels)]


def step_segments(summary: Mapping[str, float]) -> dict[str, float]:
    """Split a run's mean step (ms) into non-overlapping stacked segments.

    If forward + backward + optimizer + exposed comm exceeds the measured step by more than 5%,
    the backward timer already contains the exposed wait (DDP's backward returns only after the
    last bucket is reduced), so exposed comm is taken out of backward instead of counted twice.
    `other` is whatever the phase timers did not see; the stack always sums to `step_ms`
    (or to the phases, when they add up to more than the step).
    """
    step = float(summary.get("step_ms") or 0.0)
    fwd = float(summary.get("fwd_ms") or 0.0)
    bwd = float(summary.get("bwd_ms") or 0.0)
    opt = float(summary.get("opt_ms") or 0.0)
    exposed = float(summary.get("comm_exposed_ms") or 0.0)
    if step and fwd + bwd + opt + exposed > 1.05 * step:
        bwd = max(0.0, bwd - exposed)
    other = max(0.0, step - (fwd + bwd + opt + exposed))
    overlap = min(float(summary.get("comm_overlap_ms") or 0.0), bwd)
    return {"fwd": fwd, "bwd": bwd, "comm_exposed": exposed, "opt": opt, "other": other,
            "comm_overlap": overlap}


def step_breakdown(records: Sequence[Mapping[str, Any]], title: str | None = None,
                   max_runs: int | None = None) -> Figure:
    """Stacked bars of step time (ms) per run: forward, backward, exposed comm, optimizer.

    Each segment is the phase's median (kit.run/2; the mean for older records), and a black
    whisker on the step shows its spread: IQR of the measured steps, or min-max of the repeats'
    medians for a repeated record (the legend says which). Overlapped comm is an inner orange
    bar over the top of backward. Comm of emulated runs is hatched. One bar per record, in the
    order given, labelled with the record's label (what all the runs' labels share said once, in the key's
    heading or the title, each bar named by the rest: "bucket25MiB"). `max_runs`: only the newest that many, and the
    title says "last 10 of 14 runs". Where a record has the optimizer phase's CPU time (`opt_cpu_ms`),
    a green bracket beside the bar spans it from the optimizer segment's bottom: compare its length
    with the segment's. It is not stacked (the CPU time lies within the optimizer's wall time).
    """
    total = len(records)
    records, shown = newest(records, max_runs)
    shown_of, first = ("" if len(records) == total else f" ({shown})"), total - len(records) + 1
    # Up to 4 runs their labels fit under the bars; more would collide, so the bars are numbered
    # as in the bench's table and a key below the axes names each number's configuration.
    numbered = len(records) > _NAMED_BARS
    # at most 9.6 in: a laptop's notebook column shows it at about 90% (11 in: 77%, its text too small); the
    # key of numbered runs, two to a line below the axes, makes the figure taller instead
    width_in = max(7.5, min(COLUMN_WIDTH_IN, 3.5 + 1.1 * len(records)))
    # what all runs share is said once (the key's heading, or the title's second line), each bar its own part
    shared, labels = run_keys(records)
    key_lines = -(-len(records) // 2) + (1 if shared else 0)
    fig = new_figure(width_in=width_in, height_in=4.2 + (0.2 * key_lines if numbered else 0.2 if shared else 0.0))
    ax = fig.axes[0]
    xs = list(range(len(records)))
    handles, bottoms = _stack(ax, records, xs)
    tops = _whiskers(ax, records, xs, list(bottoms), handles)
    tops = _opt_cpu(ax, records, xs, tops, handles)
    for x, total, top in zip(xs, bottoms, tops):
        ax.annotate(f"{total:.1f} ms", (x, top), ha="center", va="bottom", fontsize="small",
                    xytext=(0, 2), textcoords="offset points")
    # A label may be as wide as its bar's slot: the axes gets what the legend (outside, right) and the
    # y label leave, about 3.3 in, shared by at least 3 slots (xlim pads fewer bars); ~0.075 in per character.
    chars = max(10, min(18, int((width_in - 3.3) / max(3, len(records)) / 0.075)))
    ax.set_xticks(xs, [str(first + x) for x in xs] if numbered else [wrap(lb, chars) for lb in labels],
                  fontsize="small")
    # the bench's table numbers its runs alike, but a notebook that calls this has no table: say only the key
    ax.set_xlabel("run (# as in the key below)" if numbered else "configuration")
    if numbered:  # beside the phases' key it took 3.5 of the 9.6 in, and 10 bars' totals ran together
        fig.legend(handles=run_key(labels, first), loc="outside lower center", ncols=2, fontsize="small",
                   frameon=False, handlelength=0, handletextpad=0, columnspacing=2.0, title=shared or None,
                   title_fontsize="small")
    ax.set_ylabel("time per step (ms)")
    ax.set_ylim(0, max(tops + [1.0]) * 1.15)
    pad = max(0.0, (3 - len(records)) / 2)  # one or two bars stay bar-shaped, not slabs
    ax.set_xlim(-0.5 - pad, len(records) - 0.5 + pad)
    # suptitle: centred on the figure, so a long title is not clipped by a narrow axes.
    heading = title or f"Where each step's time goes, per configuration{shown_of}"
    fig.suptitle(heading + (f"\n{shared}" if shared and not numbered else ""))
    ax.spines[["top", "right"]].set_visible(False)
    add_marking_legend(ax, handles, emulated=any(is_emulated(r) for r in records),
                       loc="upper left", bbox_to_anchor=(1.01, 1.0))
    return fig


def _stack(ax: Any, records: Sequence[Mapping[str, Any]], xs: list[int]) -> tuple[list[Any], list[float]]:
    """The stacked phase segments and the inner overlapped-comm bar; (legend handles, bar tops)."""
    segs = [step_segments(run_center(r) if phases_timed(r) else {}) for r in records]  # untimed: all 0.0
    bottoms = [0.0] * len(records)
    handles = []
    staged = any((r.get("config") or {}).get("strategy") in STAGED for r in records)
    for key, name in SEGMENTS:
        if key == "other" and staged:  # a stage waiting in recv for its neighbour is idle: the bubble
            # on three lines: on one it was the key's widest entry by 2 in, and the narrower axes made the
            # wrapped run labels under 2-4 bars run into each other
            name = "other (data, Python;\npipelines: waiting for\na stage, the bubble)"
        heights = [s[key] for s in segs]
        hatches = [EMULATED_HATCH if key == "comm_exposed" and is_emulated(r) else None
                   for r in records]
        bars = ax.bar(xs, heights, 0.6, bottom=bottoms, color=COLORS[key], label=name,
                      edgecolor="white", linewidth=0.5)
        for bar, hatch in zip(bars, hatches):
            bar.set_hatch(hatch)
        if key == "bwd":
            bwd_bottoms, bwd_heights = list(bottoms), heights
        handles.append(bars)
        bottoms = [b + h for b, h in zip(bottoms, heights)]
    # Overlapped comm: drawn inside the top of backward, narrower, so it reads as "hidden".
    overlap = [s["comm_overlap"] for s in segs]
    inner_bottoms = [b + h - o for b, h, o in zip(bwd_bottoms, bwd_heights, overlap)]
    inner = ax.bar(xs, overlap, 0.3, bottom=inner_bottoms, color=COLORS["comm_overlap"],
                   label="comm overlapped with backward", edgecolor="black", linewidth=0.5)
    for bar, rec in zip(inner, records):
        bar.set_hatch(EMULATED_HATCH if is_emulated(rec) else None)
    handles.insert(2, inner)
    if not any(phases_timed(r) for r in records):
        handles = []  # no phase was timed: a legend of phases would name bars of height 0
    untimed = [float(run_center(r).get("step_ms") or 0.0) if not phases_timed(r) else 0.0 for r in records]
    if any(untimed):
        handles.append(ax.bar(xs, untimed, 0.6, color="white", edgecolor=OKABE_ITO["black"], linestyle="--",
                              linewidth=1.0, label=UNTIMED_LABEL))
        bottoms = [b + u for b, u in zip(bottoms, untimed)]
    return handles, bottoms


def _whiskers(ax: Any, records: Sequence[Mapping[str, Any]], xs: list[int], tops: list[float],
              handles: list[Any]) -> list[float]:
    """Each step's spread as a black whisker (its legend entry added); the new tops of the bars."""
    note = whisker_note(records)
    for x, rec in zip(xs, records):
        sp = run_spread(rec, "step_ms")
        if sp is None:
            continue
        med, lo, hi, _ = sp
        ax.errorbar([x], [med], yerr=[[max(0.0, med - lo)], [max(0.0, hi - med)]], fmt="none",
                    ecolor=OKABE_ITO["black"], elinewidth=1.2, capsize=5, zorder=4)
        tops[x] = max(tops[x], hi)
    if note:
        from matplotlib.lines import Line2D
        handles.append(Line2D([], [], color=OKABE_ITO["black"], marker="_", markersize=10,
                              label=note))
    return tops


def _opt_cpu(ax: Any, records: Sequence[Mapping[str, Any]], xs: list[int], tops: list[float],
             handles: list[Any]) -> list[float]:
    """The optimizer phase's CPU time (its median, like the segments) as a bracket beside each bar that
    has one, from the optimizer segment's bottom: it overlaps that wall-clock segment, so it is drawn
    beside the stack, never in it. Records saved before it was timed have none and get none."""
    line = None
    for x, rec in zip(xs, records):
        sp = run_spread(rec, "opt_cpu_ms")
        if sp is None or not phases_timed(rec):
            continue
        seg = step_segments(run_center(rec))
        lo = seg["fwd"] + seg["bwd"] + seg["comm_exposed"]  # where the optimizer segment starts
        hi = lo + sp[0]
        (line,) = ax.plot([x + 0.31, x + 0.37, x + 0.37, x + 0.31], [lo, lo, hi, hi], color=COLORS["opt"],
                          linewidth=2, solid_joinstyle="miter", zorder=4, label=OPT_CPU_LABEL)
        tops[x] = max(tops[x], hi)
    if line is not None:
        handles.insert(handles.index(next(h for h in handles if h.get_label() == "optimizer")) + 1, line)
    return tops
