"""Load per expert (ep) and attention work per rank (cp): where the ranks' work is uneven.

Why these two: a mixture of experts is as slow as its busiest expert, and causal ring attention
as slow as the rank whose queries see the most keys. Each figure draws what the run counted:
- `expert_load`: per layer, per expert, the token assignments kept (solid) and dropped over the
  capacity (hatched "xx" on top, so the bar's top is what the router sent), and the capacity line;
- `ring_balance`: per rank, the query-key pairs its causal ring attention computed (counted), and
  beside them the forward's attention milliseconds (measured: a run's last step, or a check's median of
  repeated forwards after an untimed one; an indication).
Both take run records (`comm.report.expert_load`, `comm.report.attention_work`) or the one-line
checks' results (`check_ep`, `check_ring_attention`), which carry the same numbers.
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Any, Callable, Mapping, Sequence

from kit.plots._keys import plain_label, run_keys
from kit.plots._style import COLUMN_WIDTH_IN, SERIES, comm_report, new_figure, newest, wrap

if TYPE_CHECKING:
    from matplotlib.figure import Figure

__all__ = ["expert_load", "ring_balance", "expert_layers", "attention_work", "DROPPED_HATCH"]

DROPPED_HATCH = "xx"  # assignments an expert dropped (over its capacity)
_MAX_GROUPS = 24  # experts x layers drawn: more bars than this would be too thin to read


def expert_layers(rec: Mapping[str, Any]) -> list[dict[str, Any]] | None:
    """Per layer {routed, kept, dropped, capacity (all ranks) or None}, or None without the data."""
    if "load" in rec and "routed" in (rec.get("load") or {}):  # a check_ep result: one layer
        cap = rec.get("capacity")
        return [{**rec["load"], "capacity": cap * rec.get("ep", 1) if cap else None}]
    layers = comm_report(rec).get("expert_load")
    if not layers:
        return None
    return [{**ly, "capacity": ly["capacity_per_rank"] * ly.get("ranks", 1) if ly.get("capacity_per_rank") else None}
            for ly in layers]


def attention_work(rec: Mapping[str, Any]) -> dict[str, Any] | None:
    """{score_entries_per_rank, compute_ms_per_rank, zigzag, ...} or None without the data."""
    if "score_entries_per_rank" in rec:  # a check_ring_attention result
        return dict(rec)
    return comm_report(rec).get("attention_work")


def _pick(records: Sequence[Mapping[str, Any]] | Mapping[str, Any], has: Callable[[Mapping[str, Any]], Any],
          what: str, strategy: str, max_runs: int | None) -> tuple[list[Mapping[str, Any]], list[str], str]:
    """The records with the data (newest `max_runs`), their labels and the title's subject line."""
    recs = [records] if isinstance(records, Mapping) else \
        list(records) if isinstance(records, (list, tuple)) else None
    if recs is None or not all(isinstance(r, Mapping) for r in recs):
        raise TypeError(f"pass a list of run records (the dicts kit.experiments.run returns) or a check's result, "
                        f"got {type(records).__name__}: {str(records)[:60]!r}; e.g. "
                        f"run(ExperimentConfig(strategy={strategy!r}, workload='gpt'))")
    with_data = [r for r in recs if has(r)]
    if not with_data:
        raise ValueError(f"no {what} in these records: run ExperimentConfig(strategy={strategy!r}, workload='gpt') "
                         "with kit.experiments.run, or pass its check's result")
    drawn, shown = newest(with_data, max_runs)
    # the subtitle names what is drawn: one run's label, "3 configurations, one colour each", or "last 3 of 7 runs",
    # and what all their labels share ("all runs: ep gpt bs8 fp32"), each key entry then naming its run's own part;
    # a check's result has no label: it is named by what it checked ("capacity factor 1", "zig-zag")
    shared, own = run_keys(drawn, [plain_label(r, i) if "label" in r or "run_id" in r else _check_label(r)
                                   for i, r in enumerate(drawn)])
    subject = own[0] if len(with_data) == 1 else \
        (f"{len(drawn)} configurations, one colour each" if len(drawn) == len(with_data) else shown) \
        + (f"; {shared}" if shared else "")
    return drawn, own, subject


