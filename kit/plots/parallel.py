"""Bytes per collective of tp, sp, cp, ep and meshes: counted at the calls beside the formula.

One group of bars per "<mesh dimension>/<collective kind>" (tp/all_reduce, dp/all_reduce,
cp/send, ep/all_to_all, ...): the measured payload per step (solid) and the formula's (hatched).
Equal bars are the check that the formula counts every collective the strategy issues.
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Any, Mapping, Sequence

from kit.plots._style import (
    OKABE_ITO, PREDICTED_HATCH, add_marking_legend, comm_report, new_figure, run_labels, wrap,
)

if TYPE_CHECKING:
    from matplotlib.figure import Figure

__all__ = ["bytes_by_collective", "per_collective"]


def per_collective(rec: Mapping[str, Any]) -> dict[str, Any] | None:
    """{"<dimension>/<kind>": {payload_bytes, ...}} measured in one step, or None without the data."""
    return comm_report(rec).get("measured_per_step")


def _rows(recs: Sequence[Mapping[str, Any]]) -> list[tuple[str, float, float | None]]:
    """(label, measured KiB, predicted KiB or None) per run and collective."""
    rows = []
    labels = run_labels(recs)
    for label, rec in zip(labels, recs):
        measured, predicted = per_collective(rec) or {}, comm_report(rec).get("predicted_per_step") or {}
        for kind, m in measured.items():
            p = predicted.get(kind)
            name = kind if len(recs) == 1 else f"{label}\n{kind}"
            rows.append((name, m["payload_bytes"] / 2**10, p["payload_bytes"] / 2**10 if p else None))
    return rows


def _wrapped(name: str, chars: int) -> str:
    """The run's label wrapped to its bar's width (4 runs' labels ran into each other), the collective below."""
    run, _, kind = name.rpartition("\n")
    return f"{wrap(run, chars)}\n{kind}" if run else kind


def _dimension(name: str) -> str:
    return name.rsplit("\n", 1)[-1].split("/", 1)[0]


def bytes_by_collective(records: Sequence[Mapping[str, Any]] | Mapping[str, Any], title: str | None = None) -> Figure:
    """KiB per step of each collective kind, measured and predicted: one row of bars per mesh
    dimension (tp, dp, fsdp, pp, ...), so a 2-D mesh shows each dimension's traffic on its own scale."""
    recs = [records] if isinstance(records, Mapping) else list(records)
    rows = _rows(recs)
    dims = list(dict.fromkeys(_dimension(r[0]) for r in rows))
    most = max([sum(_dimension(r[0]) == d for r in rows) for d in dims] or [1])  # bars in the fullest row
    width_in = max(6.0, min(9.6, 2.0 + 1.8 * most))  # 9.6 in: about 90% in a laptop's notebook column (11: 77%)
    chars = max(10, int((width_in - 1.5) / most / 0.065))  # ~0.065 in per character at 8 pt
    rows = [(_wrapped(r[0], chars), r[1], r[2]) for r in rows]
    fig = new_figure(width_in=width_in, height_in=4.2 if len(dims) < 2 else 1.2 + 2.4 * len(dims))
    if len(dims) > 1:
        fig.clear()
        fig.subplots(len(dims), 1, squeeze=False)
    if not rows:
        ax = fig.axes[0]
        ax.text(0.5, 0.5, "no per-collective counts in these records (strategies tp, sp, cp, ep and meshes)",
                ha="center", transform=ax.transAxes)
        ax.set_axis_off()
        return fig
    for ax, dim in zip(fig.axes, dims):
        mine = [r for r in rows if _dimension(r[0]) == dim]
        xs = list(range(len(mine)))
        w = 0.38
        got = ax.bar([x - w / 2 for x in xs], [r[1] for r in mine], w, color=OKABE_ITO["vermillion"],
                     label="measured (counted at the calls)")
        ax.bar([x + w / 2 for x in xs], [r[2] or 0.0 for r in mine], w, color="white",
               edgecolor=OKABE_ITO["vermillion"], hatch=PREDICTED_HATCH)
        ax.set_xticks(xs, [r[0] for r in mine], fontsize=8)
        ax.set_ylabel(f"{dim} (KiB per step)" if len(dims) > 1 else "payload (KiB per step)")
        if ax is fig.axes[0]:
            # headroom above the tallest bar for the legend's two lines: at "best" it sat on HSDP's one dp bar
            top = max([r[1] for r in mine] + [r[2] or 0.0 for r in mine] + [1e-9])
            ax.set_ylim(0, 1.45 * top)
            add_marking_legend(ax, [got], predicted=True, fontsize=8, loc="upper right")
    fig.axes[len(dims) - 1].set_xlabel("collective (mesh dimension/kind)" if len(recs) == 1
                                       else "run and collective (mesh dimension/kind)")
    one = f"\n{run_labels(recs)[0]}" if len(recs) == 1 else ""  # one run: its ticks name only the collective
    fig.axes[0].set_title(title or ("Bytes per collective: measured beside the formula" if len(dims) < 2
                                    else "Bytes per mesh dimension and collective") + one)
    return fig
