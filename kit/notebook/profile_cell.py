"""`%%distributed --profile DIR`: torch.profiler on every rank for one cell. DIR gets the ranks' traces
merged on one clock (kit/engine/trace.py) for Perfetto and chrome://tracing, torch.profiler's own file
per rank for TensorBoard's profiler plugin and HolisticTraceAnalysis, and a small picture goes under the cell.

Without the flag none of this runs: no profiler is created on any rank.
"""
from __future__ import annotations

import os
from typing import Any, Callable

from IPython.core.error import UsageError

from kit.engine.output import CellResult
from kit.engine.output import print_line as _emit
from kit.engine.trace import MERGED_NAME, RANKS_DIR, check_folder, write_profiles

__all__ = ["check_path", "profiled", "where_to_open"]


def check_path(path: str) -> str:
    """Refuse a folder that cannot take the traces before the cell runs, not after."""
    try:
        return check_folder(path)
    except ValueError as e:
        raise UsageError(f"--profile {path}: {e}") from None


def where_to_open(folder: str) -> list[str]:
    """Which file to open with what (the cell's note, and docs/measuring.md's)."""
    ranks = os.path.join(folder, RANKS_DIR)
    return [f"  {os.path.join(folder, MERGED_NAME)}: every rank on one clock, with the kit's spans: open it in "
            f"ui.perfetto.dev (\"Open trace file\"; Chromium 156 has no chrome://tracing any more)",
            f"  {ranks}/rankN.pt.trace.json: torch.profiler's own file per rank: `tensorboard --logdir {folder}` "
            f"(PyTorch Profiler tab, `pip install torch-tb-profiler`), or HolisticTraceAnalysis: "
            f"TraceAnalysis(trace_dir={ranks!r})"]


def profiled(cluster: Any, path: str, ranks: list[int] | None, label: str | None,
             run: Callable[[], CellResult]) -> tuple[CellResult, dict[str, Any] | None]:
    """Run the cell between a profiler start and stop on the ranks; write the traces.
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
    try:
        trace = write_profiles({r: p for r, p in profiles.items() if p}, full, title=label or "cell")
    except OSError as e:  # checked before the cell, yet the disk said no (a full disk, /proc, a read-only mount)
        _emit(-1, "stderr", f"no trace written: {full} could not be written ({e.strerror or e}); "
                            "name a folder you can write to")
        return result, None
    n = sum(e["ph"] == "X" for e in trace["traceEvents"])
    _emit(-1, "stdout", f"trace of {len(profiles)} rank(s), {n:,} spans ({trace['otherData']['clock']}) in {full}:")
    for line in where_to_open(full):
        _emit(-1, "stdout", line)
    for note in trace["otherData"]["notes"]:
        _emit(-1, "stderr", note)
    return result, trace
