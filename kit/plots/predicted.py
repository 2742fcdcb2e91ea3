"""Predicted scaling (kit.prediction/1) with measured runs drawn over it, and the residuals.

Why a separate plot from `scaling`: `scaling` draws *measured* records against ideal scaling;
this one draws a *prediction* out to 1024 ranks, where nothing was measured, so every predicted
line is labelled "predicted" and the measured points sit on top where they exist. Log-2 ranks on
x: 1, 2, 4 ... 1024 are evenly spaced, as a learner reads them.
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Any, Mapping, Sequence

from kit.experiments.choices import ONE_PROCESS
from kit.experiments.record_readers import phases_timed, run_center
from kit.plots._notes import place_notes, spread_apart
from kit.plots._style import (
    COLORS, COLUMN_WIDTH_IN, OKABE_ITO, PREDICTED_HATCH, SERIES, add_marking_legend, is_emulated, knob_value,
    new_figure,
)

if TYPE_CHECKING:
    from matplotlib.axes import Axes
    from matplotlib.figure import Figure

__all__ = ["scaling_prediction", "residuals_plot", "local_prediction", "matching_measured", "last_run_prediction"]


def _ranks_of(rec: Mapping[str, Any]) -> int:
    if knob_value(rec, "strategy") in ONE_PROCESS:
        return 1
    return int(knob_value(rec, "world_size") or 1)


def _log2_axis(ax: Axes, ranks: Sequence[int]) -> None:
    ax.set_xscale("log", base=2)
    ticks = sorted(set(ranks))
    ax.set_xticks(ticks, [str(t) for t in ticks])
    ax.minorticks_off()
    ax.set_xlabel("ranks (log scale)")
    ax.grid(alpha=0.3)
    ax.spines[["top", "right"]].set_visible(False)


def _measured(ax_thr: Axes, ax_ms: Axes, measured: Sequence[Mapping[str, Any]], color: str) -> list[Any]:
    """Measured runs as big markers (hollow: emulated link) over the predicted lines."""
    from matplotlib.lines import Line2D
    for rec in measured:
        c, w = run_center(rec), _ranks_of(rec)
        face = "white" if is_emulated(rec) else color
        ax_thr.plot([w], [c["throughput_samples_s"]], marker="o", markersize=8, markerfacecolor=face,
                    markeredgecolor=color, linestyle="none", zorder=4)
        ax_ms.plot([w], [c["step_ms"]], marker="o", markersize=8, markerfacecolor=face,
                   markeredgecolor=color, linestyle="none", zorder=4)
        if phases_timed(rec):  # else its exposed comm is a 0.0 that was never measured
            ax_ms.plot([w], [c["comm_exposed_ms"]], marker="s", markersize=6, markerfacecolor=face,
                       markeredgecolor=COLORS["comm_exposed"], linestyle="none", zorder=4)
    out = [Line2D([], [], marker="o", linestyle="none", color=color, label="measured step / throughput")]
    if any(phases_timed(r) for r in measured):  # none drawn otherwise: no key for them
        out.append(Line2D([], [], marker="s", linestyle="none", color=COLORS["comm_exposed"],
                          label="measured exposed comm"))
    if any(is_emulated(r) for r in measured):
        out.append(Line2D([], [], marker="o", linestyle="none", markerfacecolor="white", markeredgecolor="black",
                          label="hollow: emulated link"))
    return out


def _prediction_lines(ax_thr: Axes, ax_ms: Axes, pred: Mapping[str, Any], i: int, alone: bool) -> list[Any]:
    """The i-th prediction: throughput (and, for the first, ideal) left, step and comm right, where comm stops
    hiding, the last point's efficiency; its legend handles. `alone`: the comm lines take their own colours."""
    pts = pred["points"]
    ws = [r["ranks"] for r in pts]
    color = SERIES[i % len(SERIES)]
    name = pred.get("label", "predicted")
    (ln,) = ax_thr.plot(ws, [r["throughput_samples_s"] for r in pts], color=color, marker="D", markersize=4,
                        label=f"{name}" if not alone else "predicted throughput")
    handles = [ln]
    x1 = pts[0]["throughput_samples_s"] / pts[0]["ranks"]
    (ideal,) = ax_thr.plot(ws, [x1 * w for w in ws], color=color, linestyle=":", linewidth=1.2,
                           label="ideal (linear)" if i == 0 else "_ideal")
    if i == 0:
        handles.append(ideal)
    ax_ms.plot(ws, [r["step_ms"] for r in pts], color=color, marker="D", markersize=4)
    ax_ms.plot(ws, [r["comm_exposed_ms"] for r in pts], color=COLORS["comm_exposed"] if alone else color,
               linestyle="--", linewidth=1.2)
    ax_ms.plot(ws, [r["comm_overlap_ms"] for r in pts], color=COLORS["comm_overlap"] if alone else color,
               linestyle="-.", linewidth=1.0)
    stop = pred.get("comm_stops_hiding_at")
    if stop:
        for ax in (ax_thr, ax_ms):
            ax.axvline(stop, color=color, linestyle=(0, (1, 3)), linewidth=1.5, zorder=1)
    return handles


