"""Worker side: run one cell's source in the rank's persistent namespace.

Owns compiling (so tracebacks show the cell's own line numbers), the value of the last
expression, tracebacks trimmed to the user's frames, and figures made with pyplot.
Never imports IPython or matplotlib itself: figures are collected only when the cell
already imported pyplot.
"""
from __future__ import annotations

import ast
import gc
import inspect
import io
import linecache
import os
import pickle
import sys
import traceback
from types import TracebackType
from typing import Any

from kit.errors import cell_label
from kit.rank.reply import safe_repr, safe_str
from kit.units import MIB

__all__ = ["NO_VALUE", "mime_bundle", "execute", "cell_filename", "cell_label", "format_exception",
           "cell_frame", "pack_value", "collect_figures", "release_frames", "capped_bundle"]

NO_VALUE = object()
MAX_VALUE_BYTES = int(64 * MIB)  # bigger results are shown as a repr, not shipped
MAX_REPR_CHARS = 10_000
MAX_HTML_CHARS = 256 << 10  # a value's HTML, like a rank's printed text per cell (kit.engine.output)
DISPLAY_CAP_BYTES = int(2 * MIB)  # display() output per rank per cell: a dozen figures, not a 50 MB page


def cell_filename(label: str | int) -> str:
    """`<cell In [7]>` for the notebook's label, `<cell 5>` for the kit's own counter. The `<cell `
    prefix is how every part of the kit tells a cell's frames from library frames."""
    return f"<cell {label}>"


def execute(source: str, ns: dict[str, Any], filename: str) -> Any:
    """Exec the cell; return the value of a trailing expression, or NO_VALUE."""
    linecache.cache[filename] = (len(source), None, source.splitlines(True), filename)
    tree = ast.parse(source, filename, "exec")
    last: ast.Expression | None = None
    if tree.body and isinstance(tree.body[-1], ast.Expr):
        last = ast.Expression(tree.body.pop().value)
    # dont_inherit: this module's own `from __future__ import annotations` must not leak into
    # the user's code (annotations would become strings and undefined names would not raise).
    # Top-level `await`, `async for` and `async with` work as in IPython: such code compiles to a
    # coroutine, run to completion on the rank's one persistent event loop.
    _run(compile(tree, filename, "exec", flags=ast.PyCF_ALLOW_TOP_LEVEL_AWAIT, dont_inherit=True), ns)
    if last is None:
        return NO_VALUE
    return _run(compile(last, filename, "eval", flags=ast.PyCF_ALLOW_TOP_LEVEL_AWAIT, dont_inherit=True), ns)


_LOOP: Any = None  # the rank's event loop for top-level await, made on first use (tasks outlive a cell)


def _run(code: Any, ns: dict[str, Any]) -> Any:
    if not code.co_flags & inspect.CO_COROUTINE:
        return eval(code, ns)  # exec-mode code evaluates to None
    global _LOOP
    import asyncio

    if _LOOP is None or _LOOP.is_closed():
        _LOOP = asyncio.new_event_loop()
    return _LOOP.run_until_complete(eval(code, ns))


def _user_tb(tb: TracebackType | None) -> TracebackType | None:
    """Drop the kit's own frames above the first cell frame; with no kit frame above, keep the whole
    traceback (a `call` request's function). Only kit frames (an interrupt that landed in the kit
    after the cell returned): none, the error's line says it all."""
    first = tb
    while first is not None and not first.tb_frame.f_code.co_filename.startswith("<cell"):
        first = first.tb_next
    if first is not None:
        return first
    walk = tb
    while walk is not None and _not_users(walk.tb_frame.f_code.co_filename):
        walk = walk.tb_next
    return walk


_KIT_DIR = __file__.rsplit("/", 1)[0] + "/"  # kit/rank/: the collective ledger's wrappers, the print hooks
_DEBUGGER = tuple(f"{os.sep}{name}" for name in ("bdb.py", "pdb.py"))


def _not_users(filename: str) -> bool:
    """The kit's own frames, and the debugger's (breakpoint() on a rank quits pdb: stdin is /dev/null)."""
    return filename.startswith(_KIT_DIR) or filename.endswith(_DEBUGGER)


def format_exception(exc: BaseException) -> str:
    """The user's frames only: the kit's frames above and below the cell are dropped."""
    if isinstance(exc, SyntaxError):
        return "".join(traceback.format_exception_only(type(exc), exc))
    te = traceback.TracebackException(type(exc), exc, _user_tb(exc.__traceback__))
    frames = list(te.stack)
    while len(frames) > 1 and _not_users(frames[-1].filename) and not frames[0].filename.startswith(_KIT_DIR):
        frames.pop()  # the collective wrapper that raised on the user's behalf; pdb quitting (breakpoint())
    if frames and not frames[0].filename.startswith(_KIT_DIR):  # the ledger's wrapper between the cell and
        frames = [f for f in frames[:-1] if not f.filename.startswith(_KIT_DIR)] + frames[-1:]  # torch: passed through
    te.stack = traceback.StackSummary.from_list(frames)
    return "".join(te.format())


