"""Sweeps and scaling: how a number moves when one knob moves.

Why the knob's own values on x (not run order): a learner reads "bucket 25 MiB -> 8% comm
overhead" straight off the axis, and uneven sweeps (1, 2, 4, 25, 100) keep their spacing.
"""
from __future__ import annotations

from collections import defaultdict
from typing import TYPE_CHECKING, Any, Callable, Iterable, Mapping, Sequence

from kit.experiments.record_readers import phases_timed, run_center, run_spread
from kit.plots._keys import run_keys
from kit.plots._style import (
    COLUMN_WIDTH_IN, OKABE_ITO, SERIES, is_emulated, knob_value, new_figure, numeric, whisker_note, wrap,
)

if TYPE_CHECKING:
    from matplotlib.axes import Axes
    from matplotlib.figure import Figure

__all__ = ["comm_vs_knob", "scaling", "infer_knob", "axis_label"]

_NOT_KNOBS = {"seed", "steps", "warmup_steps", "instrument"}


def infer_knob(records: Sequence[Mapping[str, Any]]) -> str | None:
    """The config key whose value differs between records (the swept knob), if exactly one."""
    keys: dict[str, set[str]] = defaultdict(set)
    for rec in records:
        for k, v in (rec.get("config") or {}).items():
            keys[k].add(repr(v))
    varying = [k for k, vals in keys.items() if len(vals) > 1 and k not in _NOT_KNOBS]
    return varying[0] if len(varying) == 1 else (varying[0] if varying else None)


def _series(records: Sequence[Mapping[str, Any]], by: str | None) -> dict[str, list[Any]]:
    groups: dict[str, list[Any]] = defaultdict(list)
    for rec in records:
        groups[_cat(knob_value(rec, by)) if by else ""].append(rec)
    return dict(groups)


def _xaxis(ax: Axes, all_values: list[Any]) -> Callable[[list[Any]], list[float]]:
    """Set up x for the knob's values over *all* series; returns value -> x position.

    Numeric knobs keep their spacing (log when they span 20x); others become categories.
    """
    if numeric(all_values):
        xs = [float(v) for v in all_values]
        if min(xs) > 0 and max(xs) / min(xs) >= 20:
            ax.set_xscale("log")
        ticks = sorted(set(xs))
        ax.set_xticks(ticks, [f"{t:g}" for t in ticks])
        ax.minorticks_off()
        return lambda vals: [float(v) for v in vals]
    cats = list(dict.fromkeys(_cat(v) for v in all_values))
    ax.set_xticks(range(len(cats)), [wrap(c, 16) for c in cats])  # run labels on lines: side by side they ran together
    # half a slot either side: the first and last labels stay over the axes (the first hung out under the y label)
    ax.set_xlim(-0.5, len(cats) - 0.5)
    return lambda vals: [float(cats.index(_cat(v))) for v in vals]


def _cat(value: Any) -> str:
    return "none" if value is None else str(value)


def _whiskers(ax: Axes, xs: list[float], recs: Sequence[Mapping[str, Any]], key: str,
              color: str) -> None:
    """Error bars from each record's spread of `key` (none for kit.run/1 records)."""
    for x, rec in zip(xs, recs):
        sp = run_spread(rec, key)
        if sp is not None:
            med, lo, hi, _ = sp
            ax.errorbar([x], [med], yerr=[[max(0.0, med - lo)], [max(0.0, hi - med)]], fmt="none",
                        ecolor=color, elinewidth=1.0, capsize=3, zorder=2)


def _line(ax: Axes, xs: list[float], ys: list[float], emulated: list[bool], color: str,
          label: str) -> Any:
    order = sorted(range(len(xs)), key=lambda i: xs[i])
    xs, ys, emulated = [xs[i] for i in order], [ys[i] for i in order], [emulated[i] for i in order]
    (line,) = ax.plot(xs, ys, color=color, marker="o", label=label, zorder=2)
    hollow = [i for i, e in enumerate(emulated) if e]
    if hollow:  # emulated points: hollow markers, explained in the legend
        ax.plot([xs[i] for i in hollow], [ys[i] for i in hollow], linestyle="none", marker="o",
                markerfacecolor="white", markeredgecolor=color, markersize=8, zorder=3)
    return line


