"""The lab bench's results table and its JSONL file.

Why HTML and JSONL: an `HTML` widget renders the same in ipywidgets 7 and 8 (no data-grid
extension to install), and JSONL is what `kit.experiments` appends to, so a saved bench
session and a results file written by `run(..., results_path=...)` load the same way.
"""
from __future__ import annotations

import html
import json
from pathlib import Path
from typing import Any, Callable, Iterable, Mapping, Sequence, TypeGuard

__all__ = ["records_html", "save_jsonl", "load_records", "failure_html", "esc", "COLUMNS"]


def _num(fmt: str) -> Callable[[Any], str]:
    return lambda v: "" if v is None else format(v, fmt)


def _step_spread(rec: Mapping[str, Any]) -> Any:
    """(median, IQR) of the step time (kit.run/2), or the mean alone for older records."""
    st = (rec.get("spread") or {}).get("step_ms")
    if st:
        return (st["median"], st["iqr"])
    return (rec.get("summary") or {}).get("step_ms")


def _center(rec: Mapping[str, Any], key: str, timed_only: bool = False) -> Any:
    """The record's median of `key`; None (an empty cell) without steps, or for a phase field of a run
    whose phases were not timed (instrument=False: zeros there are not measurements)."""
    from kit.experiments.record_readers import phases_timed, run_center

    if timed_only and not phases_timed(rec):
        return None
    return run_center(rec).get(key) if rec.get("summary") or rec.get("steps") else None


def _pm(v: Any) -> str:
    if v is None:
        return ""
    if isinstance(v, (tuple, list)):
        return f"{v[0]:.1f} ± {v[1]:.1f}"
    return f"{v:.1f} (mean)"


def _bubble(p: Any) -> str:
    if not p:
        return ""
    return f"{100 * p['measured']:.0f} ({100 * p['formula']:.0f})"


Where = tuple[str, str] | Callable[[Mapping[str, Any]], Any]

# (header, where the value lives, formatter). Units are in the headers.
COLUMNS: tuple[tuple[str, Where, Callable[[Any], str]], ...] = (
    ("label", ("", "label"), str),
    ("ranks", ("config", "world_size"), str),
    ("batch", ("config", "batch_size"), str),
    ("prec.", ("config", "precision"), str),
    ("bucket MiB", ("config", "bucket_cap_mb"), _num("g")),
    ("accum", ("config", "grad_accum_steps"), str),
    ("ckpt", ("config", "activation_checkpointing"), lambda v: "yes" if v else ""),
    ("link", ("config", "interconnect"), lambda v: v or "loopback"),
    ("m", ("config", "micro_batches"), str),
    ("schedule", ("config", "schedule"), str),
    ("v", ("config", "virtual_stages"), str),
    # Median ± IQR over the measured steps: one number alone hides how much runs wobble.
    ("step ms (median ± IQR)", _step_spread, _pm),
    # The same center the plots draw (medians over the steps), so a row and its plot agree: the
    # record's `summary` holds means (mean exposed / mean step), which one slow step pulls away.
    ("exposed comm %", lambda r: _center(r, "comm_overhead_pct", timed_only=True), _num(".1f")),
    ("samples/s", lambda r: _center(r, "throughput_samples_s"), _num(".0f")),
    ("peak MiB", ("summary", "peak_mib"), _num(".0f")),
    ("final loss", ("summary", "loss_final"), _num(".3f")),
    # pipelines: the measured bubble beside its formula, (p-1)/(m+p-1) or (p-1)/(v m+p-1) interleaved
    ("bubble % (formula)", lambda r: r.get("pipeline") or None, _bubble),
)

_STYLE = ("<style>.kit-runs td,.kit-runs th{padding:2px 6px;text-align:right;"
          "font-size:12px;white-space:nowrap}.kit-runs td:nth-child(2),.kit-runs th:nth-child(2)"
          "{text-align:left}.kit-runs tr:nth-child(even){background:rgba(127,127,127,.08)}"
          "</style>")


