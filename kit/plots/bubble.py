"""The pipeline bubble: the formula's ideal, the time model with each message's measured cost, and the
measurement, on one axis (bench/bench_predict_local.py's rows; lesson 05's sweep).

Why three curves: the formula (p-1)/(m+p-1) falls towards 0 as m grows because it assumes free messages
and micro-batches whose time shrinks as 1/m. On 2 CPU ranks the measured bubble stays high; the model
(theory/local_time.modelled_bubble) with each hand-off's measured cost shows which of the two assumptions
fails. Lines predicted, markers measured.
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Any, Mapping, Sequence

from kit.plots._style import OKABE_ITO, new_figure

if TYPE_CHECKING:
    from matplotlib.figure import Figure

__all__ = ["bubble_model"]


def bubble_model(rows: Sequence[Mapping[str, Any]], title: str = "Pipeline bubble, p = 2", ax: Any = None,
                 measured_label: str = "measured (median, min-max of repeats)",
                 predicted_label: str = "time model, measured hand-off per message (predicted)") -> Figure:
    """rows: {"micro_batches", "formula", "predicted", "measured", optional "measured_spread" (lo, hi),
    optional "predicted_fitted_messages" and "predicted_schedule_messages"}, fractions 0..1. `ax`: draw into
    this axis (a panel of the caller's figure) instead of a new figure."""
    if ax is None:
        ax = new_figure(6.4, 3.8).axes[0]
    fig = ax.figure
    ms = [r["micro_batches"] for r in rows]
    ax.plot(ms, [r["formula"] for r in rows], "--", color="black", label="formula (p-1)/(m+p-1) (predicted: free messages)")
    ax.plot(ms, [r["predicted"] for r in rows], "-", color=OKABE_ITO["vermillion"], label=predicted_label)
    if all("predicted_fitted_messages" in r for r in rows):
        ax.plot(ms, [r["predicted_fitted_messages"] for r in rows], ":", color=OKABE_ITO["green"],
                label="time model, gloo benchmark fit per message (predicted)")
    if all("predicted_schedule_messages" in r for r in rows):
        ax.plot(ms, [r["predicted_schedule_messages"] for r in rows], "-.", color=OKABE_ITO["purple"],
                label="time model, the schedule's hand-off without compute (predicted; probe emulated)")
    err = None
    if all("measured_spread" in r for r in rows):
        err = [[r["measured"] - r["measured_spread"][0] for r in rows], [r["measured_spread"][1] - r["measured"] for r in rows]]
    ax.errorbar(ms, [r["measured"] for r in rows], yerr=err, fmt="o", color=OKABE_ITO["blue"], capsize=3,
                label=measured_label)
    ax.set(xscale="log", xlabel="micro-batches m", ylabel="bubble (share of the step idle)", ylim=(0, 1))
    ax.set_title(title, fontsize="medium")
    ax.set_xticks(ms, [str(m) for m in ms])
    ax.minorticks_off()
    ax.grid(alpha=0.3)
    ax.legend(fontsize="x-small")
    return fig
