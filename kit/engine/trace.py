"""Kernel side of `--profile`: the ranks' profiles (kit/rank/profile.py) merged into one trace in
the Chrome Trace Event Format, the JSON that ui.perfetto.dev, chrome://tracing and TensorBoard's
profiler plugin open (spec: docs/measuring.md, "Profiler traces").

One process row per rank ("M" process_name "rank N"), the kit's spans on its own threads ("kit":
the cell or an experiment's steps and phases; "kit: collectives": every collective the rank's
Python code called), torch's operator events beneath on their threads. `ts` and `dur` are
microseconds from the first event of any rank, on one clock:
- ranks on one host (same boot id) share CLOCK_MONOTONIC: offset 0, exact;
- an experiment's ranks across hosts: the kit's ping-pong offset (clocks.py), its bound recorded;
- otherwise the ranks' system clocks (NTP): aligned only as well as NTP keeps them, and said so.
Events on one (pid, tid) must nest (a viewer drops or mis-stacks partial overlaps), so an event
that partly overlaps an earlier one moves to an extra "(overlapping)" thread row ("... (overlap 1)") instead.

`write_profiles` lays out a `--profile DIR` folder: the merged file for Perfetto beside torch.profiler's own
file per rank, in the layout TensorBoard's profiler plugin (`*.pt.trace.json` per worker in a run folder)
and HolisticTraceAnalysis (a folder of traces, each naming its rank in `distributedInfo`) read.
"""
from __future__ import annotations

import gzip
import json
import os
import re
import stat
import tempfile
from typing import Any, Callable, IO

__all__ = ["merge_profiles", "write", "write_profiles", "check_folder", "nesting_problems", "clock_method", "MERGED_NAME",
           "RANKS_DIR"]

MERGED_NAME = "all_ranks.json"  # the kit's merged trace: every rank on one clock (ui.perfetto.dev, chrome://tracing)
RANKS_DIR = "ranks"  # torch.profiler's own file per rank (TensorBoard's profiler plugin, HolisticTraceAnalysis)
_RANK_FILE = re.compile(r"^rank\d+\.pt\.trace\.json$")


def clock_method(profiles: list[dict[str, Any]]) -> str:
    if len({p["boot_id"] for p in profiles}) <= 1:
        return "shared monotonic clock"
    if all(p.get("offset_us") is not None for p in profiles):
        return "ping-pong"
    return "system clocks"


def _shift_us(p: dict[str, Any], method: str) -> float:
    """What to add to this rank's perf_counter us to get the common clock's us."""
    if method == "ping-pong":
        return -float(p["offset_us"])
    if method == "system clocks":
        return float(p["wall_minus_perf_us"])
    return 0.0


def merge_profiles(profiles: dict[int, dict[str, Any]], title: str = "kit profile") -> dict[str, Any]:
    """{rank: profile} -> a Chrome trace dict (JSON-ready)."""
    profs = [profiles[r] for r in sorted(profiles) if profiles[r]]
    method = clock_method(profs)
    shifts = {p["rank"]: _shift_us(p, method) for p in profs}
    out: list[dict[str, Any]] = []
    for p in profs:
        out += _rank_events(p, shifts[p["rank"]])
    origin = min((e["ts"] for e in out if e["ph"] != "M"), default=0.0)
    for e in out:
        if "ts" in e:
            e["ts"] = round(e["ts"] - origin, 3)
    out = _nest(out)
    notes = [f"rank {p['rank']}: {p['dropped']} torch events past the first {len(p['events'])} not kept"
             for p in profs if p.get("dropped")]
    if method == "system clocks":
        notes.append("ranks on different hosts are aligned by their system clocks (NTP): cross-rank order "
                     "closer than the hosts' clock error is not meaningful")
    return {"traceEvents": out, "displayTimeUnit": "ms",
            "otherData": {"title": title, "clock": method, "ranks": [p["rank"] for p in profs],
                          "time_origin": "first event of any rank", "notes": notes}}


