"""Worker side: build replies that can always be sent, whatever the user's objects do.

A reply is built from user objects (an exception, a last value, its `_repr_html_`), and any of
them can misbehave: `__str__` that raises, a 20 MB message, an HTML repr that is not a string, a
value pickle cannot handle. A reply that fails to build or to send would end the rank, so every
user-controlled part passes through here: text is taken with safe str/repr and capped, and a
reply that still does not pickle is stripped to plain text with a note saying what was dropped.
"""
from __future__ import annotations

import traceback
from typing import Any

from kit.messages import ErrorInfo, Reply

__all__ = ["safe_str", "safe_repr", "cap_text", "error_info", "format_failure", "stripped", "bare", "MAX_EVALUE_CHARS",
           "MAX_TRACEBACK_CHARS"]

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


def error_info(exc: BaseException, tb_text: str, line: int | None, cell: str | None) -> ErrorInfo:
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


def stripped(reply: Reply, why: str) -> Reply:
    """A copy of a reply that failed to encode, with only builtins that pickle anywhere: values
    become their reprs with a note saying why. The "done" reply is the one frame that must always
    arrive: without it the kernel waits for this rank forever."""
    value = reply.get("value") if isinstance(reply.get("value"), dict) else None
    out = bare(reply, why)
    out["figures"] = [f for f in reply.get("figures") or [] if isinstance(f, bytes)]
    if value is not None:
        note = f"the result could not be sent to the kernel ({why}); showing its repr"
        out["value"] = {"repr": safe_str(value.get("repr", "")), "pickle": None, "note": note}
        if isinstance(value.get("items"), dict):  # a pull: one packed value per name
            out["value"]["items"] = {safe_str(k): {"repr": safe_str((v or {}).get("repr", "")), "pickle": None,
                                                   "note": note} for k, v in value["items"].items()}
    err = reply.get("error")
    if isinstance(err, dict):
        out["error"] = {k: safe_str(err.get(k, "")) for k in ("ename", "evalue", "traceback")}
        out["error"].update(line=err.get("line") if isinstance(err.get("line"), int) else None,
                            cell=safe_str(err["cell"]) if err.get("cell") else None)
    return out


def bare(reply: Reply | dict[str, Any], why: str) -> Reply:
    """The least a "done" reply can be: its id and flags, no value, and an error only if the
    request failed (with the reason the full reply could not go)."""
    err = reply.get("error")
    out: Reply = {"id": reply.get("id"), "ok": bool(reply.get("ok")), "value": None, "figures": [],
                           "suspect": bool(reply.get("suspect")), "pg_gone": bool(reply.get("pg_gone")), "error": None}
    if err is not None:
        out["error"] = {"ename": "ReplyError", "traceback": "", "line": None, "cell": None,
                        "evalue": f"the rank could not build or send its full reply ({why}); the rank and its "
                                  f"variables are kept"}
    return out
