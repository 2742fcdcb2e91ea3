"""Worker side: run one cell's source in the rank's persistent namespace.

Owns compiling (so tracebacks show the cell's own line numbers), the value of the last
expression, tracebacks trimmed to the user's frames, and figures made with pyplot.
Never imports IPython or matplotlib itself: figures are collected only when the cell
already imported pyplot.
"""
from __future__ import annotations

import ast
import io
import linecache
import pickle
import sys
import traceback
from types import TracebackType
from typing import Any

__all__ = ["NO_VALUE", "mime_bundle", "execute", "cell_filename", "format_exception", "cell_line", "pack_value", "collect_figures"]

NO_VALUE = object()
MAX_VALUE_BYTES = 64 << 20  # bigger results are shown as a repr, not shipped
MAX_REPR_CHARS = 10_000


def cell_filename(number: int) -> str:
    return f"<cell {number}>"


def execute(source: str, ns: dict[str, Any], filename: str) -> Any:
    """Exec the cell; return the value of a trailing expression, or NO_VALUE."""
    linecache.cache[filename] = (len(source), None, source.splitlines(True), filename)
    tree = ast.parse(source, filename, "exec")
    last: ast.Expression | None = None
    if tree.body and isinstance(tree.body[-1], ast.Expr):
        last = ast.Expression(tree.body.pop().value)
    exec(compile(tree, filename, "exec"), ns)
    if last is None:
        return NO_VALUE
    return eval(compile(last, filename, "eval"), ns)


def _user_tb(tb: TracebackType | None) -> TracebackType | None:
    """Drop the kit's own frames above the first cell frame."""
    first = tb
    while first is not None and not first.tb_frame.f_code.co_filename.startswith("<cell"):
        first = first.tb_next
    return first or tb


_KIT_DIR = __file__.rsplit("/", 1)[0] + "/"


def format_exception(exc: BaseException) -> str:
    """The user's frames only: the kit's frames above and below the cell are dropped."""
    if isinstance(exc, SyntaxError):
        return "".join(traceback.format_exception_only(type(exc), exc))
    te = traceback.TracebackException(type(exc), exc, _user_tb(exc.__traceback__))
    frames = list(te.stack)
    while len(frames) > 1 and frames[-1].filename.startswith(_KIT_DIR) and not frames[0].filename.startswith(_KIT_DIR):
        frames.pop()  # the collective wrapper that raised on the user's behalf
    te.stack = traceback.StackSummary.from_list(frames)
    return "".join(te.format())


def cell_line(exc: BaseException) -> int | None:
    """The innermost line of the cell that the exception passed through."""
    if isinstance(exc, SyntaxError) and str(exc.filename or "").startswith("<cell"):
        return exc.lineno
    line = None
    tb = exc.__traceback__
    while tb is not None:
        if tb.tb_frame.f_code.co_filename.startswith("<cell"):
            line = tb.tb_lineno
        tb = tb.tb_next
    return line


def _short_repr(value: Any) -> str:
    try:
        text = repr(value)
    except Exception as e:  # a broken __repr__ must not fail the cell
        text = f"<repr failed: {type(e).__name__}: {e}>"
    if len(text) > MAX_REPR_CHARS:
        text = text[:MAX_REPR_CHARS] + f"... [{len(text) - MAX_REPR_CHARS} more characters]"
    return text


def pack_value(value: Any) -> dict[str, Any]:
    """Pickle the value for the kernel if it can travel; always include a text repr."""
    out: dict[str, Any] = {"repr": _short_repr(value), "pickle": None, "note": None}
    html = getattr(value, "_repr_html_", None)
    if callable(html):
        try:
            out["html"] = html()
        except Exception:
            pass
    try:
        data = pickle.dumps(value, protocol=pickle.HIGHEST_PROTOCOL)
    except Exception as e:
        out["note"] = f"the value could not be sent to the kernel ({type(e).__name__}: {e}); showing its repr"
        return out
    if len(data) > MAX_VALUE_BYTES:
        out["note"] = (
            f"the value is {len(data) / 2**20:.0f} MiB pickled, over the {MAX_VALUE_BYTES >> 20} MiB limit; "
            "showing its repr (keep big tensors on the ranks, or pull a slice)"
        )
        return out
    out["pickle"] = data
    return out


def _png(fig: Any) -> bytes:
    buf = io.BytesIO()
    fig.savefig(buf, format="png", bbox_inches="tight")
    return buf.getvalue()


def mime_bundle(obj: Any) -> dict[str, Any]:
    """What `display(obj)` on a rank sends: text always; PNG for figures and `_repr_png_`; HTML."""
    bundle: dict[str, Any] = {"text/plain": _short_repr(obj)}
    if type(obj).__module__.startswith("matplotlib.figure") and hasattr(obj, "savefig"):
        bundle["image/png"] = _png(obj)
        plt = sys.modules.get("matplotlib.pyplot")
        if plt is not None:
            plt.close(obj)  # shown now; not again at the end of the cell
    for method, mime in (("_repr_png_", "image/png"), ("_repr_html_", "text/html")):
        fn = getattr(obj, method, None)
        if mime not in bundle and callable(fn):
            try:
                data = fn()
            except Exception:
                data = None
            if data:
                bundle[mime] = data
    return bundle


def collect_figures() -> list[bytes]:
    """PNG bytes of every open pyplot figure, then close them (as inline backends do)."""
    plt = sys.modules.get("matplotlib.pyplot")
    if plt is None:
        return []
    images = []
    for num in plt.get_fignums():
        try:
            images.append(_png(plt.figure(num)))
        except Exception as e:  # one bad figure should not hide the others
            print(f"[kit] could not render figure {num}: {e}", file=sys.stderr)
    plt.close("all")
    return images
