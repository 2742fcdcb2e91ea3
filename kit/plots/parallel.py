"""Bytes per collective of tp, sp, cp, ep and meshes: counted at the calls beside the formula.

One group of bars per "<mesh dimension>/<collective kind>" (tp/all_reduce, dp/all_reduce,
cp/send, ep/all_to_all, ...): the measured payload per step (solid) and the formula's (hatched).
Equal bars are the check that the formula counts every collective the strategy issues.
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Any, Mapping, Sequence

from kit.plots._style import OKABE_ITO, PREDICTED_HATCH, add_marking_legend, new_figure, run_labels

if TYPE_CHECKING:
    from matplotlib.figure import Figure

__all__ = ["bytes_by_collective"]


def _rows(recs: Sequence[Mapping[str, Any]]) -> list[tuple[str, float, float | None]]:
    """(label, measured KiB, predicted KiB or None) per run and collective."""
    rows = []
    labels = run_labels(recs)
    for label, rec in zip(labels, recs):
        rep = (rec.get("comm") or {}).get("report") or {}
        measured, predicted = rep.get("measured_per_step") or {}, rep.get("predicted_per_step") or {}
        for kind, m in measured.items():
            p = predicted.get(kind)
            name = kind if len(recs) == 1 else f"{label}\n{kind}"
            rows.append((name, m["payload_bytes"] / 2**10, p["payload_bytes"] / 2**10 if p else None))
    return rows


def bytes_by_collective(records: Sequence[Mapping[str, Any]] | Mapping[str, Any], title: str | None = None) -> Figure:
    """KiB per step of each collective kind and mesh dimension, measured and predicted."""
    recs = [records] if isinstance(records, Mapping) else list(records)
    rows = _rows(recs)
    fig = new_figure(width_in=max(6.0, min(11.0, 2.0 + 1.1 * len(rows))))
    ax = fig.axes[0]
    if not rows:
        ax.text(0.5, 0.5, "no per-collective counts in these records (strategies tp, sp, cp, ep)",
                ha="center", transform=ax.transAxes)
        ax.set_axis_off()
        return fig
    xs = list(range(len(rows)))
    w = 0.38
    got = ax.bar([x - w / 2 for x in xs], [r[1] for r in rows], w, color=OKABE_ITO["vermillion"],
                 label="measured (counted at the calls)")
    ax.bar([x + w / 2 for x in xs], [r[2] or 0.0 for r in rows], w, color="white", edgecolor=OKABE_ITO["vermillion"],
           hatch=PREDICTED_HATCH)
    ax.set_xticks(xs, [r[0] for r in rows], fontsize=8)
    ax.set_ylabel("KiB per step (payload)")
    ax.set_title(title or "Bytes per collective: measured beside the formula")
    add_marking_legend(ax, [got], predicted=True, fontsize=8)
    return fig
