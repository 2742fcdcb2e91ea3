"""Profiler traces (`%%distributed --profile DIR`, `run(..., profile=DIR)`): the merged file a practitioner
opens in ui.perfetto.dev / chrome://tracing must follow the Trace Event Format, nest per thread
row, put every rank on one clock; the per-rank files must load in HolisticTraceAnalysis and TensorBoard's
profiler plugin as one rank each; nothing of it may exist when profiling is off."""
from __future__ import annotations

import gzip
import json
import os
import re
import subprocess
import sys
import textwrap

import jsonschema
import pytest
from IPython.core.error import UsageError
from kit.engine.trace import merge_profiles, nesting_problems, write, write_profiles
from test_magics import ip  # noqa: F401 - the magics' IPython shell fixture (one per module, ranks stopped after)

WALL_CLOCK_S = 240

# The Trace Event Format (Google, "Trace Event Format", the JSON Object Format), as Perfetto's
# and chrome://tracing's JSON importers read it: ts and dur in microseconds, pid/tid numbers or
# strings, "X" complete events with a duration, "M" metadata naming processes and threads.
_ID = {"type": ["integer", "string"]}
EVENT = {
    "type": "object",
    "required": ["ph", "pid", "tid", "name"],
    "properties": {
        "ph": {"enum": ["B", "E", "X", "i", "I", "C", "b", "n", "e", "s", "t", "f", "P", "N", "O", "D", "M"]},
        "name": {"type": "string"}, "cat": {"type": "string"}, "pid": _ID, "tid": _ID,
        "ts": {"type": "number"}, "dur": {"type": "number", "minimum": 0}, "args": {"type": "object"},
    },
    "allOf": [
        {"if": {"properties": {"ph": {"const": "X"}}},
         "then": {"required": ["ts", "dur"]}},
        {"if": {"properties": {"ph": {"enum": ["s", "t", "f"]}}},
         "then": {"required": ["ts", "id"]}},
        {"if": {"properties": {"ph": {"const": "M"}}},
         "then": {"required": ["args"], "properties": {
             "name": {"enum": ["process_name", "process_labels", "process_sort_index", "thread_name",
                               "thread_sort_index"]}}}},
        {"if": {"properties": {"ph": {"const": "M"}, "name": {"enum": ["process_name", "thread_name"]}}},
         "then": {"properties": {"args": {"required": ["name"], "properties": {"name": {"type": "string"}}}}}},
        {"if": {"properties": {"ph": {"const": "M"}, "name": {"pattern": "_sort_index$"}}},
         "then": {"properties": {"args": {"required": ["sort_index"],
                                          "properties": {"sort_index": {"type": "integer"}}}}}},
    ],
}
SCHEMA = {"type": "object", "required": ["traceEvents"],
          "properties": {"traceEvents": {"type": "array", "items": EVENT},
                         "displayTimeUnit": {"enum": ["ms", "ns"]}, "otherData": {"type": "object"}}}

CELL = """
m = torch.nn.Linear(64, 64)
for _ in range(3):
    m(torch.randn(8, 64)).sum().backward()
    t = torch.ones(4)
    dist.all_reduce(t)
print("profiler on:", torch.autograd.profiler._is_profiler_enabled)
"""


@pytest.fixture(scope="module")
def cell_folder(ip, tmp_path_factory):
    folder = tmp_path_factory.mktemp("trace") / "cell"  # created by the kit
    ip.run_cell_magic("distributed", f"--cpus 2 --profile {folder}", CELL)
    return folder


@pytest.fixture(scope="module")
def cell_trace(cell_folder):
    with open(cell_folder / "all_ranks.json") as f:
        return json.load(f)


def _spans(trace, **match):
    return [e for e in trace["traceEvents"] if e["ph"] == "X" and all(e.get(k) == v for k, v in match.items())]


def _rows(trace):
    return {(e["pid"], e["tid"]): e["args"]["name"] for e in trace["traceEvents"]
            if e["ph"] == "M" and e["name"] == "thread_name"}


