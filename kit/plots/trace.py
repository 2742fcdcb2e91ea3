"""A merged profiler trace (kit/engine/trace.py) drawn small: one band per rank, on the common clock.

Per rank three lanes, top to bottom: the kit's spans (the cell, or an experiment's phases),
the collectives the rank's code called, and torch's outermost operators (communication ops in
vermillion, everything else blue). It is a thumbnail for "did the ranks line up, where did the
time go"; the file itself, opened in ui.perfetto.dev, has every event.
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Any, Mapping

from kit.plots._style import COLORS, OKABE_ITO, SERIES, new_figure

if TYPE_CHECKING:
    from matplotlib.figure import Figure

__all__ = ["trace_timeline", "is_comm_op"]

_COMM_WORDS = ("nccl", "gloo", "c10d", "all_reduce", "allreduce", "all_gather", "allgather", "reduce_scatter",
               "broadcast", "send", "recv", "barrier", "all_to_all", "alltoall")
_PHASES = {"forward": COLORS["fwd"], "backward": COLORS["bwd"], "optimizer": COLORS["opt"]}
_LANES = ("kit", "collectives", "torch ops")  # "collectives": every "kit: ..." row (also DDP's buckets)


def is_comm_op(name: str) -> bool:
    low = name.lower()
    return any(w in low for w in _COMM_WORDS)


def _cell_name(label: str) -> str:
    """A cell span is named as kit.errors.cell_label names the cell: "In [7]" in a notebook, "cell 5" outside."""
    return label if label.startswith("cell ") else f"cell {label}"


def _outermost(events: list[dict[str, Any]]) -> list[tuple[float, float, str]]:
    """(start, dur, name) of the events not inside another on the same row."""
    out: list[tuple[float, float, str]] = []
    end = float("-inf")
    for e in sorted(events, key=lambda e: (e["ts"], -e["dur"])):
        if e["ts"] >= end:
            name = _cell_name(e["name"]) if e.get("cat") == "cell" else e["name"].split(" #")[0]
            out.append((e["ts"], e["dur"], name))
            end = e["ts"] + e["dur"]
    return out


def _lanes(trace: Mapping[str, Any]) -> dict[int, dict[str, list[tuple[float, float, str]]]]:
    names = {(e["pid"], e["tid"]): e["args"]["name"] for e in trace["traceEvents"]
             if e.get("ph") == "M" and e.get("name") == "thread_name"}
    rows: dict[tuple[Any, Any], list[dict[str, Any]]] = {}
    for e in trace["traceEvents"]:
        if e.get("ph") == "X":
            rows.setdefault((e["pid"], e["tid"]), []).append(e)
    out: dict[int, dict[str, list[tuple[float, float, str]]]] = {}
    for (pid, tid), evs in rows.items():
        name = names.get((pid, tid), "")
        lane = "kit" if name == "kit" or name.startswith("kit (") else "collectives" if name.startswith("kit: ") \
            else "torch ops"
        if lane == "kit":  # phases inside steps: draw the innermost level that exists
            inner = [e for e in evs if e.get("cat") in ("phase", "comm")]
            evs = inner or evs
        out.setdefault(int(pid), {k: [] for k in _LANES})[lane] += _outermost(evs)
    return out


def _color(lane: str, name: str) -> str:
    if lane == "collectives" or (lane == "torch ops" and is_comm_op(name)):
        return COLORS["comm"]
    if lane == "torch ops":
        return COLORS["compute"]
    base = name.split(" ")[0]
    return COLORS["comm"] if is_comm_op(name) else _PHASES.get(base, OKABE_ITO["grey"])


def _empty_collectives(trace: Mapping[str, Any], rank: int) -> str:
    """Why a rank's collectives lane is empty: the lane holds what the rank's Python code called (the kit's
    ledger); DDP's bucket all-reduces are issued by its C++ reducer, so they show only among torch's ops."""
    kit_rows = {(e["pid"], e["tid"]) for e in trace["traceEvents"] if e.get("ph") == "M"
                and e.get("name") == "thread_name" and str(e["args"].get("name", "")).startswith("kit")}
    comm = [e["name"] for e in trace["traceEvents"] if e.get("ph") == "X" and e["pid"] == rank
            and (e["pid"], e["tid"]) not in kit_rows and is_comm_op(e["name"])]
    n = sum(name.startswith(("gloo:", "nccl:")) for name in comm) or len(comm)  # the backend's own, one per call
    if n:
        return (f"no collective called from Python; torch issued {n} itself (DDP's reducer, "
                f"a comm hook): in the torch ops lane")
    return "no collective in this cell"


def trace_timeline(trace: Mapping[str, Any], title: str | None = None) -> Figure:
    """A compact picture of a merged trace: ranks as rows, milliseconds from the first event."""
    from matplotlib.patches import Patch

    lanes = _lanes(trace)
    ranks = sorted(lanes)
    fig = new_figure(8.0, 0.9 + 0.75 * max(1, len(ranks)))
    ax = fig.axes[0]
    ticks, labels, used = [], [], {}
    for i, rank in enumerate(ranks):
        for j, lane in enumerate(_LANES):
            y = -(i * (len(_LANES) + 1) + j)
            spans = lanes[rank][lane]
            for ts, dur, name in spans:
                c = _color(lane, name)
                used.setdefault(c, "communication" if c == COLORS["comm"] else
                                name if lane == "kit" else "torch compute ops")
            ax.broken_barh([(ts / 1e3, max(dur / 1e3, 1e-6)) for ts, dur, _ in spans], (y - 0.4, 0.8),
                           facecolors=[_color(lane, n) for *_, n in spans], linewidth=0)
            if lane == "collectives" and not spans:  # say why the lane is empty rather than leave it blank
                ax.text(0.01, y, _empty_collectives(trace, rank), transform=ax.get_yaxis_transform(),
                        va="center", fontsize=7, color=OKABE_ITO["grey"])
            ticks.append(y)
            labels.append(f"rank {rank} · {lane}")
    ax.set_yticks(ticks, labels, fontsize=8)
    ax.set_xlabel("time since the first event (ms, common clock)")
    ax.set_ylabel("rank · lane")
    clock = (trace.get("otherData") or {}).get("clock", "")
    ax.set_title(title or f"Profiler trace: {len(ranks)} rank(s)" + (f", {clock}" if clock else ""), fontsize=10)
    handles = [Patch(color=c, label=label) for c, label in used.items()][:len(SERIES)]
    if handles:
        ax.legend(handles=handles, loc="upper left", bbox_to_anchor=(1.01, 1.0), fontsize=8, frameon=False)
    ax.margins(x=0.01)
    return fig
