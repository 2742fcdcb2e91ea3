"""Bytes per collective of tp, sp, cp, ep and meshes: counted at the calls beside the formula.

One group of bars per "<mesh dimension>/<collective kind>" (tp/all_reduce, dp/all_reduce,
cp/send, ep/all_to_all, ...): the measured payload per step (solid) and the formula's (hatched).
Equal bars are the check that the formula counts every collective the strategy issues.
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Any, Mapping, Sequence

from kit.plots._keys import run_keys
from kit.plots._style import (
    COLUMN_WIDTH_IN, OKABE_ITO, PREDICTED_HATCH, SERIES, add_marking_legend, comm_report, new_figure, newest,
    wrap,
)

if TYPE_CHECKING:
    from matplotlib.figure import Figure

__all__ = ["bytes_by_collective", "per_collective"]


def per_collective(rec: Mapping[str, Any]) -> dict[str, Any] | None:
    """{"<dimension>/<kind>": {payload_bytes, ...}} measured in one step, or None without the data."""
    return comm_report(rec).get("measured_per_step")


Row = tuple[int, str, float, "float | None"]  # run index, "<dimension>/<kind>", measured KiB, predicted KiB


def _rows(recs: Sequence[Mapping[str, Any]]) -> list[Row]:
    """(run index, "<dimension>/<kind>", measured KiB, predicted KiB or None) per run and collective."""
    rows = []
    for i, rec in enumerate(recs):
        measured, predicted = per_collective(rec) or {}, comm_report(rec).get("predicted_per_step") or {}
        for kind, m in measured.items():
            p = predicted.get(kind)
            rows.append((i, kind, m["payload_bytes"] / 2**10, p["payload_bytes"] / 2**10 if p else None))
    return rows


def _dimension(kind: str) -> str:
    return kind.split("/", 1)[0]


_GAP = 0.6  # between two collectives' groups, in bar pairs
_CHAR_IN = 0.065  # inches per character at 8 pt


def _named_bars(rows: list[Row], labels: list[str], chars: int) -> tuple[list[float], list[float], list[str]] | None:
    """Bar positions, tick positions and names of a row where each bar pair is named "<run>\\n<collective>"
    under it, or None where a name is wider than its bar pair (4 runs of 4 collectives: 16 names ran into
    each other)."""
    if any(len(r[1]) > chars or max(map(len, labels[r[0]].split())) > chars for r in rows):
        return None
    xs = [float(x) for x in range(len(rows))]
    return xs, xs, [f"{wrap(labels[r[0]], chars)}\n{r[1]}" for r in rows]


def _grouped_bars(rows: list[Row], inches_per_pair: float) -> tuple[list[float], list[float], list[str]]:
    """Bar positions, tick positions and names of a row grouped by collective, the runs side by side in each
    group (their colours named in the key): one name per collective, on two lines ("tp/" above
    "reduce_scatter") where its group is narrower."""
    xs, ticks, names, x = [], [], [], 0.0
    for kind in dict.fromkeys(r[1] for r in rows):
        n = sum(r[1] == kind for r in rows)
        xs += [x + j for j in range(n)]
        ticks.append(x + (n - 1) / 2)
        fits = len(kind) * _CHAR_IN + 0.15 <= inches_per_pair * (n + _GAP)
        names.append(kind if fits else kind.replace("/", "/\n", 1))
        x += n + _GAP
    return xs, ticks, names


def _grid(dims: int, most: int) -> tuple[int, int, float]:
    """(rows, columns, width in inches) of the panels, one per mesh dimension: side by side, up to 3 to a row,
    while a panel still has about 0.55 in per bar pair (wider before taller: 5 dimensions of one bar pair each
    were 5 panels stacked into a 6 x 13 in figure, twice as tall as a notebook shows at once)."""
    panel_in = 1.2 + 0.55 * most
    cols = 1 if dims <= 2 else max(1, min(3, dims, int(COLUMN_WIDTH_IN // panel_in)))
    rows = max(1, -(-dims // cols))  # no dimension (no run with counts): one panel that says so
    cols = max(1, -(-dims // rows))  # balanced: 4 panels 2 x 2, not 3 + 1
    width_in = max(6.0, min(COLUMN_WIDTH_IN, 2.0 + 1.8 * most)) if cols == 1 else \
        min(COLUMN_WIDTH_IN, cols * max(2.9, panel_in))
    return rows, cols, width_in


def bytes_by_collective(records: Sequence[Mapping[str, Any]] | Mapping[str, Any], title: str | None = None) -> Figure:
    """KiB per step of each collective kind, measured and predicted: one panel of bars per mesh
    dimension (tp, dp, fsdp, pp, ...), so a 2-D mesh shows each dimension's traffic on its own scale; up to
    two panels one above the other, more side by side (up to 3 to a row), the figure never much taller than
    wide.

    Several runs: each bar pair named "<run>\\n<collective>" under it where the names fit, else the bars
    grouped by collective, one colour per run, the runs named in a key below. What all the runs' labels
    share is said once (the key's heading or the title: "all runs: tp gpt bs32 fp32"), each run by the rest.
    Only runs with per-collective counts are drawn (a ddp run has none: it sat in the key with a colour and
    no bars), the newest 8 of them (one colour each: beyond 8 the colours repeated), and the title says
    which: "last 8 of 10 runs"."""
    from matplotlib.patches import Patch

    given = [records] if isinstance(records, Mapping) else list(records)
    drawn = [r for r in given if per_collective(r)]
    counted = len(drawn)
    recs, shown = newest(drawn, len(SERIES))
    shared, labels = run_keys(recs)  # one run: its whole label
    rows = _rows(recs)
    dims = list(dict.fromkeys(_dimension(r[1]) for r in rows))
    # each row's bars, in the order of the runs, then of the collectives (sorted by collective when grouped)
    per_dim = {d: [r for r in rows if _dimension(r[1]) == d] for d in dims}
    most = max([len(rs) for rs in per_dim.values()] or [1])  # bar pairs in the fullest panel
    n_rows, n_cols, width_in = _grid(len(dims), most)
    panel_in = width_in / n_cols - 1.5 / n_cols ** 0.5  # the bars' width in a panel, less its y axis's labels
    chars = max(10, int(panel_in / most / _CHAR_IN))
    # one run: each bar pair named by its collective alone (the run's label is in the title)
    named = {d: _named_bars(rs, labels, chars) if len(recs) > 1
             else ([float(x) for x in range(len(rs))],) * 2 + ([r[1] for r in rs],) for d, rs in per_dim.items()}
    grouped = len(recs) > 1 and any(v is None for v in named.values())
    if grouped:
        for d, rs in per_dim.items():
            kinds = list(dict.fromkeys(r[1] for r in rs))
            rs.sort(key=lambda r: kinds.index(r[1]))  # stable: the runs in their order in each group
            units = len(rs) + _GAP * (len(kinds) - 1)
            named[d] = _grouped_bars(rs, panel_in / max(units, 1))
    below = grouped or n_cols > 1  # the key below the panels: the runs' colours, or beside panels too narrow for it
    key_rows = (-(-len(recs) // 2) + (1 if shared else 0) if grouped else 0) + (1 if below else 0)
    # panels 2.4 in tall, less where more would make the figure taller than wide (5 rows of many bars)
    panel_h = 2.4 if n_rows < 2 else max(1.6, min(2.4, (width_in - 1.2 - 0.22 * key_rows) / n_rows))
    fig = new_figure(width_in=width_in, height_in=(4.2 if len(dims) < 2 else 1.2 + panel_h * n_rows)
                     + 0.22 * key_rows)
    if len(dims) > 1:
        fig.clear()
        for extra in fig.subplots(n_rows, n_cols, squeeze=False).flat[len(dims):]:
            extra.remove()  # 5 panels in 2 rows of 3: the sixth place stays empty
    if not dims:
        ax = fig.axes[0]
        ax.text(0.5, 0.5, "no per-collective counts in these records (strategies tp, sp, cp, ep and meshes)",
                ha="center", transform=ax.transAxes)
        ax.set_axis_off()
        return fig
    colours = [SERIES[i] if grouped else OKABE_ITO["vermillion"] for i in range(len(recs))]  # <= 8 runs
    w = 0.38
    for ax, dim in zip(fig.axes, dims):
        mine, (xs, ticks, names) = per_dim[dim], named[dim]
        # every measured bar, then every predicted one (a row's patches: its measured half, then the formula's)
        got = ax.bar([x - w / 2 for x in xs], [r[2] for r in mine], w, color=[colours[r[0]] for r in mine],
                     label="measured (counted at the calls)")
        ax.bar([x + w / 2 for x in xs], [r[3] or 0.0 for r in mine], w, color="white",
               edgecolor=[colours[r[0]] for r in mine], hatch=PREDICTED_HATCH)
        ax.set_xticks(ticks, names, fontsize=8)
        if not grouped:  # one or two bar pairs stay bars: a tp run's one all_reduce was two slabs across the axes
            lo, hi = min(xs) - 0.5, max(xs) + 0.5
            pad = max(0.0, (3.0 - (hi - lo)) / 2)
            ax.set_xlim(lo - pad, hi + pad)
        ax.set_ylabel(f"{dim} (KiB per step)" if len(dims) > 1 else "payload (KiB per step)")
        if ax is fig.axes[0] and not below:
            # headroom above the tallest bar for the legend's two lines: at "best" it sat on HSDP's one dp bar
            top = max([r[2] for r in mine] + [r[3] or 0.0 for r in mine] + [1e-9])
            ax.set_ylim(0, 1.45 * top)
            add_marking_legend(ax, [got], predicted=True, fontsize=8, loc="upper right")
    if below:  # the runs' names in a key below the axes, not under each bar; the marking too beside narrow panels
        handles = [Patch(color=c, label=lb) for c, lb in zip(colours, labels)] if grouped else []
        handles += [Patch(facecolor="grey" if grouped else colours[0],
                          label=("solid: " if grouped else "") + "measured (counted at the calls)"),
                    Patch(facecolor="white", edgecolor="black", hatch=PREDICTED_HATCH, label="predicted (formula)")]
        fig.legend(handles=handles, loc="outside lower center", ncols=2, fontsize="small", frameon=False,
                   title=shared if grouped and shared else None, title_fontsize="small")
    what = "collective; colour: run" if grouped else "collective" if len(recs) == 1 else "run and collective"
    if n_cols > 1:  # under each column's lowest panel, short (a label for the whole figure sat on the key below)
        for ax in fig.axes[-n_cols:]:
            ax.set_xlabel(what)
    else:
        fig.axes[len(dims) - 1].set_xlabel(what.replace("collective", "collective (mesh dimension/kind)"))
    one = f"\n{labels[0]}" if len(recs) == 1 else ""  # one run: its ticks name only the collective
    which = f" ({shown})" if len(recs) < counted else ""  # "last 8 of 10 runs", as step_breakdown says it
    left = len(given) - counted  # a ddp or pipeline run counts no collective by kind
    # one short line: a 6 in figure cut off "... (tp, sp, cp, ep and meshes count them)"
    without = f"\n{left} run{'s' * (left > 1)} without per-collective counts not drawn" if left else ""
    common = f"\n{shared}" if shared and not grouped else ""  # named bars: what they share, once
    text = title or ("Bytes per collective: measured beside the formula" if len(dims) < 2
                     else "Bytes per mesh dimension and collective") + which + one + common + without
    if n_cols > 1:  # over the panels side by side, not over the first
        fig.suptitle(text)
    else:
        fig.axes[0].set_title(text)
    return fig
