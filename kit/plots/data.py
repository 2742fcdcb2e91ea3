"""Data larger than memory: what reading a file through np.memmap costs, beside the in-memory copy.

Why two panels: the lesson has two claims. Left, memory: the ranks' extra RSS double-counts
the shared page cache, their extra PSS does not; an in-memory copy costs a full private copy
per rank (both bars reach world_size x the file). Right, time: epoch 0 reads from disk (cold),
epoch 1 from the page cache (warm), so "the second epoch is faster" is the OS, not the model.
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Any, Mapping

from kit.plots._style import COLUMN_WIDTH_IN, OKABE_ITO, new_figure, wrap

if TYPE_CHECKING:
    from matplotlib.figure import Figure

__all__ = ["memmap_memory"]


def memmap_memory(record: Mapping[str, Any], title: str | None = None) -> Figure:
    """Left: summed extra RSS and PSS per configuration, the file size (one copy) and the
    budget as lines. Right: thousands of samples/s per epoch, the page-cache fraction before it on top."""
    runs = list(record.get("runs") or [])
    fig = new_figure(width_in=COLUMN_WIDTH_IN, height_in=4.4, ncols=2)
    ax_mem, ax_t = fig.axes
    if not runs:
        for ax in fig.axes:
            ax.text(0.5, 0.5, "no runs in this record", ha="center", transform=ax.transAxes)
            ax.set_axis_off()
        return fig
    labels = [wrap(r.get("label", r.get("mode", "?")), 16) for r in runs]
    xs = list(range(len(runs)))
    w = 0.38
    ax_mem.bar([x - w / 2 for x in xs], [r["sum_extra_rss_mib"] for r in runs], w, color=OKABE_ITO["orange"],
               label="extra RSS, ranks together (peak)")
    ax_mem.bar([x + w / 2 for x in xs], [r["sum_extra_pss_mib"] for r in runs], w, color=OKABE_ITO["blue"],
               label="extra PSS, ranks together (peak)")
    file_mib = float(record.get("file", {}).get("mib", 0.0))
    ax_mem.axhline(file_mib, color=OKABE_ITO["black"], linestyle="--", linewidth=1,
                   label=f"the file, one copy ({file_mib:.0f} MiB)")
    budget = (record.get("config") or {}).get("budget_mb")
    if budget:
        ax_mem.axhline(float(budget), color=OKABE_ITO["vermillion"], linestyle=":", linewidth=1.5,
                       label=f"budget ({float(budget):.0f} MiB)")
    ax_mem.set_xticks(xs, labels)
    ax_mem.set_ylabel("MiB above the ranks' level\nbefore opening the data")
    ax_mem.set_title("memory (peak during the epochs)", fontsize="medium")
    top = max([r["sum_extra_rss_mib"] for r in runs] + [r["sum_extra_pss_mib"] for r in runs]
              + [file_mib, float(budget or 0.0)])
    ax_mem.set_ylim(0, 1.45 * top)  # headroom: the legend sits above the bars, never on them
    ax_mem.legend(fontsize="small", loc="upper left")

    n_ep = max(len(r["epochs"]) for r in runs)
    ew = 0.8 / n_ep
    colors = (OKABE_ITO["sky"], OKABE_ITO["green"], OKABE_ITO["purple"], OKABE_ITO["grey"])
    for e in range(n_ep):
        pos = [x - 0.4 + ew * (e + 0.5) for x in xs]
        # thousands: a plain "1e6" offset above the axis ran into the panel's title
        vals = [r["epochs"][e]["samples_per_s"] / 1e3 if e < len(r["epochs"]) else 0.0 for r in runs]
        kind = "cold" if e == 0 else "warm"
        bars = ax_t.bar(pos, vals, ew, color=colors[min(e, len(colors) - 1)], label=f"epoch {e}")
        for b, r in zip(bars, runs):
            if e >= len(r["epochs"]):
                continue
            cached = r["epochs"][e].get("cached_before")
            tag = kind if r.get("mode") == "memmap" else "RAM"
            # "100% cached" was wider than its bar and ran over the next bar's note: the title says "cached"
            text = tag if cached is None else f"{tag}\n{100 * cached:.0f}%"
            ax_t.annotate(text, (b.get_x() + b.get_width() / 2, b.get_height()), ha="center", va="bottom",
                          fontsize="x-small")
    ax_t.set_xticks(xs, labels)
    ax_t.set_xlabel("configuration")
    ax_mem.set_xlabel("configuration")
    ax_t.set_ylabel("thousand samples/s, all ranks")
    ax_t.set_title("throughput per epoch (on top: % of the file\nin the page cache before it)", fontsize="medium")
    ax_t.legend(fontsize="small", loc="upper left")
    ax_t.margins(y=0.6)  # headroom: the bars' two-line notes stay below the legend
    cfg = record.get("config") or {}
    fig.suptitle(title or f"{file_mib:.0f} MiB file on {cfg.get('world_size', '?')} ranks, "
                 f"{record.get('file', {}).get('fs_type', '?')}")  # above the "medium" panel titles, not under them
    return fig