_NOTE_PT = 11  # a line of "x-small" text (7 pt) and a gap
_EFFICIENCY_GAP = 0.045  # of the axes' height between two efficiencies' centres: a line of "x-small" and a gap


def _notes(ax: Axes, preds: Sequence[Mapping[str, Any]], last_ranks: int) -> None:
    """Where comm stops hiding and the last point's efficiency, in each prediction's colour, none on another:
    the notes one above the other (four predictions' "comm stops hiding" at 2, 2, 4 and 16 ranks ran into
    each other), the efficiencies moved apart where their points nearly coincide (38% and 38%)."""
    import math

    several = len(preds) > 1
    stops = sorted((p["comm_stops_hiding_at"], i) for i, p in enumerate(preds) if p.get("comm_stops_hiding_at"))
    for k, (stop, i) in enumerate(stops):
        # a note right of its line, or left of it in the axes' right part (it ran into the other panel)
        right = math.log2(stop) > 0.6 * math.log2(max(last_ranks, 2))
        text = f"comm stops hiding at {stop} ranks" if several else f"comm stops hiding\nat {stop} ranks"
        ax.annotate(text, (stop, 0), xycoords=("data", "axes fraction"), xytext=(-4 if right else 4, 8 + _NOTE_PT * k),
                    textcoords="offset points", fontsize="x-small", color=SERIES[i % len(SERIES)],
                    ha="right" if right else "left", bbox={"facecolor": "white", "edgecolor": "none", "alpha": 0.8,
                                                           "pad": 0.5})
    # each efficiency right of its line's last point, in room made for it past the last rank count
    lo, hi = (math.log10(v) for v in ax.get_ylim())  # the limits once every line is drawn (log y)
    lasts = [((math.log10(p["points"][-1]["throughput_samples_s"]) - lo) / ((hi - lo) or 1.0), i, p["points"][-1])
             for i, p in enumerate(preds)]
    # within the axes: a note's centre half a gap from their edges (5 predictions ending at the bottom went below it)
    ats = spread_apart([f for f, _, _ in lasts], _EFFICIENCY_GAP, lo=_EFFICIENCY_GAP / 2, hi=1 - _EFFICIENCY_GAP / 2)
    for (_, i, last), at in zip(lasts, ats):
        ax.annotate(f"{100 * last['efficiency']:.0f}%", (last["ranks"], at), xycoords=("data", "axes fraction"),
                    xytext=(5, 0), textcoords="offset points", fontsize="x-small", color=SERIES[i % len(SERIES)],
                    va="center")


def scaling_prediction(prediction: Mapping[str, Any] | Sequence[Mapping[str, Any]],
                       measured: Sequence[Mapping[str, Any]] | None = None, title: str | None = None) -> Figure:
    """Left: predicted throughput vs ranks, ideal (dotted) and measured points; right: predicted
    step time, exposed and overlapped communication per rank. A vertical line marks where
    communication stops hiding (exposed > the prediction's threshold, 5% of the step).

    `prediction`: one `predict(...)` result or several (one colour each, e.g. strategies).
    `measured`: `kit.run` records drawn over the first prediction (medians; hollow = emulated).
    """
    preds = [prediction] if isinstance(prediction, Mapping) else list(prediction)
    fig = new_figure(width_in=COLUMN_WIDTH_IN, height_in=4.8, ncols=2)
    ax_thr, ax_ms = fig.axes
    handles: list[Any] = []
    all_ranks: list[int] = []
    for i, pred in enumerate(preds):
        handles += _prediction_lines(ax_thr, ax_ms, pred, i, alone=len(preds) == 1)
        all_ranks += [r["ranks"] for r in pred["points"]]
    if measured:
        handles += _measured(ax_thr, ax_ms, measured, SERIES[0])
        all_ranks += [_ranks_of(r) for r in measured]
    from matplotlib.lines import Line2D
    ms_handles = [Line2D([], [], color="black", marker="D", markersize=4, label="predicted step"),
                  Line2D([], [], color=COLORS["comm_exposed"], linestyle="--", label="predicted exposed comm"),
                  Line2D([], [], color=COLORS["comm_overlap"], linestyle="-.", label="predicted overlapped comm")]
    for ax in (ax_thr, ax_ms):
        _log2_axis(ax, all_ranks)
    ax_thr.set_yscale("log")
    ax_thr.set_ylabel("throughput (samples/s, log)")
    ax_ms.set_ylabel("time per step, per rank (ms)")  # the step's, and its communication's
    ax_ms.set_ylim(bottom=0)
    ax_thr.set_title("Throughput: predicted vs ideal\n(% = efficiency at the last point)", fontsize="medium")
    ax_ms.set_title("Step and communication, predicted", fontsize="medium")
    _notes(ax_thr, preds, max(all_ranks))
    for ax in (ax_thr, ax_ms):  # room right of the last points for their efficiencies, both panels alike
        ax.set_xlim(right=max(all_ranks) * 2)
    # an opaque box: the dotted "comm stops hiding" line showed through the keys' text (new-user trial)
    for ax, keyed in ((ax_thr, handles), (ax_ms, ms_handles)):
        add_marking_legend(ax, keyed, loc="upper left", frameon=True, framealpha=1.0, edgecolor="none")
    fig.suptitle(title or _title(preds[0]))
    return fig