def comm_vs_knob(records: Sequence[Mapping[str, Any]], knob: str | None = None,
                 series: str | None = None, title: str | None = None,
                 knob_label: str | None = None) -> Figure:
    """Left: exposed comm as % of the step; right: throughput (samples/s); x = the knob.

    `knob` defaults to the one config key that varies; `knob_label` names it on the axis
    (default: the key). `series` (a config key, e.g. "strategy") draws one line per value.
    Points are medians with whiskers (kit.run/2 records; the legend says which spread).
    Emulated runs have hollow markers.
    """
    knob = knob or infer_knob(records) or "label"
    # runs on x by label: each tick its run's own part (marked stopped, numbered), what all share said once under
    # the title
    shared, own = run_keys(records) if knob == "label" else ("", [])
    by_run = {id(r): o for r, o in zip(records, own)}

    def value(rec: Mapping[str, Any]) -> Any:
        return knob_value(rec, knob) if knob != "label" else by_run[id(rec)]

    fig = new_figure(width_in=COLUMN_WIDTH_IN, height_in=4.0, ncols=2)
    ax_pct, ax_thr = fig.axes
    to_x = [_xaxis(ax, [value(r) for r in records]) for ax in (ax_pct, ax_thr)]
    handles = []
    for i, (name, recs) in enumerate(_series(records, series).items()):
        color = SERIES[i % len(SERIES)]
        for ax, xmap, key in ((ax_pct, to_x[0], "comm_overhead_pct"),
                              (ax_thr, to_x[1], "throughput_samples_s")):
            # exposed comm of a run whose phases were not timed is a 0.0 that was never measured: not drawn
            drawn = [r for r in recs if key != "comm_overhead_pct" or phases_timed(r)]
            if not drawn:
                continue
            xs = xmap([value(r) for r in drawn])
            line = _line(ax, xs, [run_center(r)[key] for r in drawn], [is_emulated(r) for r in drawn], color,
                         f"{series}={name}" if series else f"measured ({_what(recs)})")
            _whiskers(ax, xs, drawn, key, color)
        handles.append(line)
    ax_pct.set_ylabel("exposed communication (% of step)")
    ax_thr.set_ylabel("throughput (samples/s)")
    knob_label = knob_label or axis_label(knob)
    for ax in (ax_pct, ax_thr):
        ax.set_xlabel(knob_label)
        ax.set_ylim(bottom=0)
        ax.grid(alpha=0.3)
        ax.spines[["top", "right"]].set_visible(False)
    untimed = sum(not phases_timed(r) for r in records)
    ax_pct.set_title("Communication overhead" + (f"\n({untimed} run(s) not drawn: phases not timed)" if untimed else ""))
    if untimed == len(records):  # an empty panel with a % axis would look like a plot of nothing
        ax_pct.text(0.5, 0.5, "no run's phases were timed\n(instrument=False)", ha="center", va="center",
                    transform=ax_pct.transAxes)
        ax_pct.set_yticks([])
    ax_thr.set_title("Throughput")
    fig.suptitle((title or f"What changing {knob_label or knob} does to communication and throughput")
                 + (f"\n{shared}" if shared else ""))
    _emulated_legend(fig, handles, any(is_emulated(r) for r in records),
                     whisker_note(records, "throughput_samples_s"))
    return fig


# Units for knobs a caller names by their config key (the lab bench passes its own labels).
_UNITS = {"bucket_cap_mb": "bucket_cap_mb (MiB)", "batch_size": "batch_size (samples per rank)",
          "world_size": "world size (ranks)", "micro_batches": "micro_batches (per step)",
          "grad_accum_steps": "grad_accum_steps (micro-steps)", "link_gbps": "link_gbps (GB/s)",
          "link_alpha_us": "link_alpha_us (us)", "straggler_ms": "straggler_ms (ms)",
          "powersgd_rank": "powersgd_rank (rank of the factors)", "label": "run (configuration)"}


def axis_label(knob: str) -> str:
    """The knob's axis label with its unit; a categorical knob (strategy, precision) says so."""
    return _UNITS.get(knob, f"{knob} (setting)")


def _what(records: Sequence[Mapping[str, Any]]) -> str:
    """What these runs are, for the legend: the strategy and workload the learner chose."""
    seen = dict.fromkeys(f"{knob_value(r, 'strategy') or '?'} {knob_value(r, 'workload') or ''}".strip()
                         for r in records)
    return ", ".join(list(seen)[:2]) + (", ..." if len(seen) > 2 else "")


def _emulated_legend(fig: Figure, handles: list[Any], emulated: bool, whiskers: str | None = None) -> None:
    """The figure's one legend, under its axes: inside them (loc="best") it covered a one-point sweep's
    whisker, and no spot inside is sure to be free. Constrained layout makes room for it ("outside")."""
    from matplotlib.lines import Line2D

    extra = [Line2D([], [], linestyle="none", marker="o", markerfacecolor="white",
                    markeredgecolor="black", label="hollow: emulated link")] if emulated else []
    if whiskers:
        extra.append(Line2D([], [], color="black", marker="_", markersize=8, label=whiskers))
    entries = handles + extra
    fig.legend(handles=entries, loc="outside lower center", ncols=min(len(entries), 3), fontsize="small",
               frameon=False)


