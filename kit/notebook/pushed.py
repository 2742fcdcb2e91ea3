"""`%dist push` in an exported script: the values the kernel sent, written where the push came.

A push is a `CellRecord` (scripts.py) whose source assigns the values: Python literals as they are
(`lr = 0.05`), anything else as a line that stops the script there, naming the value, instead of the bare
NameError a later cell would hit. `DistributedMagics.record_push` records one for each push every chosen
rank kept (`dist_line._push` says when: an interrupt that came just after the commit too).
"""
from __future__ import annotations

import ast

from kit.notebook.scripts import CellRecord

__all__ = ["push_record", "PUSH_LITERAL_MAX_CHARS"]

PUSH_LITERAL_MAX_CHARS = 10_000  # a longer value is data, not a setting: the script says to load it instead


def _short(value: object, budget: int = PUSH_LITERAL_MAX_CHARS) -> bool:
    """Whether `value` can have a repr within about `budget` characters, judged without building it: a pushed
    list of a million numbers would otherwise cost a repr of megabytes and a parse many times that (the
    parser builds a node per element), in the kernel, after the push, for a value the script cannot hold."""
    stack, left = [value], budget
    while stack:
        v = stack.pop()
        left -= 1
        if isinstance(v, (str, bytes, list, tuple, dict, set, frozenset)):
            left -= len(v)  # each element or character at least one character of repr
            if left >= 0 and not isinstance(v, (str, bytes)):
                stack.extend(x for kv in v.items() for x in kv) if isinstance(v, dict) else stack.extend(v)
        if left < 0:
            return False
    return True


def _literal(value: object) -> str | None:
    """`repr(value)` when Python reads it back as an equal value of the same type (numbers, strings, None, and
    lists, tuples, dicts and sets of them), short enough to read in a script; else None."""
    if type(value) is float and (value != value or value in (float("inf"), float("-inf"))):
        return f"float({str(value)!r})"  # nan, inf: floats that are not literals
    if not _short(value):
        return None
    try:
        text = repr(value)
        back = ast.literal_eval(text)
    except Exception:  # noqa: BLE001 - a broken __repr__, or not a literal: either way not writable
        return None
    same = type(back) is type(value) and back == value
    return text if same and len(text) <= PUSH_LITERAL_MAX_CHARS else None


def push_record(label: str, names: list[str], values: dict[str, object], ranks: tuple[int, ...] | None,
                flags: str) -> CellRecord:
    """A successful `%dist push` as the script's code: each value the kernel sent, written as a literal
    assignment (`lr = 0.05`); one that is not a literal (a tensor, a model) as a line that stops the script
    there, naming it (the script would otherwise fail later with a bare NameError, as it did before pushes
    were exported at all)."""
    lines, unwritable = [], []
    for n in names:
        text = _literal(values[n])
        if text is not None:
            lines.append(f"{n} = {text}")
            continue
        unwritable.append(n)
        held = (f"too long to write into a script (over {PUSH_LITERAL_MAX_CHARS:,} characters)" if not _short(values[n])
                else "which a script cannot hold as a literal")  # a list of a million numbers is a literal, but data
        why = (f"{n} came from the kernel by `%dist push` ({label}): a {type(values[n]).__name__}, {held}; define {n} "
               "here (build it, or torch.load it from a file you saved)")
        lines.append(f"raise NameError({why!r})")
    return CellRecord(label, "\n".join(lines), flags, True, ranks=ranks, pushed=tuple(names),
                      unwritable=tuple(unwritable))