def test_cell_trace_follows_the_trace_event_format(cell_trace):
    jsonschema.validate(cell_trace, SCHEMA)
    assert cell_trace["displayTimeUnit"] == "ms"
    names = {e["pid"]: e["args"]["name"] for e in cell_trace["traceEvents"]
             if e["ph"] == "M" and e["name"] == "process_name"}
    assert names == {0: "rank 0", 1: "rank 1"}  # one process row per rank
    assert cell_trace["otherData"]["clock"] == "shared monotonic clock"


def test_cell_trace_has_kit_spans_and_torch_ops_beneath(cell_trace):
    for rank in (0, 1):
        cells = _spans(cell_trace, pid=rank, cat="cell")
        assert len(cells) == 1
        colls = _spans(cell_trace, pid=rank, cat="collective")
        assert [c["name"] for c in colls] == ["all_reduce"] * 3
        assert colls[0]["args"]["signature"] == "all_reduce(float32[4])"
        ops = _spans(cell_trace, pid=rank, cat="cpu_op")
        assert any(o["name"] == "aten::addmm" for o in ops) and any(o["name"] == "c10d::allreduce_" for o in ops)
        cell = cells[0]
        inside = [o for o in ops if cell["ts"] <= o["ts"] and o["ts"] + o["dur"] <= cell["ts"] + cell["dur"]]
        assert len(inside) >= 0.95 * len(ops)  # torch's ops happen inside the cell, on the same clock


def test_cell_trace_nests_on_every_row(cell_trace):
    assert nesting_problems(cell_trace) == []


def test_ranks_line_up_on_the_common_clock(cell_trace):
    """A collective cannot end on one rank before the other rank entered it: the intervals of the
    k-th all_reduce overlap on every rank (a misaligned clock moves one rank's away)."""
    per_rank = [_spans(cell_trace, pid=r, cat="collective") for r in (0, 1)]
    for k in range(3):
        starts = [p[k]["ts"] for p in per_rank]
        ends = [p[k]["ts"] + p[k]["dur"] for p in per_rank]
        assert max(starts) <= min(ends) + 1.0, (starts, ends)
    # torch's own event for the collective sits inside the kit's span on the same rank (two clocks converted)
    for r in (0, 1):
        kit = per_rank[r][0]
        op = min((o for o in _spans(cell_trace, pid=r, name="c10d::allreduce_")), key=lambda o: o["ts"])
        assert kit["ts"] - 1.0 <= op["ts"] and op["ts"] + op["dur"] <= kit["ts"] + kit["dur"] + 1.0


def test_profiling_off_creates_no_profiler(ip, capsys, tmp_path):
    """Without --profile no profiler object exists on a rank, and the profile module is not even imported."""
    capsys.readouterr()
    ip.run_cell_magic("distributed", "--cpus 2 --fresh",
                      "import sys\nprint('on:', torch.autograd.profiler._is_profiler_enabled, "
                      "'imported:', 'kit.rank.profile' in sys.modules)")
    out = capsys.readouterr().out
    assert out.count("on: False imported: False") == 2, out
    ip.run_cell_magic("distributed", f"--profile {tmp_path / 'on'}", "print('on:', "
                      "torch.autograd.profiler._is_profiler_enabled)")
    assert capsys.readouterr().out.count("on: True") == 2
    ip.run_cell_magic("distributed", "", "print('on:', torch.autograd.profiler._is_profiler_enabled)")
    assert capsys.readouterr().out.count("on: False") == 2  # stopped after the profiled cell


def test_profile_path_is_checked_before_the_cell_runs(ip, tmp_path, capsys):
    target = tmp_path / "real.json"
    target.write_text("keep")
    link = tmp_path / "link.json"
    link.symlink_to(target)
    with pytest.raises(UsageError, match="symlink"):
        ip.run_cell_magic("distributed", f"--profile {link}", "print('cell body ran')")
    with pytest.raises(UsageError, match="does not exist"):
        ip.run_cell_magic("distributed", f"--profile {tmp_path / 'no' / 'x'}", "print('cell body ran')")
    out = capsys.readouterr()
    assert "cell body ran" not in out.out and target.read_text() == "keep"  # not "ran": "ranks" has it
    assert "FALLBACK" not in out.out + out.err  # refused before any rank started