def _title(pred: Mapping[str, Any]) -> str:
    """The title, "predicted ddp on 10gbe from [<the run's label>]: PREDICTED ...", on two lines where the label is
    long (the figure is 9.6 in wide: a long label and the rest on one line were cut off at its edges)."""
    label = str(pred.get("label", "prediction"))
    sep = ": " if len(label) <= 50 else "\n"
    return f"{label}{sep}PREDICTED (model), measured points on top"


def residuals_plot(rows: Sequence[Mapping[str, Any]], title: str | None = None) -> Figure:
    """Predicted vs measured step time (left, y = x is a perfect prediction) and the error per
    point (right), from `kit.experiments.benchmarks.predict_check.residuals` rows."""
    fig = new_figure(width_in=COLUMN_WIDTH_IN, height_in=4.4, ncols=2)
    ax_xy, ax_err = fig.axes
    links = list(dict.fromkeys(r["link"] for r in rows))
    hi = max([r["measured_step_ms"] for r in rows] + [r["predicted_step_ms"] for r in rows] + [1.0]) * 1.1
    ax_xy.plot([0, hi], [0, hi], color=OKABE_ITO["black"], linestyle=":", linewidth=1, label="perfect")
    ax_xy.fill_between([0, hi], [0, 0.85 * hi], [0, 1.15 * hi], color=OKABE_ITO["grey"], alpha=0.15, label="+-15%")
    for i, link in enumerate(links):
        sel = [r for r in rows if r["link"] == link]
        color = SERIES[i % len(SERIES)]
        ax_xy.errorbar([r["measured_step_ms"] for r in sel], [r["predicted_step_ms"] for r in sel],
                       xerr=[[r["step_iqr_ms"] / 2 for r in sel]] * 2, fmt="o", color=color, label=link,
                       markerfacecolor="white" if r"+" in link else color, capsize=2)
    labels = [f"{r['ranks']}{'*' if r['oversubscribed'] else ''} {r['link']}" for r in rows]
    ax_err.barh(range(len(rows)), [r["step_err_pct"] for r in rows], color=COLORS["compute"], label="step time")
    ax_err.barh([i + 0.3 for i in range(len(rows))],
                [r["exposed_err_pct"] or 0.0 for r in rows], height=0.3, color=COLORS["comm_exposed"],
                label="exposed comm")
    ax_err.set_yticks(range(len(rows)), labels, fontsize="x-small")
    ax_err.axvline(0, color="black", linewidth=0.8)
    for x in (-15, 15):
        ax_err.axvline(x, color=OKABE_ITO["grey"], linestyle=":", linewidth=1)
    ax_err.set_xlabel("(predicted - measured) / measured (%)")
    ax_err.set_ylabel("ranks and link")
    ax_xy.set_xlabel("measured step (ms, median; bar: IQR)")
    ax_xy.set_ylabel("predicted step (ms)")
    ax_xy.set_xlim(0, hi)
    ax_xy.set_ylim(0, hi)
    # each point's ranks beside it, none on another's: points that nearly coincide had theirs on one spot
    notes = [(r["measured_step_ms"], r["predicted_step_ms"], f"{r['ranks']}{'*' if r['oversubscribed'] else ''}")
             for r in rows]
    place_notes(ax_xy, notes, size_in=(4.0, 3.6), colors=[SERIES[links.index(r["link"]) % len(SERIES)] for r in rows])
    for ax in (ax_xy, ax_err):
        ax.grid(alpha=0.3)
        ax.spines[["top", "right"]].set_visible(False)
    add_marking_legend(ax_xy, ax_xy.get_legend_handles_labels()[0], loc="upper left")
    add_marking_legend(ax_err, ax_err.get_legend_handles_labels()[0], loc="best")
    fig.suptitle(title or "Predicted vs measured on this machine (* = ranks oversubscribe the cores)")
    return fig


