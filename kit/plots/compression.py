"""Fewer bytes (lesson 07): who sends the bytes of a hand-written all-reduce, what compression did to
bytes, step and loss, and where compression's step time crosses the uncompressed one as the link gets faster.

Why here and not in the lesson: the figures are forty lines of matplotlib each, which a learner would
scroll past to reach the numbers; the lesson keeps the measuring and the predicting, these only draw.
Markers are measured, dashed lines and dotted bars predicted, hatching emulated (`_style`).
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Any, Mapping, Sequence

from kit.experiments.theory.links import LINKS, alpha_beta_allreduce_s
from kit.experiments.theory.links import ring_factor
from kit.plots._style import COLUMN_WIDTH_IN, EMULATED_HATCH, OKABE_ITO, PREDICTED_HATCH, is_emulated, new_figure
from kit.units import MIB

if TYPE_CHECKING:
    from matplotlib.figure import Figure

__all__ = ["bytes_per_rank", "compression_runs", "break_even", "ALGORITHM_BYTES"]

ALGORITHM_COLORS = {"ring": OKABE_ITO["blue"], "root": OKABE_ITO["vermillion"]}
COMPRESSION_COLORS = {"none": OKABE_ITO["black"], "fp16": OKABE_ITO["orange"], "powersgd": OKABE_ITO["green"]}

# Bytes the busiest rank sends per payload byte (predicted): the ring's 2(N-1)/N, the root's (N-1).
ALGORITHM_BYTES = {"ring": lambda n: ring_factor("all_reduce", n), "root": lambda n: float(n - 1)}
_FORMULA = {"ring": "2(N-1)/N·S", "root": "(N-1)·S"}


def bytes_per_rank(sent: Mapping[tuple[str, int], Sequence[float]], payload_bytes: float,
                   title: str | None = None) -> Figure:
    """sent: {(algorithm, N): bytes each of the N ranks sent}, algorithms "ring" and "root" (gather-to-root).
    Left: the busiest rank's MiB against N, with the formula up to N = 8; right: each rank's, at the largest N."""
    fig = new_figure(COLUMN_WIDTH_IN, 4.6, ncols=2)
    ax, ax2 = fig.axes
    algos = [a for a in ALGORITHM_BYTES if any(k[0] == a for k in sent)]
    s_mib = payload_bytes / MIB
    for name in algos:
        ns = sorted(n for a, n in sent if a == name)
        ax.plot(ns, [max(sent[name, n]) / MIB for n in ns], "o", color=ALGORITHM_COLORS[name], ms=9,
                label=f"{name}: measured (busiest rank)")
        grid = range(2, 9)
        ax.plot(grid, [ALGORITHM_BYTES[name](n) * s_mib for n in grid], "--", color=ALGORITHM_COLORS[name],
                label=f"{name}: formula {_FORMULA[name]} (predicted)")
    ax.set(xlabel="ranks taking part, N (count)", ylabel=f"MiB sent by the busiest rank (S = {s_mib:g} MiB)")
    ax.set_title(title or "Bytes: the root's grow with N, the ring's stay below 2S", fontsize="medium")
    n_max = max(n for _, n in sent)
    width = 0.8 / max(1, len(algos))
    for k, name in enumerate(algos):
        per_rank = sent.get((name, n_max), [])
        ax2.bar([r + (k - (len(algos) - 1) / 2) * width for r in range(len(per_rank))],
                [b / MIB for b in per_rank], width, color=ALGORITHM_COLORS[name], label=name)
    ax2.set(xticks=range(n_max), xticklabels=[f"rank {r}" for r in range(n_max)], xlabel="rank",
            ylabel="MiB sent (measured)")
    ax2.set_title(f"N = {n_max}: who sends the bytes", fontsize="medium")
    ax2.grid(alpha=0.3, axis="y")
    for a in (ax, ax2):
        a.legend(fontsize="small")
    ax.grid(alpha=0.3)
    return fig


def _median_step_ms(rec: Mapping[str, Any]) -> float:
    return rec["spread"]["step_ms"]["median"]


def compression_runs(records: Mapping[tuple[str, str], Mapping[str, Any]], predicted_bytes: Mapping[str, float],
                     link_ms: Mapping[str, float], slow: str = "slow link") -> Figure:
    """records: {(link, compression): run record} for "loopback" and `slow` (an emulated link).
    Top left: bytes per step, predicted and measured (log scale); top right: median step on each link,
    with the loopback step plus `link_ms` (the link's predicted time for each payload) as a black mark;
    below: the training loss per step on the slow link, mean over ranks."""
    comps = [c for c in COMPRESSION_COLORS if ("loopback", c) in records]
    colors = [COMPRESSION_COLORS[c] for c in comps]
    # two rows, not three panels in a row: 14 inches were shrunk to 60% in a laptop's notebook column
    fig = new_figure(COLUMN_WIDTH_IN, 7.0, mosaic="AB;CC")
    a1, a2, a3 = fig.axes
    xs = range(len(comps))
    a1.bar([x - 0.2 for x in xs], [predicted_bytes[c] for c in comps], 0.4, color="white", edgecolor="black",
           hatch=PREDICTED_HATCH, label="predicted")
    a1.bar([x + 0.2 for x in xs], [records["loopback", c]["summary"]["bytes_per_step"] for c in comps], 0.4,
           color=colors, label="measured")
    a1.set(yscale="log", xticks=list(xs), xticklabels=comps, xlabel="compression",
           ylabel="bytes all-reduced per step (B)")
    a1.set_title("Bytes per step", fontsize="medium")
    for k, where in enumerate(("loopback", slow)):
        if (where, comps[0]) not in records:
            continue
        hatched = is_emulated(records[where, comps[0]])
        a2.bar([x + (k - 0.5) * 0.4 for x in xs], [_median_step_ms(records[where, c]) for c in comps], 0.4,
               color=colors, alpha=0.55 if k else 1.0, edgecolor="black" if k else "white",
               hatch=EMULATED_HATCH if hatched else None, label=f"{where} (emulated)" if hatched else where)
    a2.plot([x + 0.2 for x in xs], [_median_step_ms(records["loopback", c]) + link_ms[c] for c in comps],
            "_", color="black", ms=22, mew=2.5, label="predicted: loopback step + link time")
    a2.set(xticks=list(xs), xticklabels=comps, xlabel="compression", ylabel="median step (ms)")
    a2.set_title("Step time", fontsize="medium")
    for c in comps:
        by_step: dict[int, list[float]] = {}
        for row in records.get((slow, c), records["loopback", c])["steps"]:
            by_step.setdefault(row["step"], []).append(row["loss"])
        steps = sorted(by_step)
        a3.plot(steps, [sum(by_step[s]) / len(by_step[s]) for s in steps], "o-", color=COMPRESSION_COLORS[c],
                label=c)
    a3.set(xlabel="measured step (index)", ylabel="training loss (mean over ranks)")
    a3.set_title(f"Loss per step ({slow})", fontsize="medium")
    for ax in (a1, a2, a3):
        ax.legend(fontsize="small")
        ax.grid(alpha=0.3)
    return fig


def break_even(records: Mapping[tuple[str, str], Mapping[str, Any]], predicted_bytes: Mapping[str, float],
               alpha_us: float, slow_gbps: float, slow: str = "slow link", world_size: int = 2,
               compressions: Sequence[str] = ("none", "powersgd"),
               links: Sequence[str] = ("10gbe", "100gbe", "infiniband", "nvlink")) -> Figure:
    """Predicted step against link bandwidth for each compression (the loopback step plus the alpha-beta
    ring time of its bytes, dashed), the measured step on the slow emulated link (open markers), and
    the named link presets (dotted) at the bandwidth they achieve, peak times efficiency: the one lesson
    07's break-even table uses (NVLink's 370 GB/s, not its 450 peak). Where two dashed lines cross is the
    break-even."""
    fig = new_figure(8, 4.2)
    ax = fig.axes[0]
    grid = [10 ** (-1.5 + 4.5 * i / 59) for i in range(60)]  # 0.03 .. 1000 GB/s
    for c in compressions:
        loop = _median_step_ms(records["loopback", c])
        color = COMPRESSION_COLORS[c]
        ax.plot(grid, [loop + 1e3 * alpha_beta_allreduce_s(predicted_bytes[c], world_size, alpha_us, g)
                       for g in grid], "--", color=color, label=f"{c}: predicted (loopback step + link)")
        if (slow, c) in records:
            ax.plot([slow_gbps], [_median_step_ms(records[slow, c])], "o", color=color, ms=9,
                    markerfacecolor="white", label=f"{c}: measured, {slow_gbps:g} GB/s (emulated)")
        ax.axhline(loop, color=color, lw=0.8, alpha=0.5)
    ax.set(xscale="log", xlabel="link bandwidth (GB/s, log scale)", ylabel="median step (ms)")
    top = ax.get_ylim()[1]
    for name in links:
        achieved_gbps = LINKS[name].gbps * LINKS[name].efficiency
        ax.axvline(achieved_gbps, color="grey", lw=0.8, ls=":")
        ax.text(achieved_gbps, top * 0.95, name, rotation=90, va="top", ha="right", fontsize="small")
    ax.set_title("Predicted step time against link bandwidth (thin lines: loopback alone)", fontsize="medium")
    ax.legend(fontsize="small", loc="center right")
    ax.grid(alpha=0.3)
    return fig