def _check_label(rec: Mapping[str, Any]) -> str:
    if "score_entries_per_rank" in rec:
        return ("zig-zag" if rec.get("zigzag") else "contiguous") + ("" if rec.get("causal", True) else ", not causal")
    cf = rec.get("capacity_factor")
    return "no capacity limit" if cf is None else f"capacity factor {cf:g}"


def expert_load(records: Sequence[Mapping[str, Any]] | Mapping[str, Any], title: str | None = None,
                max_runs: int | None = None) -> Figure:
    """Token assignments per expert, a group of bars per layer: kept (solid) + dropped (hatched)
    = routed; a dashed line over a layer's group is its capacity (per rank's batch x ranks)."""
    from matplotlib.lines import Line2D
    from matplotlib.patches import Patch
    from matplotlib.ticker import MaxNLocator

    recs, labels, subject = _pick(records, expert_layers, "expert load per layer", "ep", max_runs)
    loads = [expert_layers(r) or [] for r in recs]
    experts = max(len(ly["routed"]) for layers in loads for ly in layers)
    n_layers = max(len(layers) for layers in loads)
    shown = max(1, min(n_layers, _MAX_GROUPS // experts))
    # The key beside the axes while the bars leave it room within COLUMN_WIDTH_IN; more groups of bars take
    # the whole width and the key goes below them, the figure
    # growing taller instead
    beside = 4.5 + 0.45 * experts * shown <= COLUMN_WIDTH_IN
    keys = len(recs) + 1 + sum(1 for layers in loads if layers and layers[0]["capacity"])
    fig = new_figure(width_in=4.5 + 0.45 * experts * shown if beside else COLUMN_WIDTH_IN,
                     height_in=4.4 if beside else 4.6 + 0.3 * -(-keys // 3))
    ax = fig.axes[0]
    width, gap = 0.8 / len(recs), 1.0  # a free slot between layers' groups
    handles: list[Any] = [Patch(facecolor=SERIES[i % len(SERIES)], label=f"kept: {_short(lb)}")
                          for i, lb in enumerate(labels)]
    handles.append(Patch(facecolor="white", edgecolor="black", hatch=DROPPED_HATCH, label="dropped (over capacity)"))
    ticks: list[float] = []
    for li in range(shown):
        left = li * (experts + gap)
        ticks += [left + e for e in range(experts)]
        for i, layers in enumerate(loads):
            if li >= len(layers):
                continue
            ly, color = layers[li], SERIES[i % len(SERIES)]
            xs = [left + e - 0.4 + width * (i + 0.5) for e in range(len(ly["routed"]))]
            ax.bar(xs, ly["kept"], width * 0.92, color=color, label=f"kept: {labels[i]}")
            ax.bar(xs, ly["dropped"], width * 0.92, bottom=ly["kept"], color="white", edgecolor=color,
                   hatch=DROPPED_HATCH, linewidth=0.8, label=f"dropped: {labels[i]}")
            if ly["capacity"]:
                ax.hlines(ly["capacity"], left - 0.5, left + experts - 0.5, colors=color, linestyles="--",
                          linewidth=1.2)
                if li == 0:
                    handles.append(Line2D([], [], color=color, linestyle="--",
                                          label=f"capacity {ly['capacity']:,}: {_short(labels[i])}"))
    top = max([max(ly["routed"]) for layers in loads for ly in layers[:shown]]
              + [ly["capacity"] or 0 for layers in loads for ly in layers[:shown]] + [1])
    ax.set_ylim(0, top * 1.15)
    ax.yaxis.set_major_locator(MaxNLocator(integer=True))  # a count: no 2.5 or 7.5 ticks
    for li in range(shown):
        ax.text(li * (experts + gap) + (experts - 1) / 2, top * 1.07, f"layer {li}", ha="center", fontsize="small")
    ax.set_xticks(ticks, [str(e) for _ in range(shown) for e in range(experts)], fontsize="small")
    ax.set_xlabel("expert (one group per layer)" if shown > 1 else "expert")
    ax.set_ylabel("token assignments (tokens x k)")
    ax.spines[["top", "right"]].set_visible(False)
    note = f"; layers {shown}-{n_layers - 1} not drawn" if n_layers > shown else ""
    fig.suptitle(title or f"Expert load: kept + dropped = routed, all ranks, last step{note}\n{subject}",
                 fontsize="medium")
    if beside:
        ax.legend(handles=handles, loc="upper left", bbox_to_anchor=(1.01, 1.0), fontsize="small", frameon=False)
    else:
        fig.legend(handles=handles, loc="outside lower center", ncols=3, fontsize="small", frameon=False)
    return fig


def _short(label: str) -> str:
    """A run label on lines short enough for a legend entry beside the axes (never cut)."""
    return wrap(label, 34)


def ring_balance(records: Sequence[Mapping[str, Any]] | Mapping[str, Any], title: str | None = None,
                 max_runs: int | None = None) -> Figure:
    """Causal ring attention's work per rank, one bar per run (contiguous or zig-zag split):
    query-key pairs counted (left) and, when measured, forward attention ms (right)."""
    from matplotlib.ticker import MaxNLocator

    recs, labels, subject = _pick(records, attention_work, "ring attention work per rank", "cp", max_runs)
    works = [attention_work(r) or {} for r in recs]
    has_ms = any(w.get("compute_ms_per_rank") for w in works)
    # taller with each run's line in the keys below
    fig = new_figure(width_in=COLUMN_WIDTH_IN if has_ms else 7.0, height_in=max(4.0, 3.2 + 0.2 * len(recs)),
                     ncols=2 if has_ms else 1)
    from matplotlib.transforms import ScaledTranslation
    panels = [("score_entries_per_rank", "query-key pairs computed (count)", "counted")]
    if has_ms:
        # a check times the median of repeated forwards after an untimed one; a run record, its last step's
        # ("one run" over two runs' bars misled the new-user trial)
        timed = [w for w in works if w.get("compute_ms_per_rank")]
        last = "each run's last step" if len(timed) > 1 else "the run's last step"
        hows = {w.get("compute_ms_of") or last for w in timed}
        panels.append(("compute_ms_per_rank", "attention forward (ms)",
                       f"measured, {hows.pop()}" if len(hows) == 1 else "measured"))
    width = 0.8 / len(recs)
    for ax, (key, ylabel, how) in zip(fig.axes, panels):
        for i, (w, lb) in enumerate(zip(works, labels)):
            vals = list(w.get(key) or [])
            if not vals:
                continue
            spread = f", max/min {max(vals) / min(vals):.2f}" if min(vals) > 0 else ""
            ax.bar([r - 0.4 + width * (i + 0.5) for r in range(len(vals))], vals, width * 0.92,
                   color=SERIES[i % len(SERIES)], label=f"{_short(lb)}{spread}")
        ranks = max(len(w.get("score_entries_per_rank") or []) for w in works)
        ax.set_xticks(range(ranks), [str(r) for r in range(ranks)])
        ax.set_xlabel("rank")
        ax.set_ylabel(ylabel)
        ax.set_title(how, fontsize="small")
        ax.spines[["top", "right"]].set_visible(False)
        ax.set_ylim(0, ax.get_ylim()[1] * 1.05)
        if key == "score_entries_per_rank":
            ax.yaxis.set_major_locator(MaxNLocator(integer=True))  # a count: integer ticks only
        # 0.45 in under the axes, below its tick labels and x label however tall the axes (an axes-relative
        # offset put 8 runs' key over the "rank" label); constrained layout makes room
        under = ax.transAxes + ScaledTranslation(0, -0.45, fig.dpi_scale_trans)
        ax.legend(fontsize="small", frameon=False, loc="upper left", bbox_to_anchor=(0.0, 0), bbox_transform=under)
    runs = {w.get("layers") is not None for w in works}  # a run's count covers every layer, a check's its one
    per = "per sequence and head" + (", all layers" if runs == {True} else "" if runs == {False}
                                     else "; runs: all layers, checks: one")
    fig.suptitle(title or f"Causal ring attention: work per rank ({per})\n{subject}", fontsize="medium")
    return fig
