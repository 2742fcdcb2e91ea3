"""Keys and notes that must name only what is drawn and stay inside the axes: bytes_by_collective's key among
runs without per-collective counts and beyond 8 runs, place_notes where no place is free, the scaling
prediction's efficiencies where several predictions end at the bottom, and memory in digits, never 1e-05."""
from __future__ import annotations

from typing import Any

import matplotlib

matplotlib.use("Agg")

from kit import plots  # noqa: E402
from kit.plots._notes import place_notes, spread_apart  # noqa: E402
from kit.plots._style import SERIES  # noqa: E402


def _tp(i: int) -> dict[str, Any]:
    """A tp run's record with two collectives counted, as the lab bench's table holds it."""
    per = {"tp/all_reduce": {"payload_bytes": 1e6 * (i + 1)}, "tp/all_gather": {"payload_bytes": 4e5 * (i + 1)}}
    return {"label": f"tp gpt bs32 fp32 tp{2 + i % 3} seq{64 * (i + 1)}", "config": {"strategy": "tp"},
            "comm": {"report": {"measured_per_step": per, "predicted_per_step": per}}}


DDP = {"label": "ddp mlp bs32 fp32 bucket25MiB", "config": {"strategy": "ddp"}, "comm": {"bytes_per_step": 1e6}}


def _key_and_bar_colours(fig: Any) -> tuple[dict[str, str], set[str]]:
    from matplotlib.colors import to_hex

    (key,) = fig.legends
    runs = {t.get_text(): to_hex(h.get_facecolor()) for t, h in zip(key.get_texts(), key.legend_handles)
            if not t.get_text().startswith(("solid", "predicted"))}
    bars = {to_hex(p.get_facecolor()) for ax in fig.axes for p in ax.patches if to_hex(p.get_facecolor()) != "#ffffff"}
    return runs, bars


def test_the_bench_s_runs_key_only_runs_with_bars_each_in_a_colour_of_its_own() -> None:
    """The lab bench passes every run: a ddp run (no per-collective counts) sat in the key with a colour and no
    bars, and with 10 runs the 8 colours repeated (the ddp run and tp run 7 both blue). Now the key names the
    newest 8 runs with bars, one colour each, and the title says which runs are drawn and which are not."""
    fig = plots.bytes_by_collective([DDP] + [_tp(i) for i in range(10)])
    runs, bars = _key_and_bar_colours(fig)
    assert list(runs) == [_tp(i)["label"].removeprefix("tp gpt bs32 fp32 ") for i in range(2, 10)]
    assert fig.legends[0].get_title().get_text() == "all runs: tp gpt bs32 fp32"  # the shared part, said once
    assert len(set(runs.values())) == 8 and set(runs.values()) == bars  # every key entry's colour has bars
    title = fig.axes[0].get_title()
    assert "(last 8 of 10 runs)" in title and "1 run without per-collective counts not drawn" in title, title
    few = plots.bytes_by_collective([DDP] + [_tp(i) for i in range(3)])  # named bars: no key, no cap
    assert "last" not in few.axes[0].get_title() and "1 run without" in few.axes[0].get_title()
    assert "without" not in plots.bytes_by_collective([_tp(0), _tp(1)]).axes[0].get_title()
    from test_plots import text_problems  # noqa: E402 - nothing cut off or overlapping: the title's lines fit

    assert text_problems(fig) == [] and text_problems(few) == []


def _axes(size_in: tuple[float, float]) -> Any:
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=size_in)
    ax.set_xlim(0, 100)
    ax.set_ylim(0, 100)
    return ax


def test_a_note_with_no_free_place_stays_beside_its_point() -> None:
    """Where every place is taken (or off the axes), the note went to the last attempt's place, 11 lines above
    its point, where it read as another point's; now beside it, right-above, or where that leaves the axes
    the nearest place inside them."""
    ax = _axes((4.0, 3.6))
    crowd = [(50.0, 50.0, f"{n}*") for n in range(60)]  # more notes than 12 rings of 4 places hold
    last = place_notes(ax, crowd, size_in=(4.0, 3.6))[-1]
    assert last.xyann == (4, 2), last.xyann
    corner = [(99.0, 99.0, "16*")] * 30  # at the top-right corner right-above is off the axes
    dx, dy = place_notes(_axes((4.0, 3.6)), corner, size_in=(4.0, 3.6))[-1].xyann
    assert dx < 0 and -12 < dy < 0, (dx, dy)


