"""Worker side: `%dist where`: what this rank's main thread is doing right now, in a user's words
(the collective it waits in, the cell line, the cell stack, the last collectives). Runs on the
control thread while the main thread is busy."""
from __future__ import annotations

import os
import sys
import time
import traceback

from kit.rank.ledger import Entry, Ledger

__all__ = ["innermost", "where_text"]


def where_text(main_ident: int, ledger: Ledger, busy: str | None, idle: bool) -> str:
    """`busy` names the request being served ("In [7]"), so a cell running C code, or the kit
    around it, is never reported idle; `idle` says no request is queued."""
    stack, cur = _snapshot(main_ident, ledger)
    user = [f for f in stack if f.filename.startswith("<cell")]
    lines = []
    if cur is not None and not cur.recorded_only:
        lines.append(cur.state(time.monotonic()))
    elif user:
        lines.append(f"running {user[-1].filename} line {user[-1].lineno}: {(user[-1].line or '').strip()}")
    elif busy is not None:  # in C code, or in the kit around the cell: still not idle
        lines.append(f"running {busy} (no Python line of the cell is on the stack: C code, or the "
                     f"kit before/after it)")
    else:
        lines.append("idle" if idle else "about to start the next request")
    if cur is not None and cur.recorded_only:
        # a DTensor or functional collective: the first line stays the cell's (the kernel's stuck checks read it
        # as before: a wait inside torch's ops, which they end when the other ranks finished the cell)
        lines.append(f"  waiting inside {cur.describe()}, for {time.monotonic() - cur.started_s:.1f} s")
    if user:
        lines.append("stack (innermost last):")
        lines += [f"  {f.filename} line {f.lineno}, in {f.name}: {(f.line or '').strip()}" for f in user]
        if stack and stack[-1] is not user[-1]:
            last = stack[-1]
            lines.append(f"  ... {os.path.basename(last.filename)}:{last.lineno} in {last.name}")
    recent = ledger.tail()
    if recent:
        lines.append("recent collectives (oldest first):")
        lines += ["  " + line for line in recent]
    return "\n".join(lines)


def _snapshot(main_ident: int, ledger: Ledger) -> tuple[traceback.StackSummary, Entry | None]:
    """The main thread's stack and its current collective, taken together: the main thread runs on while
    the stack is read, so a collective that started meanwhile (or ended) would pair one line's stack with
    another line's collective. Read again until the ledger's current call is the same before and after."""
    for _ in range(5):
        cur = ledger.current
        frame = sys._current_frames().get(main_ident)
        stack = traceback.extract_stack(frame) if frame is not None else traceback.StackSummary()
        if ledger.current is cur:
            break
    return stack, cur


def innermost(main_ident: int) -> str:
    """The main thread's innermost Python frame as "module:line in function" ("torch.autograd.graph:829 in
    _engine_run_backward"): the kernel tells a wait inside torch's own collectives from a cell's line."""
    frame = sys._current_frames().get(main_ident)
    if frame is None:
        return ""
    return f"{frame.f_globals.get('__name__', '?')}:{frame.f_lineno} in {frame.f_code.co_name}"