def test_a_folder_that_cannot_be_made_is_reported_not_raised(ip, capsys):
    # /proc/... passes every check (its parent is a folder, root may write) but mkdir fails there: the cell's
    # output came, then a FileNotFoundError traceback from the trace writer; the cell's result must stand.
    ip.run_cell_magic("distributed", "--cpus 2 --profile /proc/kit-no-such-folder", "print('cell body ran')")
    out = capsys.readouterr()
    assert "cell body ran" in out.out
    assert "no trace written: /proc/kit-no-such-folder could not be written" in out.err, out.err[-2000:]


def test_write_replaces_a_regular_file_never_a_symlink(tmp_path):
    trace = merge_profiles({})
    path = tmp_path / "t.json"
    path.write_text("old")
    assert write(trace, str(path)) == str(path)
    assert json.loads(path.read_text())["traceEvents"] == []
    os.symlink(path, tmp_path / "l.json")
    with pytest.raises(FileExistsError, match="symlink"):
        write(trace, str(tmp_path / "l.json"))
    assert sorted(p.name for p in tmp_path.iterdir()) == ["l.json", "t.json"]  # no temp file left


def _profile(rank, boot, spans, offset_us=None, wall_minus_perf_us=0.0):
    return {"rank": rank, "pid": 100 + rank, "boot_id": boot, "offset_us": offset_us,
            "wall_minus_perf_us": wall_minus_perf_us, "start_us": 0.0, "end_us": 0.0, "spans": spans,
            "events": [], "threads": {}, "dropped": 0}


def _span(name, start, end, row="kit"):
    return {"name": name, "cat": "phase", "row": row, "start_us": start, "end_us": end, "args": {}}


def test_partial_overlaps_move_to_an_extra_row():
    spans = [_span("a", 0, 10), _span("b", 5, 15), _span("c", 6, 8), _span("d", 7, 20)]
    trace = merge_profiles({0: _profile(0, "h", spans)})
    assert nesting_problems(trace) == []
    rows = _rows(trace)
    assert sorted(rows.values()) == ["kit", "kit (overlap 1)", "kit (overlap 2)"]
    # the checker itself fails on a bad row
    bad = {"traceEvents": [{"ph": "X", "pid": 0, "tid": 0, "name": n, "ts": s, "dur": d}
                           for n, s, d in (("a", 0, 10), ("b", 5, 10))]}
    assert len(nesting_problems(bad)) == 1


def test_ranks_on_two_hosts_use_the_measured_offset_or_say_they_could_not():
    # rank 1's clock runs 500 us ahead of rank 0's: its span at 1500 happened at 1000 on rank 0's clock
    profs = {0: _profile(0, "host-a", [_span("x", 1000, 1100)], offset_us=0.0),
             1: _profile(1, "host-b", [_span("x", 1500, 1600)], offset_us=500.0)}
    trace = merge_profiles(profs)
    assert trace["otherData"]["clock"] == "ping-pong"
    assert [s["ts"] for s in _spans(trace, name="x")] == [0.0, 0.0]
    profs[1]["offset_us"] = None
    trace = merge_profiles(profs)
    assert trace["otherData"]["clock"] == "system clocks"
    assert any("NTP" in n for n in trace["otherData"]["notes"])