def _get(rec: Mapping[str, Any], where: Where) -> Any:
    if callable(where):
        return where(rec)
    section, key = where
    src = rec if not section else (rec.get(section) or {})
    return src.get(key)


def _is_config(where: Where) -> TypeGuard[tuple[str, str]]:
    return not callable(where) and where[0] == "config"


def _unused(rec: Mapping[str, Any], where: Where) -> bool:
    """A config knob this run's strategy does not use (a tp run's pipeline schedule): its cell stays
    empty, not the default that meant nothing. The ranks column always shows (a mesh sets it)."""
    from kit.widgets.relevance import shown

    cfg = rec.get("config") or {}
    return _is_config(where) and where[1] != "world_size" and bool(cfg) and not shown(where[1], cfg)


def records_html(records: Sequence[Mapping[str, Any]]) -> str:
    """An HTML table with one row per run, newest last; emulated runs and runs stopped
    mid-way are tagged."""
    if not records:
        return "<i>No runs yet: press Run or Sweep; finished runs appear here.</i>"
    # Config columns appear only when they differ between runs: the label already names the
    # configuration, so the table stays narrow and the knob that changed stands out.
    # Metric columns with no value in any run (peak MiB on CPU) are left out too.
    cols = [c for c in COLUMNS
            if (_is_config(c[1]) and len({repr(_get(r, c[1])) for r in records}) > 1)
            or (not _is_config(c[1]) and any(_get(r, c[1]) is not None for r in records))]
    head = "".join(f"<th>{html.escape(h)}</th>" for h, _, _ in cols)
    rows = []
    for i, rec in enumerate(records, 1):
        cells = []
        for h, where, fmt in cols:
            try:
                text = "" if _unused(rec, where) else fmt(_get(rec, where))
            except (TypeError, ValueError):
                text = str(_get(rec, where))
            if h == "label" and rec.get("emulated"):
                text += " [emulated]"
            if h == "label" and rec.get("complete", True) is False:
                text += " [stopped: incomplete, not plotted]"
            cells.append(f"<td>{html.escape(text)}</td>")
        rows.append(f"<tr><td>{i}</td>{''.join(cells)}</tr>")
    return (f"{_STYLE}<div style='max-height:220px;overflow:auto'><table class='kit-runs'>"
            f"<tr><th>#</th>{head}</tr>{''.join(rows)}</table></div>")


def save_jsonl(records: Iterable[Mapping[str, Any]], path: str | Path) -> int:
    """Write records, one JSON object a line (overwrites); returns how many were written."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    n = 0
    with path.open("w", encoding="utf-8") as fh:
        for rec in records:
            fh.write(json.dumps(rec) + "\n")
            n += 1
    return n


def load_records(path: str | Path) -> list[dict[str, Any]]:
    """Run records from a JSONL file (other schemas, e.g. collectives, are skipped).

    Uses `kit.experiments.load_jsonl` when the engine provides it, so both read alike.
    """
    try:
        from kit.experiments import load_jsonl
    except ImportError:
        load_jsonl = None
    if load_jsonl is not None:
        recs = list(load_jsonl(path))
    else:
        text = Path(path).read_text(encoding="utf-8")
        recs = [json.loads(line) for line in text.splitlines() if line.strip()]
    return [r for r in recs if str(r.get("schema", "kit.run/1")).startswith("kit.run/")]


def esc(text: str) -> str:
    """HTML-escape text content (quotes may stay readable)."""
    return html.escape(text, quote=False)


def failure_html(label: str, exc: BaseException) -> str:
    """A failed run, one line first; the traceback folded into <details> for who wants it."""
    import traceback

    tb = "".join(traceback.format_exception(type(exc), exc, exc.__traceback__))
    said = str(exc)
    if not said.startswith(f"{type(exc).__name__}:"):  # a CellError's text already starts with its name
        said = f"{type(exc).__name__}: {said}"
    return (f"Run <b>{esc(label)}</b> failed: {esc(said)}"
            f"<details><summary>details</summary><pre style='font-size:11px'>{esc(tb)}</pre>"
            "</details>")
