"""One step on a time axis: per rank, a compute lane above a communication lane.

Why a timeline beside the stacked bars (steps.py): the bars say how much time a phase took, the
timeline says *when*, so overlap (comm under compute) and exposed waits (comm after the last
compute) become visible.
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Any, Mapping, Sequence

from kit.experiments.choices import KNOB_OWNERS, STAGED
from kit.plots._style import EMULATED_HATCH, add_marking_legend, event_color, is_emulated, last_record, new_figure

if TYPE_CHECKING:
    from matplotlib.figure import Figure

__all__ = ["step_timeline"]


def step_timeline(record: Mapping[str, Any] | Sequence[Mapping[str, Any]], step: int | None = None,
                  title: str | None = None) -> Figure:
    """One step on a time axis (ms): per rank, a compute lane above a communication lane.

    Why two lanes per rank: a bucket's all-reduce running while backward still computes is
    overlap you can see; a comm bar after the last compute bar is exposed time.
    Times are shifted so the earliest event is at 0 ms.

    On an emulated link a bucket's bar (launch to delivery) holds two different waits: the real
    all-reduce plus queueing for the link, then the bucket's own time on the wire. The link is
    FIFO and charges each bucket a known time (links.link_allreduce_s), so the last part of the
    bar is drawn apart, hatched, as "on the emulated wire"; the first part is lighter.
    A list of records (as the other plots take) draws its last one, as the lab bench does.
    """
    record = last_record(record, 'step_timeline')
    events = [e for e in record.get("timeline") or []
              if step is None or e.get("step", step) == step]
    # the legend goes below the axes, so the time axis gets the figure's whole width (at the right it
    # took about two thirds of it and short phases shrank to slivers)
    fig = new_figure(height_in=2.4 + 0.9 * max(1, len({e["rank"] for e in events})))
    ax = fig.axes[0]
    if not events:
        ax.text(0.5, 0.5, "this record has no timeline (run with instrument=True)",
                ha="center", va="center", transform=ax.transAxes)
        ax.set_axis_off()
        return fig
    t0 = min(float(e["start_ms"]) for e in events)
    span = max(float(e["end_ms"]) for e in events) - t0 or 1.0
    emulated = is_emulated(record)
    yticks, ylabels = _draw_ranks(ax, events, t0, span, _wire_ms(record), emulated)
    ax.set_yticks(yticks, ylabels, fontsize="small")
    ax.set_ylabel("rank and lane")
    ax.set_xlabel("time within the step (ms)")
    ax.set_xlim(0, span)
    fig.suptitle(title or "One step per rank: does communication overlap compute?\n"
                 f"{record.get('label', '')}{_bubble_line(record)}", fontsize="medium")
    ax.spines[["top", "right", "left"]].set_visible(False)
    handles, _ = ax.get_legend_handles_labels()
    add_marking_legend(ax, handles, emulated=emulated, loc="upper center",
                       bbox_to_anchor=(0.5, -0.2), ncols=2)
    return fig


def _draw_ranks(ax: Any, events: list[Mapping[str, Any]], t0: float, span: float,
                wire_ms: list[float] | None, emulated: bool) -> tuple[list[float], list[str]]:
    """Each rank's two lanes, rank 0 on top; the y ticks and their labels."""
    yticks: list[float] = []
    ylabels: list[str] = []
    seen: set[str] = set()
    labels = _comm_labels(events)
    base = 0.0
    for rank in sorted({int(e["rank"]) for e in events}, reverse=True):
        mine = sorted((e for e in events if int(e["rank"]) == rank),
                      key=lambda e: float(e["start_ms"]))
        comm = [e for e in mine if e.get("kind") == "comm"]
        lane_of, n_sub = _pack(comm)  # concurrent all-reduces get their own sub-lanes
        # comm events are "all_reduce #i" in launch order, and DDP launches buckets in index
        # order, so the i-th bar is bucket i (whose wire time wire_ms[i] is known).
        wire_of = ({id(e): wire_ms[i] for i, e in enumerate(comm)}
                   if wire_ms is not None and len(wire_ms) == len(comm) else {})
        sub_h = 1.0 / n_sub
        for ev in mine:
            if ev.get("kind", "compute") == "comm":
                y, h = base + lane_of[id(ev)] * sub_h, sub_h * 0.9
            else:
                y, h = base + 1.2, 1.0
            _draw_event(ax, ev, float(ev["start_ms"]) - t0, (y, h), wire_of.get(id(ev), 0.0), emulated, seen, span,
                        labels)
        yticks += [base + 1.7, base + 0.5]
        ylabels += [f"rank {rank} compute", f"rank {rank} comm"]
        base += 2.6
    return yticks, ylabels