def _rank_events(p: dict[str, Any], shift_us: float) -> list[dict[str, Any]]:
    rank = int(p["rank"])
    tids: dict[Any, int] = {}
    names: dict[int, str] = {}

    def tid_for(key: Any, name: str) -> int:
        if key not in tids:
            tids[key] = len(tids)
            names[tids[key]] = name
        return tids[key]

    events: list[dict[str, Any]] = []
    order = {"kit": 0}  # the kit's own row first, then its collectives, then torch's threads
    for s in sorted(p["spans"], key=lambda s: order.get(s["row"], 1)):
        tid = tid_for(("kit", s["row"]), s["row"])
        events.append({"ph": "X", "name": s["name"], "cat": s["cat"], "pid": rank, "tid": tid,
                       "ts": round(s["start_us"] + shift_us, 3), "dur": round(s["end_us"] - s["start_us"], 3),
                       "args": s["args"]})
    own_pid = p.get("pid")
    for ev in p["events"]:
        src = f"{ev.get('pid')}/{ev.get('tid')}"
        label = p["threads"].get(src) or (f"thread {ev.get('tid')}" if ev.get("pid") == own_pid
                                          else f"device {ev.get('pid')} stream {ev.get('tid')}")
        e = dict(ev, pid=rank, tid=tid_for(("torch", src), "torch: " + label))
        e["ts"] = round(float(ev["ts"]) + shift_us, 3)
        events.append(e)
    meta = [{"ph": "M", "name": "process_name", "pid": rank, "tid": 0, "args": {"name": f"rank {rank}"}},
            {"ph": "M", "name": "process_sort_index", "pid": rank, "tid": 0, "args": {"sort_index": rank}}]
    for tid, name in names.items():
        meta += [{"ph": "M", "name": "thread_name", "pid": rank, "tid": tid, "args": {"name": name}},
                 {"ph": "M", "name": "thread_sort_index", "pid": rank, "tid": tid, "args": {"sort_index": tid}}]
    return meta + events