def test_experiment_profile_has_steps_phases_and_a_note(tmp_path):
    from kit.experiments.api import run, shutdown
    from kit.experiments.config import ExperimentConfig

    path = tmp_path / "ddp"
    try:
        rec = run(ExperimentConfig(strategy="ddp", steps=2, warmup_steps=1, model_size="tiny"), profile=str(path))
    finally:
        shutdown()
    trace = json.loads((path / "all_ranks.json").read_text())
    assert sorted(os.listdir(path / "ranks")) == ["rank0.pt.trace.json", "rank1.pt.trace.json"]
    jsonschema.validate(trace, SCHEMA)
    assert nesting_problems(trace) == []
    assert rec["profile"] == str(path) and any("profiled" in n for n in rec["notes"])
    assert "profile" not in json.dumps(rec.get("per_rank", ""))  # the events stay out of the record
    for rank in (0, 1):
        steps = [s["name"] for s in _spans(trace, pid=rank, cat="step")]
        assert steps == ["warm-up step", "step 0", "step 1", "memory probe step"]
        phases = {s["name"] for s in _spans(trace, pid=rank, cat="phase")}
        assert {"forward", "backward", "optimizer"} <= phases
        assert {_rows(trace)[(rank, s["tid"])] for s in _spans(trace, pid=rank) if s["name"].startswith("bucket")} \
            <= {"kit: gradient buckets"} | {f"kit: gradient buckets (overlap {i})" for i in range(1, 9)}


def test_inline_timeline_names_ranks_units_and_what_the_colours_mean(cell_trace):
    from kit.plots.trace import trace_timeline

    fig = trace_timeline(cell_trace)
    ax = fig.axes[0]
    assert "ms" in ax.get_xlabel() and ax.get_title().startswith("Profiler trace: 2 rank(s)")
    labels = [t.get_text() for t in ax.get_yticklabels()]
    assert "rank 0 · torch ops" in labels and "rank 1 · collectives" in labels
    legend = [t.get_text() for t in ax.get_legend().get_texts()]
    assert "communication" in legend
    cells = [t for t in legend if t.startswith("cell ")]  # this shell numbers no cell: the ranks count them
    assert len(cells) == 1 and re.fullmatch(r"cell \d+", cells[0]), legend
    numbered = {"ph": "X", "pid": 0, "tid": 0, "cat": "cell", "name": "In [7]", "ts": 0.0, "dur": 5.0}
    row = {"ph": "M", "pid": 0, "tid": 0, "name": "thread_name", "args": {"name": "kit"}}
    named = trace_timeline({"traceEvents": [row, numbered]}).axes[0].get_legend().get_texts()
    assert [t.get_text() for t in named] == ["cell In [7]"]  # as Jupyter shows it


def test_profile_path_that_is_a_file_or_has_no_parent_says_what_to_name(tmp_path):
    from kit.notebook.profile_cell import check_path
    (tmp_path / "f").write_text("keep")
    with pytest.raises(UsageError, match=r"is a file; the profile is a folder .* e.g. .*traces"):
        check_path(str(tmp_path / "f"))
    with pytest.raises(UsageError, match=r"names a file; the profile is a folder .* e.g. .*/x$"):
        check_path(str(tmp_path / "x.json"))  # the old `--profile trace.json`
    with pytest.raises(UsageError, match=r"does not exist; create it first \(mkdir -p "):
        check_path(str(tmp_path / "no" / "x"))
    assert check_path(str(tmp_path / "x")) == str(tmp_path / "x") and check_path(str(tmp_path)) == str(tmp_path)


def _ranks_calls(folder, op):
    return {r: sum(e.get("name") == op for e in json.loads((folder / "ranks" / f"rank{r}.pt.trace.json").read_text())
                   ["traceEvents"]) for r in (0, 1)}


def test_per_rank_files_are_torchs_own_with_the_rank_in_distributed_info(cell_folder):
    assert sorted(os.listdir(cell_folder)) == ["all_ranks.json", "ranks"]
    for r in (0, 1):
        raw = json.loads((cell_folder / "ranks" / f"rank{r}.pt.trace.json").read_text())
        assert raw["distributedInfo"]["rank"] == r and raw["distributedInfo"]["world_size"] == 2
    assert _ranks_calls(cell_folder, "c10d::allreduce_") == {0: 3, 1: 3}


def test_per_rank_files_load_in_holistic_trace_analysis(cell_folder):
    trace_analysis = pytest.importorskip("hta.trace_analysis", reason="HolisticTraceAnalysis not installed "
                                         "(pip install -e '.[traces]' -c <(echo torch==2.13.0))")
    analysis = trace_analysis.TraceAnalysis(trace_dir=str(cell_folder / "ranks"))
    assert sorted(analysis.t.get_ranks()) == [0, 1]
    symbols = analysis.t.symbol_table.get_sym_table()
    for r in (0, 1):
        names = [symbols[i] for i in analysis.t.get_trace(r)["name"]]
        assert names.count("c10d::allreduce_") == 3 and names.count("gloo:all_reduce") == 3, r


