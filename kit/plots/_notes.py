"""Notes beside points, placed so that none lies on another or on another point.

Matplotlib puts an annotation where it is told, so two points that nearly coincide (2 ranks on loopback
at 30 ms, 2 ranks on 10gbe at 30.5 ms) had their notes on top of each other. Here each note takes the
first place around its point, nearest first, where its box (estimated from its characters, before any
drawing) meets no note placed before it and no point's marker.
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Any, Sequence

if TYPE_CHECKING:
    from matplotlib.axes import Axes

__all__ = ["place_notes", "spread_apart"]

_CHAR_PT = 0.62  # of the font size: a character's width (DejaVu Sans, digits and '*')
_LINE_PT = 1.3  # of the font size: a line's height with its descent
_MARKER_PT = 3.5  # half a marker's box (6 pt markers)
_PAD_PT = 1.5  # between two boxes


def spread_apart(fracs: Sequence[float], gap: float, lo: float = 0.0, hi: float = 1.0) -> list[float]:
    """Positions (axes fractions), in the order given, at least `gap` apart and within [lo, hi]: moved down,
    highest first, then up from `lo` where that left them below it (five predictions ending together near the
    bottom had their notes moved down out of the axes). Where they do not fit at `gap`, spread evenly."""
    if len(fracs) > 1:
        gap = min(gap, (hi - lo) / (len(fracs) - 1))
    order = sorted(range(len(fracs)), key=lambda i: -fracs[i])
    out = list(fracs)
    above = hi + gap
    for i in order:
        out[i] = above = min(fracs[i], above - gap)
    below = lo - gap
    for i in reversed(order):
        out[i] = below = max(out[i], below + gap)
    return out


def _overlaps(a: tuple[float, float, float, float], b: tuple[float, float, float, float]) -> bool:
    return a[0] < b[2] + _PAD_PT and b[0] < a[2] + _PAD_PT and a[1] < b[3] + _PAD_PT and b[1] < a[3] + _PAD_PT


def place_notes(ax: Axes, notes: Sequence[tuple[float, float, str]], size_in: tuple[float, float],
                fontsize_pt: float = 7.0, colors: Sequence[str] | None = None, **text_kw: Any) -> list[Any]:
    """Annotate each (x, y, text) of `notes` (data coordinates, linear axes, limits already set) beside its point.

    `size_in`: the axes' width and height in inches, as the layout will about leave them (an estimate: a box
    is padded). The first free place of: right-above, right-below, left-above, left-below, then the same
    one line further out each time; where none is free, the nearest place (on another note, but beside its
    point). `colors`: one per note (its series'), so a note moved out still reads as its point's.
    Returns the annotations."""
    (x0, x1), (y0, y1) = ax.get_xlim(), ax.get_ylim()
    w_pt, h_pt = size_in[0] * 72, size_in[1] * 72

    def pt(x: float, y: float) -> tuple[float, float]:
        return (x - x0) / (x1 - x0) * w_pt, (y - y0) / (y1 - y0) * h_pt

    markers = [(px - _MARKER_PT, py - _MARKER_PT, px + _MARKER_PT, py + _MARKER_PT)
               for px, py in (pt(x, y) for x, y, _ in notes)]
    placed: list[tuple[float, float, float, float]] = []
    out = []
    for k, (x, y, text) in enumerate(notes):
        taken = placed + markers[:k] + markers[k + 1:]  # its own marker: the offsets keep off it
        px, py = pt(x, y)
        w, h = len(text) * _CHAR_PT * fontsize_pt, _LINE_PT * fontsize_pt
        for step in range(12):
            lift = step * (h + _PAD_PT)
            options = [(4, 2 + lift), (4, -2 - lift - h), (-4 - w, 2 + lift), (-4 - w, -2 - lift - h)]
            free = [(dx, dy) for dx, dy in options
                    if 0 <= px + dx and px + dx + w <= w_pt and 0 <= py + dy and py + dy + h <= h_pt
                    and not any(_overlaps((px + dx, py + dy, px + dx + w, py + dy + h), t) for t in taken)]
            if free:
                break
        if not free:  # nowhere free: beside the point, inside the axes where one of the nearest places is
            near = [(4, 2), (4, -2 - h), (-4 - w, 2), (-4 - w, -2 - h)]
            free = [(dx, dy) for dx, dy in near
                    if 0 <= px + dx and px + dx + w <= w_pt and 0 <= py + dy and py + dy + h <= h_pt] or near
        dx, dy = free[0]  # (the last attempt's place, 11 lines out, read as another point's note)
        placed.append((px + dx, py + dy, px + dx + w, py + dy + h))
        out.append(ax.annotate(text, (x, y), xytext=(dx, dy), textcoords="offset points", fontsize=fontsize_pt,
                               ha="left", va="bottom",
                               **({"color": colors[k]} if colors else {}), **text_kw))
    return out