def test_spread_apart_keeps_notes_apart_and_inside() -> None:
    assert spread_apart([0.9, 0.5], 0.1) == [0.9, 0.5]  # far enough apart: untouched
    ats = spread_apart([0.04, 0.03, 0.02, 0.01, 0.0], 0.045, lo=0.02, hi=0.98)
    assert min(ats) >= 0.02 and ats == sorted(ats, reverse=True)  # order kept, none below the axes
    assert all(a - b >= 0.045 - 1e-9 for a, b in zip(ats, ats[1:]))
    tight = spread_apart([0.5] * 30, 0.045, lo=0.0, hi=1.0)  # more than fit: spread evenly, all inside
    assert 0.0 <= min(tight) and max(tight) <= 1.0 and len({round(a, 9) for a in tight}) == 30


def test_efficiencies_of_predictions_ending_at_the_bottom_stay_inside_the_axes() -> None:
    """Five zero3 predictions to 2 ranks on slow links end together at the bottom of the log axis: moved only
    down, the last two efficiencies went below it (under the x axis)."""
    from kit.experiments.theory.prediction import predict

    import test_predict  # noqa: E402 - the predictor's synthetic record

    rec = test_predict.record(buckets=[test_predict.PSI * 40] * 4, strategy="ddp", world_size=2)
    preds = [{**predict(rec, ranks=[1, 2], link=(50.0, g), strategy="zero3"), "label": f"predicted zero3 at {g} GB/s"}
             for g in (0.5, 0.48, 0.46, 0.44, 0.42)]
    fig = plots.scaling_prediction(preds)
    fig.canvas.draw()
    ax = fig.axes[0]
    box = ax.get_window_extent()
    notes = [t for t in ax.texts if t.get_text().endswith("%")]
    assert len(notes) == 5
    out = [t.get_text() for t in notes if not box.y0 - 1 <= t.get_window_extent().y0 <= t.get_window_extent().y1
           <= box.y1 + 1]
    assert out == []
    ys = sorted(t.get_window_extent().y0 for t in notes)
    assert all(b - a > 5 for a, b in zip(ys, ys[1:]))  # each on its own line


def test_memory_totals_never_read_in_scientific_notation() -> None:
    from kit.plots.memory import mib_text

    assert [mib_text(v) for v in (1234567.8, 12345.6, 1234.4, 45.2, 4.52, 0.39, 0.012, 1.2e-5, 0.0)] == \
        ["1,234,568", "12,346", "1,234", "45", "4.5", "0.39", "0.012", "<0.01", "0"]  # thousands separated


def _ddp(label: str, bucket: float, **extra: Any) -> dict[str, Any]:
    from test_plots import make_record  # noqa: E402

    return {**make_record(label, bucket_cap_mb=bucket, step_ms=20 + bucket / 5), **extra}


_BUCKETS = (25, 1, 5, 10, 50, 100)


def test_a_key_of_runs_says_what_they_share_once_and_each_run_what_differs() -> None:
    """6 runs that differ only in the bucket size: each figure that keys several runs names each by its own
    part ("bucket25MiB") and says the shared part once, in the key's heading or the title (e.g. not every key
    line reading "ddp mlp bs32 fp32 bucketNMiB tiny"); the bar numbers match the key's."""
    from test_plots import text_problems  # noqa: E402

    runs = [_ddp(f"ddp mlp bs32 fp32 bucket{b}MiB tiny", b) for b in _BUCKETS]
    own = [f"bucket{b}MiB" for b in _BUCKETS]
    numbered = plots.step_breakdown(runs)
    (key,) = numbered.legends
    assert [t.get_text() for t in key.get_texts()] == [f"{i}: {o}" for i, o in enumerate(own, 1)]
    assert key.get_title().get_text() == "all runs: ddp mlp bs32 fp32 tiny"
    assert [t.get_text() for t in numbered.axes[0].get_xticklabels()] == [str(i) for i in range(1, 7)]
    named = plots.step_breakdown(runs[:3])
    assert [t.get_text() for t in named.axes[0].get_xticklabels()] == own[:3]
    assert named._suptitle.get_text().endswith("\nall runs: ddp mlp bs32 fp32 tiny")
    memory = plots.memory_breakdown(runs[:3])
    assert "all runs: ddp mlp bs32 fp32 tiny" in memory._suptitle.get_text()
    assert [t.get_text() for t in memory.axes[0].texts if "bucket" in t.get_text()] == own[:3]
    sweep = plots.comm_vs_knob(runs[:4], knob="label")
    assert [t.get_text() for t in sweep.axes[0].get_xticklabels()] == own[:4]
    assert sweep._suptitle.get_text().endswith("\nall runs: ddp mlp bs32 fp32 tiny")
    for fig in (numbered, named, memory, sweep):
        assert text_problems(fig) == []
        assert not [t.get_text() for ax in fig.axes for t in ax.get_xticklabels() if "ddp mlp" in t.get_text()]


