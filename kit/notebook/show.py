"""How a `%%distributed` cell's result appears in the notebook: values per rank, notes, HTML,
figures, a rank's live display(obj), and the failure (kit/notebook/magics.py runs the cell)."""
from __future__ import annotations

import sys
from typing import Any

from IPython.core.error import UsageError

from kit.engine.output import CellResult
from kit.engine.output import print_line as _emit
from kit.errors import CellError

__all__ = ["show_result", "show_display"]


def show_result(result: CellResult, expect_error: bool = False) -> None:
    """Each rank's value (once if all agree), notes, HTML and figures; then the failure: raised as
    CellError (Run All stops), or printed when the cell was expected to fail."""
    from IPython.display import HTML, Image, display

    reprs = result.reprs
    if reprs:
        if len(set(reprs.values())) == 1 and len(reprs) > 1:
            _emit_value("ranks " + ",".join(map(str, sorted(reprs))), next(iter(reprs.values())))
        else:
            for r, text in sorted(reprs.items()):
                _emit_value(f"rank {r}", text)
    for r, rep in sorted(result.replies.items()):
        note = (rep.get("value") or {}).get("note")
        if note:
            _emit(-1, "stderr", f"rank {r}: {note}")
        if (rep.get("value") or {}).get("html") and len(result.replies) == 1:
            display(HTML(rep["value"]["html"]))
    for r, images in sorted(result.figures.items()):
        for png in images:
            print(f"[rank {r}] figure:")
            display(Image(data=png))
    if result.failures and expect_error:
        sys.stdout.write("\n".join(CellError(result.failures, result.notes)._render_traceback_()) + "\n")
        sys.stdout.flush()
        _emit(-1, "stdout", "this cell failed as expected (--expect-error); the ranks and their variables are kept")
        return
    if result.failures:
        raise CellError(result.failures, result.notes)
    if expect_error:
        raise UsageError("--expect-error: the cell was expected to fail on some rank, but it succeeded everywhere")
    live = {text for rep in result.replies.values() for text in rep.get("notes") or ()}  # already on stderr
    for text in result.notes:
        if text not in live:
            _emit(-1, "stderr", text.removeprefix("[kit] "))


def show_display(rank: int, bundle: dict[str, Any]) -> None:
    """A rank's display(obj), shown live under a rank label."""
    import base64

    from IPython.display import display

    sys.stdout.write(f"[rank {rank}] display:\n")
    sys.stdout.flush()
    data = {k: base64.b64encode(v).decode() if isinstance(v, bytes) else v for k, v in bundle.items()}
    display(data, raw=True)  # a Jupyter mime bundle: binary data travels base64-encoded


def _emit_value(label: str, text: str) -> None:
    sys.stdout.write(f"[{label}] Out: {text}\n")
