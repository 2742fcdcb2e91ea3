"""`%%distributed --profile trace.json`: torch.profiler on every rank for one cell, the ranks'
traces merged on one clock (kit/engine/trace.py) into a file Perfetto, chrome://tracing and
TensorBoard open, and a small picture of it under the cell.

Without the flag none of this runs: no profiler is created on any rank.
"""
from __future__ import annotations

import os
from typing import Any, Callable

from IPython.core.error import UsageError

from kit.engine.output import CellResult
from kit.engine.output import print_line as _emit
from kit.engine.trace import merge, write

__all__ = ["check_path", "profiled"]


def check_path(path: str) -> str:
    """Refuse a path that cannot take the trace before the cell runs, not after."""
    full = os.path.abspath(os.path.expanduser(path))
    if os.path.isdir(full) and not os.path.islink(full):
        raise UsageError(f"--profile {path}: {full} is a folder; name a file in it, "
                         f"e.g. --profile {os.path.join(path, 'trace.json')}")
    if os.path.islink(full) or (os.path.exists(full) and not os.path.isfile(full)):
        raise UsageError(f"--profile {path}: {full} is a symlink or not a regular file; name a new .json file")
    folder = os.path.dirname(full)
    if not os.path.isdir(folder):
        raise UsageError(f"--profile {path}: the folder {folder} does not exist; create it first "
                         f"(mkdir -p {folder}) or name a file in an existing folder")
    return full


def profiled(cluster: Any, path: str, ranks: list[int] | None, label: str | None,
             run: Callable[[], CellResult]) -> tuple[CellResult, dict[str, Any] | None]:
    """Run the cell between a profiler start and stop on the ranks; write the merged trace.
    The cell's result is returned even when profiling fails (that is reported, not raised)."""
    full = check_path(path)
    cluster.call("kit.rank.profile:start", ranks=ranks)
    try:
        result = run()
    except BaseException:  # the ranks were busy or gone: leave no profiler running on them
        try:
            cluster.call("kit.rank.profile:stop", ranks=ranks)
        except Exception:
            pass
        raise
    try:
        profiles = cluster.call("kit.rank.profile:stop", ranks=ranks)
    except Exception as e:  # a rank died in the cell: its profile is gone with it
        _emit(-1, "stderr", f"no trace written: the profiles could not be collected ({str(e).splitlines()[0]})")
        return result, None
    trace = merge({r: p for r, p in profiles.items() if p}, title=label or "cell")
    write(trace, full)
    n = sum(e["ph"] == "X" for e in trace["traceEvents"])
    _emit(-1, "stdout", f"trace of {len(profiles)} rank(s), {n:,} spans ({trace['otherData']['clock']}) -> {full}; "
                        f"open it in ui.perfetto.dev, chrome://tracing or TensorBoard's profiler")
    for note in trace["otherData"]["notes"]:
        _emit(-1, "stderr", note)
    return result, trace