def cell_frame(exc: BaseException) -> tuple[str | None, int | None]:
    """(cell label, line) of the innermost cell frame the exception passed through: a function
    defined in In [5] and called from In [7] raises in In [5]."""
    if isinstance(exc, SyntaxError):
        name = exc.filename if isinstance(exc.filename, str) else ""
        return (cell_label(name), exc.lineno) if name.startswith("<cell") else (None, None)
    found: tuple[str | None, int | None] = (None, None)
    tb = exc.__traceback__
    while tb is not None:
        name = tb.tb_frame.f_code.co_filename
        if name.startswith("<cell"):
            found = (cell_label(name), tb.tb_lineno)
        tb = tb.tb_next
    return found


def release_frames(exc: BaseException) -> None:
    """Drop what a failed cell's frames still hold, once its error is reported. An iterator stopped
    mid-loop (a DataLoader with workers) sits in a reference cycle through the traceback; left to a
    later garbage collection, it may be collected in a *forked* child of a later cell, where its
    `__del__` fails ("can only test a child process") and its workers were never stopped. Cleared
    here, it is freed now, in this process, and stops its workers."""
    seen: set[int] = set()
    todo: list[BaseException | None] = [exc]
    while todo:
        e = todo.pop()
        if e is None or id(e) in seen:
            continue
        seen.add(id(e))
        traceback.clear_frames(e.__traceback__)  # frames still running (the kit's own) are skipped
        todo += [e.__cause__, e.__context__]
    gc.collect()


def _short_repr(value: Any) -> str:
    try:
        text = repr(value)
        text = text if isinstance(text, str) else safe_repr(text)
    except BaseException as e:  # noqa: B036 - a broken __repr__ must not fail the cell
        text = f"<repr failed: {type(e).__name__}: {safe_str(e)[:300]}>"
    if len(text) > MAX_REPR_CHARS:
        text = text[:MAX_REPR_CHARS] + f"... [{len(text) - MAX_REPR_CHARS} more characters]"
    return text


def pack_value(value: Any) -> dict[str, Any]:
    """Pickle the value for the kernel if it can travel; always include a text repr."""
    out: dict[str, Any] = {"repr": _short_repr(value), "pickle": None, "note": None}
    html = _call_repr(value, "_repr_html_", str)
    if html and len(html) > MAX_HTML_CHARS:
        out["note"] = (f"its HTML ({len(html) / MIB:.1f} MiB) is over the {MAX_HTML_CHARS >> 10} KiB cap for "
                       f"output; showing its repr")
    elif html:
        out["html"] = html
    try:
        data = pickle.dumps(value, protocol=pickle.HIGHEST_PROTOCOL)
    except KeyboardInterrupt:
        raise  # the request was interrupted: a pull must fail, not bring back a repr in the value's place
    except BaseException as e:  # noqa: B036 - a __reduce__ may raise anything; the reply must still go
        out["note"] = f"the value could not be sent to the kernel ({type(e).__name__}: {safe_str(e)[:300]}); " \
                      "showing its repr"
        return out
    if len(data) > MAX_VALUE_BYTES:
        out["note"] = (
            f"the value is {len(data) / MIB:.0f} MiB pickled, over the {MAX_VALUE_BYTES / MIB:.0f} MiB limit; "
            "showing its repr (keep big tensors on the ranks, or pull a slice)"
        )
        return out
    out["pickle"] = data
    return out


def _call_repr(obj: Any, method: str, kind: type) -> Any:
    """obj._repr_html_() and friends, kept only when they return the type Jupyter expects
    (a MagicMock answers every method with another MagicMock)."""
    try:
        fn = getattr(obj, method, None)
        data = fn() if callable(fn) else None
    except BaseException:  # noqa: B036 - a broken repr method must not fail the cell
        return None
    return data if isinstance(data, kind) else None


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
    for method, mime, kind in (("_repr_png_", "image/png", bytes), ("_repr_html_", "text/html", str)):
        data = _call_repr(obj, method, kind) if mime not in bundle else None
        if data:
            bundle[mime] = data
    return bundle


def capped_bundle(bundle: dict[str, Any], shown_bytes: int, rank: int) -> tuple[dict[str, Any] | None, int]:
    """(what to send, bytes shown so far) for one display(): past DISPLAY_CAP_BYTES in this cell, one
    note in its place, then nothing (a loop of big displays must not flood the notebook either)."""
    size = sum(len(v) for v in bundle.values() if isinstance(v, (str, bytes)))
    if shown_bytes + size <= DISPLAY_CAP_BYTES:
        return bundle, shown_bytes + size
    if shown_bytes > DISPLAY_CAP_BYTES:
        return None, shown_bytes
    return {"text/plain": f"[kit] rank {rank}: display() output of {size / MIB:.1f} MiB not shown, nor any more "
                          f"in this cell: it passes the {DISPLAY_CAP_BYTES / MIB:.0f} MiB cap per rank and cell that "
                          f"keeps the notebook usable (printed text is capped too). Save it to a file and open "
                          f"that instead."}, DISPLAY_CAP_BYTES + 1


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