def test_a_single_run_and_labels_without_a_shared_part_keep_their_whole_labels() -> None:
    """One run keeps its whole label; labels that share nothing (lesson 02's "ddp", "zero1"), that a learner wrote
    with their own line breaks (lesson 03's "1 bucket\\n(cap 25 MiB)"), whose rest would be a bare number
    ("bucket 1 MiB": "1"), that are the same run repeated ("#2") or of which one is all shared part ("ddp mlp"
    beside "ddp mlp ckpt", e.g. not keyed "(nothing else)") are left as they were."""
    from kit.plots._keys import run_keys, split_labels

    assert run_keys([_ddp("ddp mlp bs32 fp32 bucket1MiB tiny", 1)]) == ("", ["ddp mlp bs32 fp32 bucket1MiB tiny"])
    for labels in (["ddp", "zero1"], ["1 bucket\n(cap 25 MiB)", "4 buckets\n(cap 1 MiB)"],
                   ["bucket 1 MiB", "bucket 25 MiB"]):
        assert split_labels(labels) == ("", labels)
    same = [_ddp("ddp mlp bs32 fp32", 25), _ddp("ddp mlp bs32 fp32", 25)]
    assert run_keys(same) == ("", ["ddp mlp bs32 fp32", "ddp mlp bs32 fp32 #2"])
    assert run_keys([_ddp("ddp mlp bs32 fp32", 25), _ddp("ddp mlp bs32 fp32 ckpt", 25),
                     _ddp("ddp mlp bs32 fp32 ckpt", 25, complete=False)]) == \
        ("", ["ddp mlp bs32 fp32", "ddp mlp bs32 fp32 ckpt", "ddp mlp bs32 fp32 ckpt (stopped)"])
    ax = plots.step_breakdown([_ddp("ddp mlp bs32 fp32 bucket1MiB tiny", 1)]).axes[0]
    assert "ddp mlp bs32" in " ".join(t.get_text() for t in ax.get_xticklabels())


def test_the_load_plots_key_each_run_by_what_differs() -> None:
    def ep(cf: int) -> dict[str, Any]:
        layer = {"routed": [9, 12], "kept": [8, 12], "dropped": [1, 0], "capacity_per_rank": 4, "ranks": 2}
        return {"label": f"ep gpt bs8 fp32 E2 top1 cf{cf}", "comm": {"report": {"expert_load": [layer]}}}

    fig = plots.expert_load([ep(1), ep(2)])
    texts = [t.get_text() for t in fig.axes[0].get_legend().get_texts()]
    assert texts[:2] == ["kept: cf1", "kept: cf2"], texts
    assert "all runs: ep gpt bs8 fp32 E2 top1" in fig._suptitle.get_text()


