"""Figures for the lab bench: which plot to draw from the table's runs, as PNG bytes.

Why PNG bytes into an `ipywidgets.Image`: it updates from the bench's worker thread in
every frontend (Lab, Notebook 7, VS Code, Colab) without ipympl.
"""
from __future__ import annotations

import io
from typing import Any, Mapping, Sequence

__all__ = ["draw_plot", "render_png"]

_RECENT = 10  # bars per bar chart before it gets too crowded to read


def render_png(fig: Any) -> bytes:
    """PNG bytes of a Figure (safe from a thread: no pyplot, no GUI backend)."""
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=100)
    return buf.getvalue()


def draw_plot(name: str, records: Sequence[Mapping[str, Any]], knob: str | None = None) -> Any:
    """The figure the bench shows for menu entry `name` (a `kit.plots.PLOTS` value)."""
    from kit import plots

    fn = getattr(plots, name)
    if name == "step_timeline":
        return fn(records[-1])
    if name == "memory_breakdown":
        return fn(list(records[-3:]))
    strategies = {(r.get("config") or {}).get("strategy") for r in records}
    series = "strategy" if len(strategies) > 1 else None
    if name == "comm_vs_knob":
        return fn(list(records), knob=knob, series=series)
    if name == "scaling":
        return fn(list(records), series=series)
    return fn(list(records[-_RECENT:]))