def _comm_label(name: str) -> str:
    """What a comm bar is: DDP's hook-timed buckets are "all_reduce #i" (timing.StepClock.timeline);
    the other strategies' comm phases are named by what they send (model parallel and pipeline:
    "send to 1", naive DP: "all_reduce grads", ZeRO-1: "param broadcast", parameter server: ...)."""
    if name.startswith(("all_reduce #", "bucket")):
        return "communication (bucket all-reduce)"
    if name.startswith("send to"):  # gloo's isend returns once posted; recv bars are the waits (idle)
        return "send between stages (isend posted; delivery waited before the optimizer)"
    if name.startswith("recv from"):
        return "communication (send/recv between stages)"
    return f"communication ({name})"


def _comm_labels(events: list[Mapping[str, Any]]) -> dict[str, str]:
    """{comm event name: its legend entry}, one entry per colour: a mesh colours its bars by dimension
    (event_color), so HSDP's "fsdp all_gather" and "fsdp reduce_scatter" share a green and share an entry
    ("communication (fsdp all_gather, fsdp reduce_scatter)") instead of two green entries a reader cannot
    tell apart on the bars."""
    by_colour: dict[str, list[str]] = {}
    for ev in events:
        label = _comm_label(str(ev.get("name", "")))
        if ev.get("kind") == "comm" and label.startswith("communication (") and \
                label not in by_colour.setdefault(event_color(ev), []):
            by_colour[event_color(ev)].append(label)
    out = {}
    for ev in events:
        same = by_colour.get(event_color(ev), []) if ev.get("kind") == "comm" else []
        if len(same) > 1 and _comm_label(str(ev.get("name", ""))) in same:
            inner = ", ".join(x[len("communication ("):-1] for x in same)
            out[str(ev.get("name", ""))] = f"communication ({inner})"
    return out


def _draw_event(ax: Any, ev: Mapping[str, Any], start: float, lane: tuple[float, float], wire_ms: float,
                emulated: bool, seen: set[str], span: float, labels: Mapping[str, str] | None = None) -> None:
    """One timeline bar (an emulated bucket split at its time on the wire) and its name if it fits."""
    y, h = lane
    kind = ev.get("kind", "compute")
    color = event_color(ev)
    width = max(float(ev["end_ms"]) - float(ev["start_ms"]), 1e-3)
    hatch = EMULATED_HATCH if kind == "comm" and emulated else ("xx" if kind == "idle" else None)
    label = (labels or {}).get(str(ev.get("name", "")), _comm_label(str(ev.get("name", "")))) if kind == "comm" else \
        {"compute": "compute", "idle": "idle / waiting"}.get(kind, kind)
    wire = min(wire_ms, width)
    text_color = "white" if kind != "idle" and wire <= 0 else "black"  # dark on the light part
    if wire > 0:
        # Before the wire: the real (loopback) all-reduce and the wait for a busy link.
        before = "all-reduce + waiting for the link"
        ax.broken_barh([(start, width - wire)], (y, h), facecolors=color,
                       alpha=0.35, edgecolor="white", linewidth=0.8,
                       label=None if before in seen else before)
        label = "on the emulated wire (link time)"
        ax.broken_barh([(start + width - wire, wire)], (y, h), facecolors=color,
                       edgecolor="white", linewidth=0.8, hatch=hatch,
                       label=None if label in seen else label)
        seen.update((before, label))
    else:
        ax.broken_barh([(start, width)], (y, h), facecolors=color,
                       edgecolor="white", linewidth=0.8, hatch=hatch,
                       label=None if label in seen else label)
        seen.add(label)
    name = str(ev.get("name", ""))
    short = "#" + name.rsplit("#", 1)[1] if "#" in name else name
    # characters of x-small text (about 0.065 in each) the time axis holds across its width: the
    # figure's width less the rank labels' margin (about 1.6 in)
    chars_across = (ax.figure.get_figwidth() - 1.6) / 0.065
    for text in (name, short):  # name only what fits inside its bar, with a character to spare
        if width / span * chars_across >= len(text) + 2:
            ax.text(start + width / 2, y + h / 2, text, ha="center", va="center",
                    fontsize="x-small", color=text_color, clip_on=True)
            break