def test_a_stopped_run_keeps_the_shared_part_key_in_every_figure() -> None:
    """One run stopped mid-way among runs that share a label part: every figure (the load plots, step_breakdown,
    comm_vs_knob by label) keys them alike: the shared part once, each run by its own part, the stopped one
    marked (e.g. not expert_load keying "kept: ep gpt bs8 fp32 E2 top1 cf1" three times, nor comm_vs_knob
    leaving the stopped run unmarked)."""
    def ep(cf: int, **extra: Any) -> dict[str, Any]:
        layer = {"routed": [9, 12], "kept": [8, 12], "dropped": [1, 0], "capacity_per_rank": 4, "ranks": 2}
        work = {"score_entries_per_rank": [10, 26], "layers": 2}
        return {"label": f"ep gpt bs8 fp32 E2 top1 cf{cf}", **extra,
                "comm": {"report": {"expert_load": [layer], "attention_work": work}}}

    runs = [ep(1), ep(2), ep(4, complete=False)]
    own = ["cf1", "cf2", "cf4 (stopped)"]
    load = plots.expert_load(runs)
    assert [t.get_text() for t in load.axes[0].get_legend().get_texts()][:3] == [f"kept: {o}" for o in own]
    assert load._suptitle.get_text().endswith("; all runs: ep gpt bs8 fp32 E2 top1")
    ring = plots.ring_balance(runs)
    assert [t.get_text().split(",")[0] for t in ring.axes[0].get_legend().get_texts()] == own
    assert ring._suptitle.get_text().endswith("; all runs: ep gpt bs8 fp32 E2 top1")
    ddp = [_ddp(f"ddp mlp bs32 fp32 bucket{b}MiB tiny", b, complete=b != 10) for b in (25, 1, 10)]
    steps = plots.step_breakdown(ddp)
    ddp_own = ["bucket25MiB", "bucket1MiB", "bucket10MiB (stopped)"]
    assert [t.get_text().replace("\n", " ") for t in steps.axes[0].get_xticklabels()] == ddp_own
    assert steps._suptitle.get_text().endswith("\nall runs: ddp mlp bs32 fp32 tiny")
    sweep = plots.comm_vs_knob(ddp, knob="label")
    assert [t.get_text().replace("\n", " ") for t in sweep.axes[0].get_xticklabels()] == ddp_own
    assert sweep._suptitle.get_text().endswith("\nall runs: ddp mlp bs32 fp32 tiny")
    # repeats of one label are numbered after the split, the stopped mark before the number
    again = plots.expert_load([ep(1), ep(2), ep(2), ep(2, complete=False), ep(2, complete=False)])
    assert [t.get_text() for t in again.axes[0].get_legend().get_texts()][:5] == \
        ["kept: cf1", "kept: cf2", "kept: cf2 #2", "kept: cf2 (stopped)", "kept: cf2 (stopped) #2"]
    from test_plots import text_problems  # noqa: E402

    for fig in (load, ring, steps, sweep, again):
        assert text_problems(fig) == []


def test_bytes_by_collective_of_many_mesh_dimensions_is_no_taller_than_wide() -> None:
    """3 runs whose 5 collectives lie in 5 mesh dimensions (a tp run on a dp x tp mesh, a cp and an ep run): the
    panels stand side by side, wider before taller, so the figure is no taller than wide (e.g. not 5 panels one
    above the other, 6.0 x 13.2 in, twice as tall as a laptop shows at once); each panel draws its dimension's
    bars."""
    from test_plots import text_problems  # noqa: E402

    def run(label: str, per: dict[str, float]) -> dict[str, Any]:
        counts = {k: {"payload_bytes": b} for k, b in per.items()}
        return {"label": label, "comm": {"report": {"measured_per_step": counts, "predicted_per_step": counts}}}

    trial = [run("tp x4 gpt bs32 fp32 dp2xtp2", {"tp/all_reduce": 3.1e6, "dp/all_reduce": 1.3e6}),
             run("cp gpt bs32 fp32 zigzag", {"cp/send": 6.1e6}),
             run("ep gpt bs32 fp32 E4 top2", {"ep/all_to_all": 2.2e6, "ep_counts/all_to_all": 64.0})]
    one = run("tp x8 gpt bs32 fp32", {f"{d}/all_reduce": 1e6 for d in ("tp", "dp", "pp", "cp", "ep")})
    many = [run(f"tp x8 gpt bs32 fp32 seq{64 * i}", {f"{d}/{k}": 1e6 * i for d in ("tp", "dp", "fsdp", "cp", "ep")
                                                     for k in ("all_gather", "reduce_scatter")}) for i in (1, 2, 3)]
    for name, fig in (("3 runs, 5 dimensions", plots.bytes_by_collective(trial)),
                      ("1 run, 5 dimensions", plots.bytes_by_collective(one)),
                      ("3 runs, 5 dimensions of 2 collectives", plots.bytes_by_collective(many))):
        w, h = fig.get_size_inches()
        assert w <= 9.6 and h <= 1.05 * w, (name, w, h)
        assert len(fig.axes) == 5, name  # one panel per dimension, the empty place of a grid removed
        assert text_problems(fig) == [], name
    fig = plots.bytes_by_collective(trial)
    assert [ax.get_ylabel().split()[0] for ax in fig.axes] == ["tp", "dp", "cp", "ep", "ep_counts"]
    assert fig._suptitle.get_text().startswith("Bytes per mesh dimension")  # over all the panels, not the first
    heights = sorted(round(p.get_height()) for ax in fig.axes for p in ax.patches if p.get_facecolor()[:3] != (1, 1, 1))
    assert heights == sorted(round(b / 1024) for b in (3.1e6, 1.3e6, 6.1e6, 2.2e6, 64.0))
    empty = plots.bytes_by_collective([DDP])  # no dimension to lay out: says what it lacks (a grid of 0 rows raised)
    assert "no per-collective counts" in empty.axes[0].texts[0].get_text()
