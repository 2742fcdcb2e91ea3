"""Collective bandwidth against message size, with the alpha-beta model drawn through it.

Why bandwidth and not time on y: small messages are latency-bound (bandwidth climbs with size),
large ones hit the link (bandwidth flattens at beta). The fitted curve
t(n) = alpha + n / beta, turned into bandwidth n / t(n), shows both regimes and where
bucketing gradients starts to pay. A residual panel underneath shows, per size, how far the
measured time is from the fitted line (in %): where it is large, the alpha-beta model does not
describe this link (protocol switches, caches, a busy machine) and predictions there are rough.
"""
from __future__ import annotations

from statistics import median
from typing import TYPE_CHECKING, Any, Mapping, Sequence

from kit.plots._style import SERIES, add_marking_legend, new_figure
from kit.units import GIB, MIB

if TYPE_CHECKING:
    from matplotlib.figure import Figure

__all__ = ["bandwidth", "alpha_beta_bw_gbps"]


def alpha_beta_bw_gbps(n_bytes: float, alpha_us: float, beta_gbps: float) -> float:
    """Algorithm bandwidth (GB/s) the alpha-beta model predicts for an n-byte message."""
    t_s = alpha_us * 1e-6 + n_bytes / (beta_gbps * 1e9)
    return n_bytes / t_s / 1e9 if t_s > 0 else 0.0


def _fmt_bytes(n: float) -> str:
    for unit, size in (("GiB", GIB), ("MiB", MIB), ("KiB", 2**10)):
        if n >= size:
            return f"{n / size:g} {unit}"
    return f"{n:g} B"


def _fit_line(ax: Any, rec: Mapping[str, Any], pts: list[Mapping[str, Any]], sizes: list[float], metric: str,
              color: str) -> Any | None:
    """The alpha-beta fit through one record's points (scaled to busbw by the measured busbw/algbw)."""
    fit = rec.get("fit") or {}
    if not fit.get("beta_gbps"):
        return None
    ratio = 1.0
    if metric == "busbw":
        ratios = [p["busbw_gbps"] / p["algbw_gbps"] for p in pts if p.get("algbw_gbps")]
        ratio = median(ratios) if ratios else 1.0
    grid = [sizes[0] * (sizes[-1] / sizes[0]) ** (k / 63) for k in range(64)]
    fy = [ratio * alpha_beta_bw_gbps(n, float(fit.get("alpha_us") or 0.0), float(fit["beta_gbps"])) for n in grid]
    # beta is the payload's rate (t = alpha + n / beta); on a busbw axis the line levels at ratio x beta, which
    # the label gives where it differs (all_gather on 2 ranks: "beta=1.28 GB/s" over a line that levels at 0.64)
    busbw = f" (busbw {ratio * float(fit['beta_gbps']):.2f})" if metric == "busbw" and abs(ratio - 1) > 0.01 else ""
    (line,) = ax.plot(grid, fy, color=color, linestyle="--", linewidth=1.2,
                      label=f"alpha-beta fit: alpha={fit.get('alpha_us', 0):.0f} us, "
                            f"beta={fit['beta_gbps']:.2f} GB/s{busbw}, residuals up to "
                            f"{max((abs(r) for r in fit.get('residuals_pct') or [0.0])):.0f}%")
    return line


def _plot_record(ax: Any, rax: Any, rec: Mapping[str, Any], metric: str, color: str) -> list[Any]:
    """One record: its measured points, its fit, its residuals below; the legend handles."""
    pts = sorted(rec.get("points") or [], key=lambda p: p["bytes"])
    if not pts:
        return []
    sizes = [float(p["bytes"]) for p in pts]
    emulated = bool(rec.get("emulated"))
    name = f"{rec.get('op', '?')}, {rec.get('world_size', '?')} ranks, " \
           f"{rec.get('backend', '')}" + (" (emulated)" if emulated else "")
    (points,) = ax.plot(sizes, [float(p[f"{metric}_gbps"]) for p in pts], marker="o", color=color,
                        linestyle="none", markerfacecolor="white" if emulated else color, label=name)
    handles = [points]
    fitted = _fit_line(ax, rec, pts, sizes, metric, color)
    if fitted is not None:
        handles.append(fitted)
    res = (rec.get("fit") or {}).get("residuals_pct") or []
    if len(res) == len(rec.get("points") or []):
        by_size = sorted(zip((float(p["bytes"]) for p in rec["points"]), res))
        rax.plot([b for b, _ in by_size], [r for _, r in by_size], marker="o", color=color,
                 linestyle="-", linewidth=0.8, markerfacecolor="white" if emulated else color)
    return handles


def _style_axes(ax: Any, rax: Any, metric: str, title: str | None) -> None:
    rax.axhline(0.0, color="black", linewidth=0.8)
    rax.set_ylabel("fit residual (%)", fontsize="small")
    rax.set_xlabel("message size (bytes, log scale)")
    rax.grid(alpha=0.3)
    rax.spines[["top", "right"]].set_visible(False)
    ax.set_xscale("log", base=2)
    ticks = [t for t in (2.0**k for k in range(0, 41, 4))
             if ax.dataLim.x0 / 2 <= t <= ax.dataLim.x1 * 2]
    if ticks:
        rax.set_xticks(ticks, [_fmt_bytes(t) for t in ticks])
        ax.minorticks_off()
        rax.minorticks_off()
    ax.tick_params(labelbottom=False)
    ax.set_ylabel(f"{metric} (GB/s)")
    ax.set_ylim(bottom=0)
    ax.grid(alpha=0.3)
    ax.spines[["top", "right"]].set_visible(False)
    ax.set_title(title or f"Collective {metric} vs message size: latency-bound to bandwidth-bound")


def bandwidth(records: Sequence[Mapping[str, Any]] | Mapping[str, Any], metric: str = "busbw",
              title: str | None = None) -> Figure:
    """Measured `busbw` (or `algbw`) in GB/s vs message size (log x), one line per record.

    The fit line is the alpha-beta model's algbw, scaled by the record's measured
    busbw/algbw ratio when `metric="busbw"` (that ratio is fixed per collective, e.g.
    2(n-1)/n for all_reduce). Emulated records are hollow and say so in the legend.
    The second axes (`fig.axes[1]`) draws the fit's residuals (% of measured time) per size.
    """
    from matplotlib.lines import Line2D

    recs = [records] if isinstance(records, Mapping) else list(records)
    fig = new_figure(width_in=8.0, height_in=5.6, mosaic="F;R", sharex=True, gridspec_kw={"height_ratios": [3, 1]})
    ax, rax = fig.axes
    handles: list[Any] = []
    for i, rec in enumerate(recs):
        handles += _plot_record(ax, rax, rec, metric, SERIES[i % len(SERIES)])
    _style_axes(ax, rax, metric, title)
    if any(r.get("emulated") for r in recs):
        handles.append(Line2D([], [], linestyle="none", marker="o", markerfacecolor="white",
                              markeredgecolor="black", label="hollow: emulated link"))
    # measured points at 1 MiB and up can sit under the legend's long fit lines (lesson 01: a broadcast point
    # under "residuals up to 46%"): a white, slightly see-through box keeps the text readable over them
    add_marking_legend(ax, handles, loc="upper left", frameon=True, framealpha=0.8, facecolor="white",
                       edgecolor="none")
    return fig