def _nest(events: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Move each complete event that partly overlaps an open one on its (pid, tid) to an extra
    thread row, so every row nests (flows and metadata are left alone)."""
    spans = sorted((e for e in events if e["ph"] == "X"), key=lambda e: (e["pid"], e["tid"], e["ts"], -e["dur"]))
    rest = [e for e in events if e["ph"] != "X"]
    used = {(e["pid"], e["tid"]) for e in events}
    names = {(e["pid"], e["tid"]): e["args"]["name"] for e in rest if e["ph"] == "M" and e["name"] == "thread_name"}
    stacks: dict[tuple[Any, Any], list[float]] = {}  # open ends per row
    extra: dict[tuple[Any, Any], Any] = {}
    home: dict[tuple[Any, Any], tuple[Any, int]] = {}  # extra row -> (the row it relieves, how deep)
    for e in spans:
        row = (e["pid"], e["tid"])
        while True:
            stack = stacks.setdefault(row, [])
            while stack and stack[-1] <= e["ts"]:
                stack.pop()
            if not stack or e["ts"] + e["dur"] <= stack[-1]:
                break
            if row not in extra:  # a new row for what does not fit
                new = (e["pid"], max(t for p, t in used if p == e["pid"]) + 1)
                used.add(new)
                extra[row] = new
                first, depth = home.get(row, (row, 0))
                home[new] = (first, depth + 1)
                name = f"{names.get(first, f'thread {first[1]}')} (overlap {depth + 1})"
                rest.append({"ph": "M", "name": "thread_name", "pid": new[0], "tid": new[1], "args": {"name": name}})
            row = extra[row]
        e["tid"] = row[1]
        stack.append(e["ts"] + e["dur"])
    return rest + spans


def nesting_problems(trace: dict[str, Any]) -> list[str]:
    """Complete events that partly overlap another on the same (pid, tid): what viewers mis-draw."""
    problems = []
    rows: dict[tuple[Any, Any], list[dict[str, Any]]] = {}
    for e in trace["traceEvents"]:
        if e.get("ph") == "X":
            rows.setdefault((e["pid"], e["tid"]), []).append(e)
    for row, evs in rows.items():
        stack: list[dict[str, Any]] = []
        for e in sorted(evs, key=lambda e: (e["ts"], -e["dur"])):
            while stack and stack[-1]["ts"] + stack[-1]["dur"] <= e["ts"]:
                stack.pop()
            if stack and e["ts"] + e["dur"] > stack[-1]["ts"] + stack[-1]["dur"]:
                problems.append(f"{row}: {e['name']!r} at {e['ts']} us overlaps {stack[-1]['name']!r}")
            stack.append(e)
    return problems


def check_folder(path: str) -> str:
    """The absolute folder a profile goes to, refused before anything runs if it cannot be one: a symlink,
    a file, a `.json` name (the trace used to be one file), or a parent folder that does not exist.
    ValueError says what to name instead."""
    full = os.path.abspath(os.path.expanduser(path))
    example = os.path.join(os.path.dirname(full), "traces")
    if os.path.islink(full):
        raise ValueError(f"{full} is a symlink; name a new folder, e.g. {example}")
    if os.path.exists(full) and not os.path.isdir(full):
        raise ValueError(f"{full} is a file; the profile is a folder (the merged trace and one file per rank "
                         f"go in it): name a new folder, e.g. {example}")
    if full.endswith(".json") and not os.path.isdir(full):
        raise ValueError(f"{full} names a file; the profile is a folder (the merged trace {MERGED_NAME} and one "
                         f"file per rank in {RANKS_DIR}/ go in it): name a folder, e.g. {full[:-5]}")
    parent = os.path.dirname(full)
    if not os.path.isdir(parent):
        raise ValueError(f"the folder {parent} does not exist; create it first (mkdir -p {parent}) or name a "
                         f"folder in an existing one")
    if not os.access(parent, os.W_OK | os.X_OK):
        raise ValueError(f"the folder {parent} is not writable by you; name a folder in one you can write to, "
                         f"e.g. {os.path.join(os.path.expanduser('~'), 'traces')}")
    return full


def write_profiles(profiles: dict[int, dict[str, Any]], folder: str, title: str) -> dict[str, Any]:
    """The ranks' profiles into `folder` (created): the merged trace as MERGED_NAME, and torch.profiler's
    own file per rank as RANKS_DIR/rankN.pt.trace.json. Files of an earlier profile of more ranks are
    removed there, or TensorBoard and HTA would count them. Returns the merged trace; its
    otherData["files"] names what was written."""
    folder = check_folder(folder)
    os.makedirs(folder, exist_ok=True)
    raw = {r: p.pop("torch_trace_gz", None) for r, p in profiles.items() if p}
    trace = merge_profiles(profiles, title=title)
    ranks_dir = os.path.join(folder, RANKS_DIR)
    if os.path.islink(ranks_dir) or (os.path.exists(ranks_dir) and not os.path.isdir(ranks_dir)):
        raise FileExistsError(f"{ranks_dir} is a symlink or a file; the kit writes the per-rank traces only into a "
                              f"folder of its own. Choose another profile folder.")
    os.makedirs(ranks_dir, exist_ok=True)
    for name in os.listdir(ranks_dir):
        if _RANK_FILE.match(name):
            os.unlink(os.path.join(ranks_dir, name))
    per_rank = {}
    for r, packed in sorted(raw.items()):
        if packed is None:
            trace["otherData"]["notes"].append(f"rank {r}: torch's own trace was over the size the kit sends to "
                                               f"the kernel; it is in {MERGED_NAME} only")
            continue
        text = gzip.decompress(packed)
        per_rank[r] = _write_atomic(os.path.join(ranks_dir, f"rank{r}.pt.trace.json"), lambda f: f.write(text), "wb")
    merged = write(trace, os.path.join(folder, MERGED_NAME))  # last: its notes say which rank files are missing
    trace["otherData"]["files"] = {"folder": folder, "merged": merged, "ranks": per_rank}
    return trace


def write(trace: dict[str, Any], path: str) -> str:
    """Write the trace to `path`, replacing a regular file there (re-running a cell rewrites its
    trace); never through a symlink, never over a directory or device. Atomic: a viewer never
    sees half a file. Returns the absolute path."""
    return _write_atomic(path, lambda f: json.dump(trace, f, separators=(",", ":")), "w")


def _write_atomic(path: str, dump: Callable[[IO[Any]], Any], mode: str) -> str:
    path = os.path.abspath(os.path.expanduser(path))
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        st = None
    if st is not None and not stat.S_ISREG(st.st_mode):
        kind = "a symlink" if stat.S_ISLNK(st.st_mode) else "not a regular file"
        raise FileExistsError(f"{path} is {kind}; the kit writes traces only to a new or regular file. "
                              f"Choose another name.")
    folder = os.path.dirname(path)
    if not os.path.isdir(folder):
        raise FileNotFoundError(f"the folder {folder} does not exist; create it or choose another path")
    fd, tmp = tempfile.mkstemp(prefix=".kit-trace-", suffix=".json", dir=folder)
    try:
        with os.fdopen(fd, mode) as f:
            dump(f)
        os.chmod(tmp, 0o644 & ~_umask())
        os.replace(tmp, path)  # replaces the name itself: a symlink put there meanwhile is not followed
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise
    return path


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask
