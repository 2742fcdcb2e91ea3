"""Shared look and record helpers for the kit's plots.

Why one place: every plot must use the same colour for the same quantity (forward is always
blue, exposed communication always vermillion), mark emulated or predicted numbers the same
way, and read run records the same way, or readers compare the wrong things across figures.
"""
from __future__ import annotations

import sys

from typing import TYPE_CHECKING, Any, Iterable, Mapping, Sequence, TypeVar

from kit.experiments.record_readers import run_spread

if TYPE_CHECKING:  # matplotlib is imported lazily so `import kit.plots` stays cheap.
    from matplotlib.axes import Axes
    from matplotlib.figure import Figure

__all__ = [
    "OKABE_ITO",
    "COLORS",
    "EMULATED_HATCH",
    "PREDICTED_HATCH",
    "new_figure",
    "COLUMN_WIDTH_IN",
    "whisker_note",
    "is_emulated",
    "add_marking_legend",
    "knob_value",
    "wrap",
    "event_color",
    "last_record",
    "newest",
    "comm_report",
]

_T = TypeVar("_T")

# Okabe & Ito (2008), "Color Universal Design": distinguishable with every common colour-vision
# deficiency. Black is kept for reference lines (ideal, formula, measured totals).
OKABE_ITO: dict[str, str] = {
    "orange": "#E69F00",
    "sky": "#56B4E9",
    "green": "#009E73",
    "yellow": "#F0E442",
    "blue": "#0072B2",
    "vermillion": "#D55E00",
    "purple": "#CC79A7",
    "black": "#000000",
    "grey": "#999999",
}

# One colour per quantity, used by every figure.
COLORS: dict[str, str] = {
    "fwd": OKABE_ITO["blue"],
    "bwd": OKABE_ITO["sky"],
    "opt": OKABE_ITO["green"],
    "comm_overlap": OKABE_ITO["orange"],
    "comm_exposed": OKABE_ITO["vermillion"],
    "other": OKABE_ITO["grey"],
    "params": OKABE_ITO["blue"],
    "grads": OKABE_ITO["sky"],
    "optimizer": OKABE_ITO["green"],
    "activations": OKABE_ITO["orange"],
    "compute": OKABE_ITO["blue"],
    "comm": OKABE_ITO["vermillion"],
    "idle": OKABE_ITO["grey"],
}

SERIES: tuple[str, ...] = (
    OKABE_ITO["blue"], OKABE_ITO["vermillion"], OKABE_ITO["green"], OKABE_ITO["orange"],
    OKABE_ITO["purple"], OKABE_ITO["sky"], OKABE_ITO["yellow"], OKABE_ITO["black"],
)

EMULATED_HATCH = "//"   # numbers shaped by the virtual interconnect (injected link delay)
PREDICTED_HATCH = ".."  # numbers from a formula, not a measurement

# The widest a figure is drawn: 960 px at 100 dpi, shown at about 90% in a laptop's ~850 px notebook column
# (at 11 in it showed at 77%, its text too small). Crowded figures grow taller instead.
COLUMN_WIDTH_IN = 9.6



def new_figure(width_in: float = 8.0, height_in: float = 4.2, ncols: int = 1, mosaic: str | None = None,
               **mosaic_kw: Any) -> Figure:
    """A pyplot-free Figure sized for a laptop notebook column (about 800 px at 100 dpi).

    pyplot keeps global state and, from a widget's worker thread, may try to open a GUI
    window; `Figure()` does neither and can be saved to PNG bytes from any thread.
    Axes: one row of `ncols`, or a layout drawn as text, e.g. `mosaic="AB;CC"` (two panels above one
    that spans the row below), with matplotlib's `subplot_mosaic` keywords (`sharex`, `gridspec_kw`);
    `fig.axes` lists them row by row, by their top-left cell.
    """
    from matplotlib.figure import Figure

    fig = Figure(figsize=(width_in, height_in), dpi=100, layout="constrained")
    if mosaic is None:
        fig.subplots(1, ncols, squeeze=False)
    else:
        fig.subplot_mosaic(mosaic, **mosaic_kw)
    _show_inline_in_ipython()
    return fig


def _figure_png(fig: Any) -> bytes:
    import io

    buf = io.BytesIO()
    fig.savefig(buf, format="png", bbox_inches="tight")
    return buf.getvalue()


def _show_inline_in_ipython() -> None:
    """Make a returned Figure display as a picture in a notebook, as pyplot figures do.

    IPython draws Figures only once pyplot's inline backend is active; ours never touch pyplot,
    so without this a fresh kernel shows just "<Figure size 800x420 with 1 Axes>".
    """
    shell_module = sys.modules.get("IPython")
    shell = shell_module.get_ipython() if shell_module is not None else None  # type: ignore[attr-defined]
    if shell is None:
        return
    # A deferred printer: if the inline backend already registered one for Figure, that one wins.
    shell.display_formatter.formatters["image/png"].for_type_by_name("matplotlib.figure", "Figure", _figure_png)


def whisker_note(records: Sequence[Mapping[str, Any]], key: str = "step_ms") -> str | None:
    """The legend text for the whiskers drawn from these records, or None if none have any,
    e.g. "median; whiskers: IQR of steps / min-max of 3-5 repeats"."""
    kinds: dict[str, list[int]] = {}
    for rec in records:
        sp = run_spread(rec, key)
        if sp is not None:
            n = int(rec["repeat_spread"][key]["n"]) if sp[3] == "repeats" else 0
            kinds.setdefault(sp[3], []).append(n)
    if not kinds:
        return None
    parts = ["IQR of steps"] if "steps" in kinds else []
    if "repeats" in kinds:
        lo, hi = min(kinds["repeats"]), max(kinds["repeats"])
        parts.append(f"min-max of {lo if lo == hi else f'{lo}-{hi}'} repeats")
    return "median; whiskers: " + " / ".join(parts)


def is_emulated(record: Mapping[str, Any]) -> bool:
    """True when a virtual interconnect added delay, so the numbers are not a real network's."""
    return bool(record.get("emulated"))


def knob_value(record: Mapping[str, Any], knob: str) -> Any:
    """The value of `knob` in the record's config (also looks in `env`, e.g. backend)."""
    cfg = record.get("config") or {}
    if knob in cfg:
        return cfg[knob]
    return (record.get("env") or {}).get(knob)


def add_marking_legend(ax: Axes, handles: list[Any], emulated: bool = False,
                       predicted: bool = False, **legend_kw: Any) -> None:
    """A legend whose last entries explain the hatching, so no marked bar goes unexplained."""
    from matplotlib.patches import Patch

    extra = []
    if emulated:
        extra.append(Patch(facecolor="white", edgecolor="black", hatch=EMULATED_HATCH,
                           label="emulated link (virtual interconnect)"))
    if predicted:
        extra.append(Patch(facecolor="white", edgecolor="black", hatch=PREDICTED_HATCH,
                           label="predicted (formula)"))
    legend_kw.setdefault("fontsize", "small")
    legend_kw.setdefault("frameon", False)
    ax.legend(handles=list(handles) + extra, **legend_kw)


def numeric(values: Iterable[Any]) -> bool:
    """True when every value is a real number (bools excluded: they are categories)."""
    return all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in values)


def wrap(label: str, width: int = 16) -> str:
    """Break a long run label onto lines so x tick labels never collide or need rotating.

    A line break the label has is kept, and a number stays on the line of its unit ("cap 25 MiB"
    never ends a line with "25" and starts the next with "MiB)").
    """
    import re
    import textwrap

    # a no-break space between a number and its unit: textwrap never splits there
    glued = re.sub(r"(?<![\w.])(\d+(?:\.\d+)?) (?=(?:[KMGT]i?B|B|[GM]b|ms|us|µs|s|%)(?![\w]))",
                   "\\1\u00a0", label)
    lines = [ln for part in glued.split("\n")
             for ln in (textwrap.wrap(part, width, break_long_words=True) or [part])]
    return "\n".join(lines).replace("\u00a0", " ") or label


# A mesh's data dimension gets its own colour, so "pp send" and "dp all_reduce" (or "tp all_reduce" and
# "fsdp all_gather") differ in the bars and in the legend; the dimension that splits the model keeps "comm".
_DIM_COLORS = {"dp": OKABE_ITO["purple"], "fsdp": OKABE_ITO["green"]}


def event_color(ev: Mapping[str, Any]) -> str:
    kind = ev.get("kind", "compute")
    dim = str(ev.get("name", "")).split(" ", 1)[0]
    return _DIM_COLORS.get(dim, COLORS["comm"]) if kind == "comm" else COLORS.get(kind, COLORS["other"])


def newest(items: Sequence[_T], max_runs: int | None) -> tuple[list[_T], str]:
    """The newest `max_runs` items (all when None) and what a title says of them: "per configuration"
    when all are drawn, else "last 3 of 7 runs", so no run disappears without a word."""
    total = len(items)
    kept = list(items)[-max_runs:] if max_runs is not None and total > max_runs else list(items)
    return kept, "per configuration" if len(kept) == total else f"last {len(kept)} of {total} runs"


def comm_report(rec: Mapping[str, Any]) -> Mapping[str, Any]:
    """The record's per-collective report (`comm.report`: tp, sp, cp, ep and meshes), {} without one."""
    return (rec.get("comm") or {}).get("report") or {}


def last_record(records: Any, plot: str) -> Mapping[str, Any]:
    """One run record: the record itself, or the last of a list (the other plots take lists)."""
    if isinstance(records, Mapping):
        return records
    recs = list(records) if isinstance(records, Sequence) and not isinstance(records, str) else None
    if not recs or not isinstance(recs[-1], Mapping):
        raise TypeError(f"{plot} draws one run record (the dict kit.experiments.run returns), "
                        f"got {type(records).__name__}: {str(records)[:60]!r}")
    return recs[-1]
