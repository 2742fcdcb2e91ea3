"""Figures for the lab bench: which plot to draw from the table's runs, as PNG bytes.

Why PNG bytes into an `ipywidgets.Image`: it updates from the bench's worker thread in
every frontend (Lab, Notebook 7, VS Code, Colab) without ipympl.
"""
from __future__ import annotations

import io
from typing import Any, Mapping, Sequence

__all__ = ["draw_plot", "render_png", "plottable", "plot_choices"]

_RECENT = 10  # bars per bar chart before it gets too crowded to read
_RECENT_LOAD = 4  # expert load and ring balance: a bar per run per expert or rank
_RECENT_MEMORY = 4  # memory draws a bar pair per rank: 4 runs x 2 ranks fill the notebook's width


def render_png(fig: Any) -> bytes:
    """PNG bytes of a Figure (safe from a thread: no pyplot, no GUI backend)."""
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=100)
    return buf.getvalue()


def plottable(records: Sequence[Mapping[str, Any]]) -> list[Mapping[str, Any]]:
    """The runs a plot may draw: not those stopped mid-way (a short run's loss and step time
    are not comparable with full ones: a stopped run once drew a false dip in throughput)."""
    return [r for r in records if r.get("complete", True) is not False]


def plot_choices(records: Sequence[Mapping[str, Any]]) -> list[tuple[str, str]]:
    """The plot menu's (label, function) entries for these runs: the ep and cp load plots and the
    bytes per collective only when some run carries their data (an ep run's expert load, a cp run's
    work per rank, a tp/sp/cp/ep or mesh run's per-collective counts)."""
    from kit.plots import PLOTS
    from kit.plots.parallel import per_collective
    from kit.plots.parallel_load import attention_work, expert_layers

    needs = {"expert_load": expert_layers, "ring_balance": attention_work, "bytes_by_collective": per_collective}
    return [(label, fn) for label, fn in PLOTS.items()
            if fn not in needs or any(needs[fn](r) for r in records)]


def draw_plot(name: str, records: Sequence[Mapping[str, Any]], knob: str | None = None,
              labels: Mapping[str, str] | None = None) -> Any:
    """The figure the bench shows for menu entry `name` (a `kit.plots.PLOTS` value).

    `labels`: knob name -> the panel's label for it (default: the knob table's), so axes
    read "bucket size (MiB)", as the control does, not "bucket_cap_mb".
    """
    from kit import plots
    from kit.widgets.knobs import KNOBS

    labels = labels if labels is not None else {k.name: k.label for k in KNOBS}

    fn = getattr(plots, name)
    if name == "step_timeline":
        return fn(records[-1])
    if name == "scaling_prediction":  # predicted from the last run on its own link (infiniband on loopback)
        from kit.plots.predicted import last_run_prediction
        return last_run_prediction(records)
    if name == "memory_breakdown":
        return fn(list(records), max_runs=_RECENT_MEMORY)  # its title says "last 3 of 7 runs"
    strategies = {(r.get("config") or {}).get("strategy") for r in records}
    series = "strategy" if len(strategies) > 1 else None
    if name == "comm_vs_knob":
        knob = knob or plots.infer_knob(records)
        return fn(list(records), knob=knob, series=series, knob_label=labels.get(knob or ""))
    if name == "scaling":
        return fn(list(records), series=series)
    if name in ("expert_load", "ring_balance"):  # runs without the data are left out
        return fn(list(records), max_runs=_RECENT_LOAD)
    if name == "bytes_by_collective":  # takes no max_runs: it draws the newest 8 runs with counts, its title says so
        return fn(list(records))
    return fn(list(records), max_runs=_RECENT)  # step breakdown: its title says which runs it shows