def _wire_ms(record: Mapping[str, Any]) -> list[float] | None:
    """Each bucket's time on the emulated link (ms, bucket order), or None without a link.

    The same formula the virtual link charges (interconnect.py): a custom link's alpha and
    beta, or a preset's latency, bandwidth and size efficiency (links.py).
    """
    from kit.experiments.theory.links import LINKS, LinkPreset, link_allreduce_s

    cfg = record.get("config") or {}
    name = cfg.get("interconnect")
    sizes = [float(b["bytes"]) for b in ((record.get("comm") or {}).get("buckets") or [])]
    p = int(cfg.get("world_size") or 2)
    if not name or not sizes:
        return None
    if name == "custom":
        alpha, gbps = cfg.get("link_alpha_us"), cfg.get("link_gbps")
        if alpha is None or not gbps:
            return None
        link = LinkPreset(float(alpha), float(gbps))
    else:
        link = LINKS.get(name)
    return None if link is None else [1e3 * link_allreduce_s(link, n, p) for n in sizes]


def _bubble_line(record: Mapping[str, Any]) -> str:
    """Pipeline/model parallel: the measured bubble beside GPipe's (p-1)/(m+p-1), or
    (p-1)/(v m+p-1) with v virtual stages per rank (interleaved 1F1B)."""
    cfg = record.get("config") or {}
    bubble = (record.get("summary") or {}).get("bubble_pct")
    if bubble is None or cfg.get("strategy") not in STAGED:
        return ""
    p = int(cfg.get("world_size") or 2)
    m = int(cfg.get("micro_batches") or 1) if cfg.get("strategy") in KNOB_OWNERS["micro_batches"] else 1
    v = int(cfg.get("virtual_stages") or 1)
    if v == 1:
        return f"\nbubble measured {bubble:.0f}% vs (p-1)/(m+p-1) = {100 * (p - 1) / (m + p - 1):.0f}%"
    return (f"\nbubble measured {bubble:.0f}% vs (p-1)/(v m+p-1) = {100 * (p - 1) / (v * m + p - 1):.0f}% "
            f"(v={v} chunks per rank; without interleaving {100 * (p - 1) / (m + p - 1):.0f}%)")


def _pack(comm: list[Mapping[str, Any]]) -> tuple[dict[int, int], int]:
    """Greedy interval packing: sub-lane index per comm event, and how many sub-lanes."""
    ends: list[float] = []
    lane: dict[int, int] = {}
    for ev in comm:
        start = float(ev["start_ms"])
        free = next((i for i, end in enumerate(ends) if end <= start), None)
        if free is None:
            ends.append(0.0)
            free = len(ends) - 1
        ends[free] = float(ev["end_ms"])
        lane[id(ev)] = free
    return lane, max(1, len(ends))