_TB_LOAD = textwrap.dedent("""
    import json, sys, tempfile
    from torch_tb_profiler import io
    from torch_tb_profiler.profiler import RunLoader
    if __name__ == "__main__":  # the plugin's loader starts one spawned process per worker file
        run = RunLoader("cell", sys.argv[1], io.Cache(tempfile.mkdtemp())).load()
        comm = run.get_profile("All", "default").comm_ops["data"]
        print(json.dumps({"workers": run.workers, "comm": {w: t["rows"] for w, t in comm.items()}}))
""")


def test_per_rank_files_load_in_tensorboards_profiler_plugin(cell_folder, tmp_path):
    pytest.importorskip("torch_tb_profiler", reason="torch-tb-profiler not installed "
                        "(pip install -e '.[traces]' -c <(echo torch==2.13.0))")
    script = tmp_path / "tb_load.py"
    script.write_text(_TB_LOAD)
    out = subprocess.run([sys.executable, str(script), str(cell_folder / "ranks")], capture_output=True, text=True,
                         timeout=180)
    assert out.returncode == 0, out.stderr[-3000:]
    seen = json.loads(out.stdout.strip().splitlines()[-1])
    assert seen["workers"] == ["All", "rank0", "rank1"]  # two workers, and the distributed view over both
    for worker in ("rank0", "rank1"):
        assert [row[:2] for row in seen["comm"][worker]] == [["gloo:all_reduce", 3]], seen["comm"]


def _fake_profile(rank):
    raw = {"traceEvents": [], "distributedInfo": {"rank": rank, "world_size": 4}}
    return dict(_profile(rank, "h", [_span("cell", 0, 10)]), torch_trace_gz=gzip.compress(json.dumps(raw).encode()))


def test_a_profile_of_fewer_ranks_leaves_no_rank_file_of_the_earlier_one(tmp_path):
    folder = tmp_path / "p"
    write_profiles({r: _fake_profile(r) for r in range(4)}, str(folder), "4 ranks")
    (folder / "ranks" / "notes.txt").write_text("mine")
    trace = write_profiles({r: _fake_profile(r) for r in range(2)}, str(folder), "2 ranks")
    assert sorted(os.listdir(folder / "ranks")) == ["notes.txt", "rank0.pt.trace.json", "rank1.pt.trace.json"]
    assert trace["otherData"]["files"]["ranks"] == {r: str(folder / "ranks" / f"rank{r}.pt.trace.json")
                                                    for r in (0, 1)}
    assert json.loads((folder / "all_ranks.json").read_text())["otherData"]["ranks"] == [0, 1]


DDP_CELL = """
model = torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(32, 32))
for _ in range(2):
    model(torch.randn(4, 32)).sum().backward()
"""


def test_timeline_says_why_a_ddp_loops_collectives_lane_is_empty(ip, tmp_path):
    """DDP's all-reduces come from its C++ reducer, not from Python, so the kit's collectives lane is empty:
    the picture says where they are instead of leaving it blank with no word why."""
    from kit.plots.trace import trace_timeline

    ip.run_cell_magic("distributed", f"--profile {tmp_path / 'ddp'}", DDP_CELL)
    trace = json.loads((tmp_path / "ddp" / "all_ranks.json").read_text())
    assert not _spans(trace, cat="collective")  # nothing called from Python
    texts = [t.get_text() for t in trace_timeline(trace).axes[0].texts]
    assert len(texts) == 2 and all(t.startswith("no collective called from Python; torch issued") for t in texts), texts
    empty = merge_profiles({0: _profile(0, "h", [_span("cell", 0, 10)])})
    assert [t.get_text() for t in trace_timeline(empty).axes[0].texts] == ["no collective in this cell"]