def local_prediction(rows: Sequence[Mapping[str, Any]], title: str | None = None) -> Figure:
    """The time model on this machine (kit.experiments.benchmarks.local_check.check_local rows): per strategy,
    the measured step (median, bar: min-max of the repeats) beside the predicted one (median, bar: min-max of
    the predictions, one per repeat's measured inputs)."""
    fig = new_figure(width_in=6.4, height_in=4.0)
    ax = fig.axes[0]
    x = list(range(len(rows)))
    for off, key, label, face in ((-0.17, "measured", "measured (median; bar: min-max of the repeats)", None),
                                  (0.17, "predicted", "predicted (median; bar: min-max, one per repeat's inputs)",
                                   "white")):
        mid = [r[f"{key}_step_ms"] for r in rows]
        lo_hi = [r[f"{key}_spread_ms"] for r in rows]
        ax.bar([i + off for i in x], mid, 0.34, color=face or COLORS["compute"], edgecolor=COLORS["compute"],
               hatch=PREDICTED_HATCH if face else None, label=label,
               yerr=[[m - lh[0] for m, lh in zip(mid, lo_hi)], [lh[1] - m for m, lh in zip(mid, lo_hi)]],
               capsize=3)
    ax.set_xticks(x, [f"{r['strategy']}, {r['ranks']} ranks" for r in rows])
    ax.set_xlabel("strategy (CPU ranks)")
    ax.set_ylabel("step time (ms)")
    ax.grid(alpha=0.3, axis="y")
    ax.spines[["top", "right"]].set_visible(False)
    ax.legend(fontsize="x-small", loc="upper center", bbox_to_anchor=(0.5, -0.14), ncol=2)  # never over a bar
    ax.set_title(title or f"The planner's time model on this machine ({rows[0]['repeats']} interleaved repeats)",
                 fontsize="medium")
    return fig


def matching_measured(records: Sequence[Mapping[str, Any]], base: Mapping[str, Any], link: str
                      ) -> list[Mapping[str, Any]]:
    """Runs a learner may set against the curve: ddp or single, complete, with the base run's
    workload, model size, batch and precision, and on the chosen link (loopback runs only with
    the 'loopback' choice; single runs, one rank, with any link)."""
    keys = ("workload", "model_size", "batch_size", "precision")
    b = base.get("config") or {}
    out = []
    for r in records:
        c = r.get("config") or {}
        if r.get("complete", True) is False or any(c.get(k) != b.get(k) for k in keys):
            continue
        if c.get("strategy") not in ("ddp", "single"):
            continue
        if (c.get("interconnect") or "loopback") == link or (c.get("strategy") == "single"):
            out.append(r)
    return out


def last_run_prediction(records: Sequence[Mapping[str, Any]]) -> Any:
    """The lab bench's "Predicted scaling" plot: the last run predicted to 1024 ranks on its own
    virtual link (infiniband for a loopback run) with its own strategy where `predict` models it
    (an FSDP run was predicted, and titled, as DDP), else as DDP and titled so; the matching
    measured runs on top. A mesh run is predicted on its own mesh (its data dimension growing), with
    no measured points: the matching runs are DDP's, another model."""
    from kit.experiments.theory.links import LINKS
    from kit.experiments.theory.prediction import PREDICTABLE, predict

    last = records[-1]
    c = last.get("config") or {}
    ic = c.get("interconnect")
    link: Any = ic if ic in LINKS else ((c.get("link_alpha_us") or 0.0, c.get("link_gbps") or 1.0)
                                        if ic == "custom" else "infiniband")
    own = c.get("strategy")
    mesh = bool(c.get("mesh"))
    strategy = None if mesh else own if own in PREDICTABLE else "ddp"
    pred = predict(last, link=link, strategy=strategy)
    title = None if strategy in (own, None) else (f"{_title(pred)}\n{own} is not one predict() models, so this is "
                                                  "DDP on its measured pieces")
    measured = [] if mesh else matching_measured(records, last, ic or "infiniband")
    return scaling_prediction(pred, measured=measured, title=title)