def _pairs(predicted: Mapping[int, float] | Iterable[tuple[int, float]]) -> list[tuple[int, float]]:
    items = predicted.items() if isinstance(predicted, Mapping) else predicted
    return sorted((int(w), float(t)) for w, t in items)


def _same_setup(records: Sequence[Mapping[str, Any]]) -> dict[str, list[Any]]:
    """Runs that differ only in world size share a line; any other difference (strategy, batch, a
    knob) is another experiment, so another line, named by what differs ("batch_size=64")."""
    def setup(rec: Mapping[str, Any]) -> dict[str, Any]:
        return {k: v for k, v in (rec.get("config") or {}).items() if k not in _NOT_KNOBS | {"world_size"}}

    groups: dict[str, list[Any]] = defaultdict(list)
    for rec in records:
        groups[repr(sorted(setup(rec).items()))].append(rec)
    if len(groups) == 1:
        return {"": list(records)}
    firsts = [setup(g[0]) for g in groups.values()]
    differ = [k for k in dict.fromkeys(k for f in firsts for k in f) if len({repr(f.get(k)) for f in firsts}) > 1]
    return {", ".join(f"{k}={setup(g[0]).get(k)}" for k in differ[:2]) + (", ..." if len(differ) > 2 else ""): g
            for g in groups.values()}


def scaling(records: Sequence[Mapping[str, Any]],
            predicted: Mapping[int, float] | Iterable[tuple[int, float]] | None = None,
            series: str | None = None, title: str | None = None) -> Figure:
    """Measured throughput (samples/s) vs world size, beside ideal linear scaling.

    Ideal = the smallest world size's throughput times N / N_min (black dashed). Each point is
    annotated with its scaling efficiency. `predicted` ({world_size: samples/s} or pairs) is
    drawn dotted with diamond markers and labelled "predicted". Only runs that differ in world
    size alone are joined by a line (`series` is kept for callers; the grouping already
    separates strategies); of several runs at one world size the newest is drawn.
    """
    fig = new_figure(width_in=7.5, height_in=4.2)
    ax = fig.axes[0]
    handles = []
    all_ws: list[int] = []
    ideal_shown = False
    for i, (name, recs) in enumerate(_same_setup(records).items()):
        newest = {int(knob_value(r, "world_size") or 1): r for r in recs}  # a re-run replaces its point
        recs = [newest[w] for w in sorted(newest)]
        pts = [(int(knob_value(r, "world_size") or 1), run_center(r)["throughput_samples_s"],
                is_emulated(r)) for r in recs]
        ws = [p[0] for p in pts]
        all_ws += ws
        color = SERIES[i % len(SERIES)]
        handles.append(_line(ax, [float(w) for w in ws], [p[1] for p in pts],
                             [p[2] for p in pts], color, f"measured ({name or _what(recs)})"))
        _whiskers(ax, [float(w) for w in ws], recs, "throughput_samples_s", color)
        w0, t0 = ws[0], pts[0][1]
        ideal = [t0 * w / w0 for w in ws]
        if len(ws) < 2:
            continue  # one world size: nothing to scale from
        (ln,) = ax.plot(ws, ideal, color=OKABE_ITO["black"], linestyle="--", linewidth=1,
                        label="_ideal" if ideal_shown else "ideal linear", zorder=1)
        if not ideal_shown:
            handles.append(ln)
            ideal_shown = True
        for (w, t, _), best in zip(pts, ideal):
            if w != w0 and best:
                ax.annotate(f"{100 * t / best:.0f}%", (w, t), xytext=(4, -12),
                            textcoords="offset points", fontsize="x-small", color=color)
    if predicted is not None:
        pp = _pairs(predicted)
        all_ws += [w for w, _ in pp]
        (ln,) = ax.plot([w for w, _ in pp], [t for _, t in pp], color=OKABE_ITO["purple"],
                        linestyle=":", marker="D", label="predicted (model)", zorder=2)
        handles.append(ln)
    ticks = sorted(set(all_ws)) or [1]
    ax.set_xticks(ticks, [str(t) for t in ticks])
    ax.set_xlabel("world size (ranks)")
    ax.set_ylabel("throughput (samples/s)")
    ax.set_ylim(bottom=0)
    ax.grid(alpha=0.3)
    ax.spines[["top", "right"]].set_visible(False)
    ax.set_title(title or "Scaling: measured throughput vs ideal linear (% = efficiency)")
    _emulated_legend(fig, handles, any(is_emulated(r) for r in records),
                     whisker_note(records, "throughput_samples_s"))
    return fig
