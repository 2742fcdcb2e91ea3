"""Memory per rank, measured beside the formula's prediction.

Why side by side: the lessons teach "predict, then measure". A hatched predicted bar next to
each measured bar shows at a glance which component the formula gets wrong (usually
activations) and what sharding or checkpointing removed.
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Any, Mapping, Sequence

from kit.plots._keys import run_keys
from kit.plots._style import (
    COLORS, COLUMN_WIDTH_IN, OKABE_ITO, PREDICTED_HATCH, add_marking_legend, new_figure, newest, wrap,
)

if TYPE_CHECKING:
    from matplotlib.figure import Figure

__all__ = ["memory_breakdown", "mib_text", "MEMORY_PARTS"]

MEMORY_PARTS: tuple[tuple[str, str], ...] = (
    ("params_mib", "parameters"),
    ("grads_mib", "gradients"),
    ("optimizer_mib", "optimizer state"),
    ("activations_mib", "activations"),
)
_COLOR_KEYS = ("params", "grads", "optimizer", "activations")


def mib_text(mib: float) -> str:
    """A total in MiB, readable at every size: 12,346, 1,234, 45, 4.5, 0.45, 0.012, "<0.01" (never "0" for a
    0.45 MiB bar, never scientific notation: "1.2e-05" for 12 bytes; thousands separated, as the prediction
    panel's "memory 12,346 MiB per rank" and the memory plot's bar totals both read)."""
    if mib >= 10 or mib == 0:
        return f"{mib:,.0f}"
    if mib < 0.01:
        return "<0.01"
    return f"{mib:.1f}" if mib >= 1 else f"{mib:.2g}"


def memory_breakdown(records: Sequence[Mapping[str, Any]] | Mapping[str, Any],
                     title: str | None = None, max_runs: int | None = None) -> Figure:
    """Stacked MiB per (run, rank): measured (solid) and predicted (hatched, right of it).

    A black diamond marks the measured peak when the record has one (GPU allocator peak or
    process high-water mark), which is usually above the sum of the four parts.
    Accepts one record or a list; `max_runs` draws only the newest that many, and the title
    says so ("last 3 of 7 runs"), so no run disappears without a word.
    """
    recs = [records] if isinstance(records, Mapping) else list(records)
    total_runs = len(recs)
    recs, shown = newest(recs, max_runs)
    shared, labels = run_keys(recs)  # what all runs share, said once in the title; under each run its own part
    rows: list[tuple[str, Mapping[str, Any]]] = []
    groups: list[tuple[str, int, int]] = []  # (run label, first row, rows): one label under each run's ranks
    for label, rec in zip(labels, recs):
        mems = sorted(rec.get("memory") or [], key=lambda m: m.get("rank", 0))
        groups += [(label, len(rows), len(mems))] if mems else []
        rows += [(f"rank {mem.get('rank', 0)}", mem) for mem in mems]
    fig = new_figure(width_in=max(6.0, min(COLUMN_WIDTH_IN, 2.6 + 1.2 * len(rows))))
    ax = fig.axes[0]
    if not rows:
        ax.text(0.5, 0.5, "no memory measurements in these records", ha="center",
                transform=ax.transAxes)
        ax.set_axis_off()
        return fig
    xs = list(range(len(rows)))
    has_pred = any(any((m.get("predicted") or {}).get(k) is not None for k, _ in MEMORY_PARTS)
                   for _, m in rows)
    handles, top = _stacked_bars(ax, rows, has_pred)
    ax.set_ylim(0, top * 1.15)
    ax.set_xticks(xs, [r[0] for r in rows], fontsize="small")
    lines = _group_labels(ax, groups, fig.get_figwidth() * 0.6 / len(rows)) if len(recs) > 1 else 0
    ax.set_xlabel("rank" if len(recs) == 1 else "configuration and rank", labelpad=4 + 11 * lines)
    ax.set_ylabel("memory per rank (MiB)")
    subject = labels[0] if total_runs == 1 else shown + (f"; {shared}" if shared else "")
    # suptitle, the run's label on its own line: centred on the figure, a long label is never cut
    fig.suptitle(title or f"Memory per rank, measured vs formula\n{subject}", fontsize="medium")
    ax.spines[["top", "right"]].set_visible(False)
    add_marking_legend(ax, handles, predicted=has_pred, loc="upper left",
                       bbox_to_anchor=(1.01, 1.0),
                       title="left: measured\nright: predicted\non top: measured MiB" + _unpredicted(rows)
                       if has_pred else "on top: measured MiB",
                       title_fontsize="small")
    return fig


def _stacked_bars(ax: Any, rows: list[tuple[str, Mapping[str, Any]]], has_pred: bool) -> tuple[list[Any], float]:
    """Each row's four parts stacked (measured; predicted hatched to its right), its measured peak and total
    on top: (the legend's handles, the highest point drawn)."""
    xs = list(range(len(rows)))
    width = 0.38
    handles = []
    meas_bottom = [0.0] * len(rows)
    pred_bottom = [0.0] * len(rows)
    for (key, name), ckey in zip(MEMORY_PARTS, _COLOR_KEYS):
        heights = [float(m.get(key) or 0.0) for _, m in rows]
        shift = -width / 2 if has_pred else 0.0
        bars = ax.bar([x + shift for x in xs], heights, width, bottom=meas_bottom,
                      color=COLORS[ckey], label=name, edgecolor="white", linewidth=0.5)
        handles.append(bars)
        meas_bottom = [b + h for b, h in zip(meas_bottom, heights)]
        if has_pred:
            pred = [float((m.get("predicted") or {}).get(key) or 0.0) for _, m in rows]
            ax.bar([x + width / 2 for x in xs], pred, width, bottom=pred_bottom,
                   color=COLORS[ckey], alpha=0.45, hatch=PREDICTED_HATCH, edgecolor="black",
                   linewidth=0.5, label=f"{name} (predicted)")
            pred_bottom = [b + h for b, h in zip(pred_bottom, pred)]
    peaks = [(x - (width / 2 if has_pred else 0.0), m.get("peak_mib"))
             for x, (_, m) in zip(xs, rows) if m.get("peak_mib") is not None]
    if peaks:
        handles.append(ax.scatter([p[0] for p in peaks], [float(p[1]) for p in peaks],
                                  marker="D", color=OKABE_ITO["black"], zorder=3,
                                  label="measured peak"))
    for x, tot in zip(xs, meas_bottom):
        ax.annotate(mib_text(tot), (x - (width / 2 if has_pred else 0.0), tot), ha="center",
                    va="bottom", fontsize="x-small", xytext=(0, 2), textcoords="offset points")
    return handles, max(meas_bottom + pred_bottom + [float(p[1]) for p in peaks] + [1.0])


def _group_labels(ax: Any, groups: list[tuple[str, int, int]], bar_in: float) -> int:
    """Each run's label once, centred under its ranks' bars and wrapped to their width (a label per
    bar, repeated for 4 ranks, ran into its neighbours); returns the most lines a label took."""
    most = 0
    for label, first, n in groups:
        text = wrap(label, max(8, int(n * bar_in / 0.075)))  # ~0.075 in per character at "small"
        most = max(most, text.count("\n") + 1)
        ax.annotate(text, (first + (n - 1) / 2, 0), xycoords=("data", "axes fraction"), xytext=(0, -18),
                    textcoords="offset points", ha="center", va="top", fontsize="small")
    return most



def _unpredicted(rows: list[tuple[str, Mapping[str, Any]]]) -> str:
    """A legend line naming the parts measured where the formula gives nothing (a pipeline's
    activations), so an empty hatched segment is not read as "predicted 0"."""
    missing = {name for key, name in MEMORY_PARTS for _, m in rows
               if m.get("predicted") and m.get(key) and m["predicted"].get(key) is None}
    return "\nno formula for: " + ", ".join(n for _, n in MEMORY_PARTS if n in missing) if missing else ""
