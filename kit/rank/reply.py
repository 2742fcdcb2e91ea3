"""Worker side: build replies that can always be sent, whatever the user's objects do.

A reply is built from user objects (an exception, a last value, its `_repr_html_`), and any of
them can misbehave: `__str__` that raises, a 20 MB message, an HTML repr that is not a string, a
value pickle cannot handle. A reply that fails to build or to send would end the rank, so every
user-controlled part passes through here: text is taken with safe str/repr and capped, and a
reply that still does not pickle is stripped to plain text with a note saying what was dropped.
"""
from __future__ import annotations

import pickle
import traceback
from typing import Any

__all__ = ["safe_str", "safe_repr", "cap_text", "error_info", "sendable", "MAX_EVALUE_CHARS", "MAX_TRACEBACK_CHARS"]

MAX_EVALUE_CHARS = 20_000  # a 20 MB exception message must not reach the browser (Binder has 1-2 GB)
MAX_TRACEBACK_CHARS = 100_000


def safe_str(obj: Any) -> str:
    """str(obj), or a placeholder naming the type when its __str__ raises (never raises itself)."""
    try:
        text = str(obj)
        return text if isinstance(text, str) else safe_repr(text)
    except BaseException as e:  # noqa: B036 - a user __str__ may raise anything, even SystemExit
        return f"<{_type_name(obj)} object: str() failed with {_type_name(e)}>"


def safe_repr(obj: Any) -> str:
    try:
        text = repr(obj)
        return text if isinstance(text, str) else f"<{_type_name(obj)} object: repr() returned a non-string>"
    except BaseException as e:  # noqa: B036
        return f"<{_type_name(obj)} object: repr() failed with {_type_name(e)}>"


def _type_name(obj: Any) -> str:
    try:
        return type(obj).__qualname__
    except BaseException:  # noqa: B036
        return "object"


def cap_text(text: str, limit: int, what: str) -> str:
    """Keep the head and the tail (where a traceback's last line is) and say how much was cut."""
    if len(text) <= limit:
        return text
    head, tail = limit * 2 // 3, limit // 3
    cut = len(text) - head - tail
    return (f"{text[:head]}\n[kit] ... {cut:,} characters of this {what} cut (it had {len(text):,}; the "
            f"kit shows at most {limit:,}) ...\n{text[-tail:]}")


def error_info(exc: BaseException, tb_text: str, line: int | None, cell: str | None) -> dict[str, Any]:
    """The reply's `error` entry: name, capped message and traceback, cell line and cell label."""
    return {"ename": _type_name(exc), "evalue": cap_text(safe_str(exc), MAX_EVALUE_CHARS, "exception message"),
            "traceback": cap_text(tb_text, MAX_TRACEBACK_CHARS, "traceback"), "line": line, "cell": cell}


def format_failure(exc: BaseException, formatter: Any) -> str:
    """The traceback text, or the plain one when the formatter itself trips over the exception."""
    try:
        return formatter(exc)
    except BaseException:  # noqa: B036
        try:
            return "".join(traceback.format_exception(exc))
        except BaseException:  # noqa: B036
            return f"{_type_name(exc)}: (the traceback could not be formatted)\n"


def sendable(reply: dict[str, Any]) -> dict[str, Any]:
    """The reply itself when it pickles, else a copy stripped to plain text with a note.

    The "done" reply is the one frame that must always arrive: without it the kernel waits for
    this rank forever, so the fallback keeps only builtins that pickle anywhere.
    """
    try:
        pickle.dumps(reply, protocol=pickle.HIGHEST_PROTOCOL)
        return reply
    except BaseException as e:  # noqa: B036 - a __reduce__ may raise anything
        why = f"{_type_name(e)}: {safe_str(e)[:300]}"
    value = reply.get("value") if isinstance(reply.get("value"), dict) else None
    stripped: dict[str, Any] = {k: reply.get(k) for k in ("id", "ok", "suspect", "pg_gone")}
    stripped["figures"] = [f for f in reply.get("figures") or [] if isinstance(f, bytes)]
    if value is not None:
        note = f"the result could not be sent to the kernel ({why}); showing its repr"
        stripped["value"] = {"repr": safe_str(value.get("repr", "")), "pickle": None, "note": note}
        if isinstance(value.get("items"), dict):  # a pull: one packed value per name
            stripped["value"]["items"] = {safe_str(k): {"repr": safe_str((v or {}).get("repr", "")), "pickle": None,
                                                        "note": note} for k, v in value["items"].items()}
    err = reply.get("error")
    if isinstance(err, dict):
        stripped["error"] = {k: safe_str(err.get(k, "")) for k in ("ename", "evalue", "traceback")}
        stripped["error"].update(line=err.get("line") if isinstance(err.get("line"), int) else None,
                                 cell=safe_str(err["cell"]) if err.get("cell") else None)
    else:
        stripped["error"] = None
    return stripped
