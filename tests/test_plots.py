"""Every plot on Agg, asserting on what was drawn (bar heights, line data, labels).

Records here are built by hand: they are the plots' *inputs*, so a hand-made record tests the
drawing exactly. The widget tests feed plots with real runs.
"""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import matplotlib
import pytest

matplotlib.use("Agg")

from kit import plots  # noqa: E402
from kit.plots import _style  # noqa: E402

ARTIFACTS = Path(__file__).parent / "artifacts"


def make_record(label: str, *, world_size: int = 2, bucket_cap_mb: float = 25.0,
                strategy: str = "ddp", emulated: bool = False, step_ms: float = 20.0,
                comm_exposed_ms: float = 2.0, samples: int = 32) -> dict[str, Any]:
    summary = {"step_ms": step_ms, "fwd_ms": 5.0, "bwd_ms": 9.0, "opt_ms": 3.0,
               "comm_ms": 6.0, "comm_overlap_ms": 4.0, "comm_exposed_ms": comm_exposed_ms,
               "comm_overhead_pct": 100 * comm_exposed_ms / step_ms,
               "throughput_samples_s": samples * world_size * 1000 / step_ms,
               "peak_mib": None, "loss_final": 1.0, "bytes_per_step": 4096, "bubble_pct": None}
    mem = [{"rank": r, "params_mib": 10.0, "grads_mib": 10.0, "optimizer_mib": 20.0,
            "activations_mib": 5.0 + r, "peak_mib": 50.0 + r,
            "predicted": {"params_mib": 10.0, "grads_mib": 10.0, "optimizer_mib": 20.0,
                          "activations_mib": 4.0}} for r in range(world_size)]
    timeline = []
    for r in range(world_size):
        timeline += [
            {"rank": r, "name": "forward", "kind": "compute", "start_ms": 100.0, "end_ms": 105.0},
            {"rank": r, "name": "backward", "kind": "compute", "start_ms": 105.0, "end_ms": 114.0},
            {"rank": r, "name": "bucket 1", "kind": "comm", "start_ms": 109.0, "end_ms": 112.0},
            {"rank": r, "name": "bucket 0", "kind": "comm", "start_ms": 112.5, "end_ms": 116.0},
            {"rank": r, "name": "optimizer", "kind": "compute", "start_ms": 116.0,
             "end_ms": 119.0},
        ]
    return {"schema": "kit.run/1", "run_id": label, "created_unix_s": 0.0, "label": label,
            "config": {"strategy": strategy, "workload": "mlp", "world_size": world_size,
                       "batch_size": samples, "bucket_cap_mb": bucket_cap_mb, "seed": 0,
                       "interconnect": "ethernet" if emulated else None},
            "env": {"backend": "gloo"}, "emulated": emulated, "notes": [], "steps": [],
            "memory": mem, "timeline": timeline,
            "comm": {"bytes_per_step": 4096, "buckets": []}, "summary": summary}


def collective_record(emulated: bool = False) -> dict[str, Any]:
    alpha_us, beta = 50.0, 2.0
    pts = []
    for k in range(10, 25, 2):
        n = 2**k
        t_ms = (alpha_us * 1e-6 + n / (beta * 1e9)) * 1e3
        alg = n / (t_ms * 1e-3) / 1e9
        pts.append({"bytes": n, "time_ms": t_ms, "algbw_gbps": alg, "busbw_gbps": alg * 1.0})
    return {"schema": "kit.collectives/1", "op": "all_reduce", "world_size": 2,
            "backend": "gloo", "device_type": "cpu", "emulated": emulated, "points": pts,
            "fit": {"alpha_us": alpha_us, "beta_gbps": beta, "residuals_pct": [0.0] * len(pts)}}


def _save(fig: Any, name: str) -> None:
    ARTIFACTS.mkdir(exist_ok=True)
    fig.savefig(ARTIFACTS / f"plot_{name}.png")


def _save_drawn(fig: Any, name: str) -> None:
    """The pixels of the figure's last Agg draw as a PNG, for a human to look at: a savefig would draw
    it again (two thirds of the family test's time)."""
    import numpy as np
    from PIL import Image  # matplotlib's own dependency

    ARTIFACTS.mkdir(exist_ok=True)
    Image.fromarray(np.asarray(fig.canvas.buffer_rgba())).save(ARTIFACTS / f"plot_{name}.png")


def _bars(ax: Any, label: str) -> list[float]:
    (cont,) = [c for c in ax.containers if c.get_label() == label]
    return [b.get_height() for b in cont]


def test_import_is_cheap() -> None:
    code = "import sys, kit.plots; print('matplotlib' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True, env={**os.environ, "PYTHONPATH": str(Path.cwd())})
    assert out.stdout.strip() == "False"


def test_step_breakdown_heights_sum_to_step() -> None:
    recs = [make_record("bucket 1 MiB", bucket_cap_mb=1, step_ms=30.0, comm_exposed_ms=8.0),
            make_record("bucket 25 MiB", step_ms=20.0, comm_exposed_ms=2.0, emulated=True)]
    fig = plots.step_breakdown(recs)
    ax = fig.axes[0]
    assert _bars(ax, "forward") == [5.0, 5.0]
    assert _bars(ax, "backward") == [9.0, 9.0]
    assert _bars(ax, "comm exposed (lengthens step)") == [8.0, 2.0]
    assert _bars(ax, "comm overlapped with backward") == [4.0, 4.0]
    other = _bars(ax, "other (data, sync, Python)")
    assert other == pytest.approx([5.0, 1.0])
    # The stack adds up to the measured step.
    for i, step in enumerate((30.0, 20.0)):
        total = sum(_bars(ax, k)[i] for k in ("forward", "backward", "optimizer",
                    "comm exposed (lengthens step)", "other (data, sync, Python)"))
        assert total == pytest.approx(step)
    assert [t.get_text() for t in ax.get_xticklabels()] == ["bucket 1 MiB", "bucket 25 MiB"]
    assert "ms" in ax.get_ylabel()
    exposed = [c for c in ax.containers if c.get_label().startswith("comm exposed")][0]
    assert [b.get_hatch() for b in exposed] == [None, _style.EMULATED_HATCH]
    assert any("emulated" in t.get_text() for t in ax.get_legend().get_texts())
    _save(fig, "step_breakdown")


def test_step_segments_no_double_count_when_backward_includes_wait() -> None:
    seg = plots.step_segments({"step_ms": 20, "fwd_ms": 5, "bwd_ms": 12, "opt_ms": 3,
                               "comm_exposed_ms": 3, "comm_overlap_ms": 2})
    assert seg["bwd"] == 9 and seg["other"] == 0
    assert sum(seg[k] for k in ("fwd", "bwd", "opt", "comm_exposed", "other")) == 20


def test_memory_breakdown_measured_and_predicted() -> None:
    fig = plots.memory_breakdown([make_record("ddp")])
    ax = fig.axes[0]
    assert _bars(ax, "activations") == [5.0, 6.0]
    assert _bars(ax, "activations (predicted)") == [4.0, 4.0]
    pred = [c for c in ax.containers if c.get_label() == "parameters (predicted)"][0]
    assert all(b.get_hatch() == _style.PREDICTED_HATCH for b in pred)
    assert [t.get_text() for t in ax.get_xticklabels()] == ["rank 0", "rank 1"]
    assert ax.get_ylabel() == "memory per rank (MiB)"
    peaks = [c for c in ax.collections if c.get_label() == "measured peak"][0]
    assert list(peaks.get_offsets()[:, 1]) == [50.0, 51.0]
    _save(fig, "memory")


def test_memory_labels_small_bars_and_says_which_runs_it_shows() -> None:
    """A 0.45 MiB bar is labelled "0.45", not "0"; a plot that shows only the last runs says so ("last 4 of 7 runs")."""
    from kit.widgets.render import draw_plot

    tiny = make_record("tiny", world_size=1)
    tiny["memory"][0].update(params_mib=0.1, grads_mib=0.1, optimizer_mib=0.2, activations_mib=0.05)
    ax = plots.memory_breakdown(tiny).axes[0]
    assert [t.get_text() for t in ax.texts] == ["0.45"]
    assert [plots.memory.mib_text(v) for v in (1234.4, 45.2, 4.52, 0.0)] == ["1,234", "45", "4.5", "0"]
    recs = [make_record(f"run{i}") for i in range(7)]
    fig = draw_plot("memory_breakdown", recs)
    assert "last 4 of 7 runs" in fig._suptitle.get_text()
    assert len(fig.axes[0].get_xticklabels()) == 4 * 2  # 4 runs x 2 ranks
    assert "last 3 of 7 runs" in plots.memory_breakdown(recs, max_runs=3)._suptitle.get_text()
    assert "last" not in plots.memory_breakdown(recs[:2], max_runs=3)._suptitle.get_text()  # all shown: no note


def test_comm_vs_knob_uses_knob_values() -> None:
    recs = [make_record(f"b{b}", bucket_cap_mb=b, step_ms=s, comm_exposed_ms=e)
            for b, s, e in ((100, 22.0, 1.0), (1, 30.0, 9.0), (25, 20.0, 2.0))]
    fig = plots.comm_vs_knob(recs)
    ax_pct, ax_thr = fig.axes
    line = ax_pct.get_lines()[0]
    assert list(line.get_xdata()) == [1.0, 25.0, 100.0]
    assert list(line.get_ydata()) == pytest.approx([30.0, 10.0, 100 / 22])
    assert ax_pct.get_xscale() == "log"
    assert ax_pct.get_xlabel() == "bucket_cap_mb (MiB)"  # the unit, also without the bench's label
    assert list(ax_thr.get_lines()[0].get_ydata()) == pytest.approx(
        [64000 / 30, 3200.0, 64000 / 22])
    assert "throughput" in ax_thr.get_ylabel() and "samples/s" in ax_thr.get_ylabel()
    _save(fig, "comm_vs_knob")


def test_comm_vs_knob_categorical_and_emulated() -> None:
    recs = [make_record("plain"), make_record("eth", emulated=True)]
    fig = plots.comm_vs_knob(recs, knob="interconnect")
    ax = fig.axes[0]
    assert [t.get_text() for t in ax.get_xticklabels()] == ["none", "ethernet"]
    assert any("emulated" in t.get_text() for t in fig.legends[0].get_texts())  # under both panels


def test_scaling_ideal_and_predicted() -> None:
    recs = [make_record(f"n{n}", world_size=n, step_ms=20.0 * (1 + 0.1 * (n - 1)))
            for n in (1, 2, 4)]
    fig = plots.scaling(recs, predicted={1: 1600.0, 2: 3000.0, 4: 5000.0})
    ax = fig.axes[0]
    lines = {ln.get_label(): ln for ln in ax.get_lines()}
    measured = lines["measured (ddp mlp)"]  # names what the learner ran
    assert list(measured.get_xdata()) == [1.0, 2.0, 4.0]
    thr = [32 * n * 1000 / (20.0 * (1 + 0.1 * (n - 1))) for n in (1, 2, 4)]
    assert list(measured.get_ydata()) == pytest.approx(thr)
    assert list(lines["ideal linear"].get_ydata()) == pytest.approx([thr[0] * n for n in (1, 2, 4)])
    assert list(lines["predicted (model)"].get_ydata()) == [1600.0, 3000.0, 5000.0]
    texts = [t.get_text() for t in ax.texts]
    assert f"{100 * thr[2] / (4 * thr[0]):.0f}%" in texts
    assert ax.get_xlabel() == "world size (ranks)"
    _save(fig, "scaling")


def test_scaling_joins_only_runs_that_differ_in_world_size() -> None:
    """Runs that differ in more than the world size (ws=2 bs32, ws=4 bs64) are not joined by one "scaling" line."""
    recs = [make_record("a", world_size=2), make_record("b", world_size=4), make_record("c", world_size=4,
                                                                                     samples=64)]
    recs[2]["config"]["batch_size"] = 64
    ax = plots.scaling(recs).axes[0]
    measured = {ln.get_label(): list(ln.get_xdata()) for ln in ax.get_lines() if ln.get_label().startswith("measured")}
    assert measured == {"measured (batch_size=32)": [2.0, 4.0], "measured (batch_size=64)": [4.0]}
    assert len([ln for ln in ax.get_lines() if ln.get_label() == "ideal linear"]) == 1  # one legend entry


def test_timeline_lanes_and_shift() -> None:
    rec = make_record("ddp", emulated=True)
    fig = plots.step_timeline(rec)
    ax = fig.axes[0]
    comm = [c for c in ax.collections if c.get_label() == "communication (bucket all-reduce)"]
    assert comm, "comm bars drawn"
    # First comm bar of rank 0: bucket 1 from 9 ms (shifted from 109) for 3 ms, hatched.
    path = comm[0].get_paths()[0].vertices
    assert path[:, 0].min() == pytest.approx(9.0) and path[:, 0].max() == pytest.approx(12.0)
    assert comm[0].get_hatch() == _style.EMULATED_HATCH
    assert ax.get_xlim() == pytest.approx((0.0, 19.0))
    top_down = [t.get_text() for t in sorted(ax.get_yticklabels(),
                                              key=lambda t: -t.get_position()[1])]
    assert top_down == ["rank 0 compute", "rank 0 comm", "rank 1 compute", "rank 1 comm"]
    assert "bucket 1" in [t.get_text() for t in ax.texts]
    _save(fig, "timeline")


def test_timeline_concurrent_comm_gets_sub_lanes() -> None:
    rec = make_record("ddp", world_size=1)
    rec["timeline"] = [
        {"rank": 0, "name": "backward", "kind": "compute", "start_ms": 0.0, "end_ms": 10.0},
        {"rank": 0, "name": "all_reduce #0", "kind": "comm", "start_ms": 2.0, "end_ms": 8.0},
        {"rank": 0, "name": "all_reduce #1", "kind": "comm", "start_ms": 4.0, "end_ms": 9.0},
    ]
    ax = plots.step_timeline(rec).axes[0]
    comm = [c for c in ax.collections if c.get_facecolor()[0][0] > 0.8]  # vermillion bars
    lows = sorted(c.get_paths()[0].vertices[:, 1].min() for c in comm)
    assert len(lows) == 2 and lows[0] != lows[1], "overlapping all-reduces sit in two sub-lanes"


def test_timeline_splits_an_emulated_bucket_into_queue_and_wire() -> None:
    # A custom link of 2 x 50 us + 1e6 B / 0.25 GB/s = 4.1 ms per 1 MB bucket on 2 ranks: the
    # last 4.1 ms of the 2-12 ms bar are the wire, the first 5.9 ms all-reduce + queueing.
    rec = make_record("ddp", world_size=1, emulated=True)
    rec["config"].update(interconnect="custom", link_alpha_us=50.0, link_gbps=0.25, world_size=2)
    rec["comm"]["buckets"] = [{"index": 0, "bytes": 1_000_000}]
    rec["timeline"] = [
        {"rank": 0, "name": "backward", "kind": "compute", "start_ms": 0.0, "end_ms": 10.0},
        {"rank": 0, "name": "all_reduce #0", "kind": "comm", "start_ms": 2.0, "end_ms": 12.0},
    ]
    ax = plots.step_timeline(rec).axes[0]
    wire = [c for c in ax.collections if c.get_label() == "on the emulated wire (link time)"]
    before = [c for c in ax.collections if c.get_label() == "all-reduce + waiting for the link"]
    assert wire and before
    xs = wire[0].get_paths()[0].vertices[:, 0]
    assert xs.min() == pytest.approx(12.0 - 4.1) and xs.max() == pytest.approx(12.0)
    assert wire[0].get_hatch() == _style.EMULATED_HATCH
    xb = before[0].get_paths()[0].vertices[:, 0]
    assert xb.min() == pytest.approx(2.0) and xb.max() == pytest.approx(12.0 - 4.1)


def test_timeline_names_send_recv_as_what_they_are() -> None:
    """Model-parallel and pipeline sends are labelled as sends, not "bucket all-reduce" (a DDP-only thing)."""
    rec = make_record("model_parallel", world_size=2, strategy="model_parallel")
    rec["timeline"] = [
        {"rank": 0, "name": "forward", "kind": "compute", "start_ms": 0.0, "end_ms": 4.0},
        {"rank": 0, "name": "send to 1", "kind": "comm", "start_ms": 4.0, "end_ms": 5.0},
        {"rank": 1, "name": "recv from 0", "kind": "idle", "start_ms": 0.0, "end_ms": 5.0},
        {"rank": 1, "name": "forward", "kind": "compute", "start_ms": 5.0, "end_ms": 9.0},
    ]
    labels = {c.get_label() for c in plots.step_timeline(rec).axes[0].collections}
    # the send bar is only the isend call (gloo returns once it is posted), not a wait for the receiver
    assert "send between stages (isend posted; delivery waited before the optimizer)" in labels
    assert not any("bucket" in str(label) for label in labels)


def test_timeline_gives_each_colour_one_legend_entry() -> None:
    """A mesh colours its comm bars by dimension: HSDP's fsdp all-gathers and reduce-scatters are one green,
    so the legend has one green entry naming both (it had two green entries nobody could tell apart)."""
    rec = make_record("fsdp x4 gpt dp2xfsdp2", world_size=2, strategy="fsdp")
    rec["timeline"] = [{"rank": r, "name": n, "kind": k, "start_ms": a, "end_ms": b} for r in (0, 1)
                       for n, k, a, b in (("forward", "compute", 0.0, 4.0), ("fsdp all_gather", "comm", 0.5, 1.0),
                                          ("backward", "compute", 4.0, 9.0), ("fsdp reduce_scatter", "comm", 6.0, 7.0),
                                          ("dp all_reduce", "comm", 7.0, 8.0))]
    ax = plots.step_timeline(rec).axes[0]
    legend = ax.get_legend()
    entries = [(t.get_text(), tuple(float(c) for c in h.get_facecolor()))
               for t, h in zip(legend.get_texts(), legend.legend_handles) if t.get_text().startswith("communication")]
    assert len({c for _, c in entries}) == len(entries), entries  # no two entries share a colour
    assert [label for label, _ in entries] == ["communication (fsdp all_gather, fsdp reduce_scatter)",
                                               "communication (dp all_reduce)"]


def test_timeline_without_events_says_why() -> None:
    rec = make_record("x")
    rec["timeline"] = []
    fig = plots.step_timeline(rec)
    assert "no timeline" in fig.axes[0].texts[0].get_text()


def test_bandwidth_points_and_fit() -> None:
    rec = collective_record()
    fig = plots.bandwidth([rec, collective_record(emulated=True)])
    ax = fig.axes[0]
    pts = ax.get_lines()[0]
    assert list(pts.get_xdata()) == [float(p["bytes"]) for p in rec["points"]]
    assert list(pts.get_ydata()) == pytest.approx([p["busbw_gbps"] for p in rec["points"]])
    fit = ax.get_lines()[1]
    assert "alpha-beta fit" in fit.get_label()
    # The fit passes through the synthetic points (they were generated from it).
    assert fit.get_ydata()[0] == pytest.approx(rec["points"][0]["busbw_gbps"])
    assert fit.get_ydata()[-1] == pytest.approx(rec["points"][-1]["busbw_gbps"])
    assert ax.get_xscale() == "log" and "GB/s" in ax.get_ylabel()
    assert any("emulated" in t.get_text() for t in ax.get_legend().get_texts())
    _save(fig, "bandwidth")


def test_bandwidth_lays_out_its_residual_panel_directly(monkeypatch) -> None:
    """The fit above, its residuals below (a third of its height, the same x axis), laid out by
    `new_figure(mosaic=...)`: no axes is made only to be removed."""
    from matplotlib.figure import Figure

    removed = []
    monkeypatch.setattr(Figure, "delaxes", lambda fig, ax: removed.append(ax))
    fig = plots.bandwidth([collective_record()])
    ax, rax = fig.axes
    assert removed == [] and ax.get_shared_x_axes().joined(ax, rax)
    assert list(ax.get_subplotspec().get_gridspec().get_height_ratios()) == [3, 1]
    assert rax.get_ylabel() == "fit residual (%)"


def test_bandwidth_fit_label_gives_the_busbw_its_line_levels_at() -> None:
    """Lesson 01's all_gather legend said beta=1.28 GB/s beside a dashed busbw line that levelled at 0.64 (busbw
    is half the payload rate for all_gather on 2 ranks): the label now gives the level the line is drawn at."""
    import re

    rec = collective_record()
    rec["op"] = "all_gather"
    for p in rec["points"]:
        p["busbw_gbps"] = p["algbw_gbps"] * 0.5
    fit = plots.bandwidth([rec]).axes[0].get_lines()[1]
    assert "beta=2.00 GB/s" in fit.get_label()
    level = re.search(r"busbw ([0-9.]+)", fit.get_label())
    assert level, fit.get_label()
    assert float(level.group(1)) == pytest.approx(fit.get_ydata()[-1], rel=0.05)
    assert "busbw" not in plots.bandwidth([collective_record()]).axes[0].get_lines()[1].get_label()


def test_plots_registry_names_exist() -> None:
    for name in plots.PLOTS.values():
        assert callable(getattr(plots, name))


def test_figures_display_as_png_in_a_fresh_ipython_without_pyplot():
    """Kit figures never touch pyplot, so a fresh kernel would show only '<Figure ...>'."""
    from IPython.testing.globalipapp import start_ipython

    from kit.plots import bandwidth

    shell = start_ipython() or __import__("IPython").get_ipython()  # IPython 7.34 returns None on a 2nd call
    rec = {"schema": "kit.collectives/1", "op": "all_reduce", "world_size": 2, "backend": "gloo",
           "device_type": "cpu", "emulated": False,
           "points": [{"bytes": b, "time_ms": 0.1 + b / 1e6, "algbw_gbps": b / (0.1 + b / 1e6) / 1e6,
                       "busbw_gbps": b / (0.1 + b / 1e6) / 1e6} for b in (1024, 65536, 1 << 20)],
           "fit": {"alpha_us": 100.0, "beta_gbps": 1.0, "residuals_pct": [0.0, 0.0, 0.0]}}
    fig = bandwidth([rec])
    png = shell.display_formatter.formatters["image/png"]  # the one ipykernel uses for Out[]
    assert png.lookup(fig)(fig)[:4] == b"\x89PNG"


def with_spread(rec: dict[str, Any], step: tuple[float, float, float],
                thr: tuple[float, float, float] | None = None, repeats: int = 0) -> dict[str, Any]:
    """Add a kit.run/2 spread: (median, low, high) of step_ms (and of throughput)."""
    def sp(med: float, lo: float, hi: float) -> dict[str, float]:
        return {"median": med, "q1": lo, "q3": hi, "iqr": hi - lo, "min": lo, "max": hi,
                "n": repeats or 20}
    phases = {"fwd_ms": sp(4.0, 3.5, 4.5), "bwd_ms": sp(8.0, 7.0, 9.0), "opt_ms": sp(2.0, 2, 2),
              "comm_exposed_ms": sp(1.0, 0.5, 1.5), "comm_overlap_ms": sp(3.0, 3, 3),
              "step_ms": sp(*step)}
    if thr:
        phases["throughput_samples_s"] = sp(*thr)
    rec = {**rec, "schema": "kit.run/2", "complete": True}
    rec["repeat_spread" if repeats else "spread"] = phases
    return rec


def _whisker_segments(ax: Any) -> list[tuple[float, float]]:
    """(low, high) of every vertical error-bar segment drawn on the axes."""
    from matplotlib.collections import LineCollection

    out = []
    for coll in ax.collections:
        if isinstance(coll, LineCollection):
            for seg in coll.get_segments():
                if len(seg) == 2 and seg[0][0] == seg[1][0]:
                    out.append((float(min(seg[:, 1])), float(max(seg[:, 1]))))
    return out


def test_step_breakdown_draws_medians_with_labelled_whiskers() -> None:
    recs = [with_spread(make_record("a", step_ms=40.0), (18.0, 16.0, 25.0)),
            with_spread(make_record("b", step_ms=40.0), (20.0, 17.0, 30.0), repeats=5)]
    ax = plots.step_breakdown(recs).axes[0]
    # Segments are the phase medians, not the summary means (5, 9, 3 in make_record).
    assert _bars(ax, "forward") == [4.0, 4.0] and _bars(ax, "backward") == [8.0, 8.0]
    other = _bars(ax, "other (data, sync, Python)")
    assert other == pytest.approx([18.0 - 15.0, 20.0 - 15.0])  # the stack sums to the median step
    assert sorted(_whisker_segments(ax)) == [(16.0, 25.0), (17.0, 30.0)]
    legend = [t.get_text() for t in ax.get_legend().get_texts()]
    assert "median; whiskers: IQR of steps / min-max of 5 repeats" in legend
    _save(ax.figure, "step_breakdown_spread")


def test_old_records_still_draw_without_whiskers() -> None:
    ax = plots.step_breakdown([make_record("old")]).axes[0]
    assert _whisker_segments(ax) == []
    assert not any("whiskers" in t.get_text() for t in ax.get_legend().get_texts())


def with_opt_cpu(rec: dict[str, Any], med: float) -> dict[str, Any]:
    """The optimizer phase's CPU time as a kit.run/2 record's spread carries it (lesson 06's runs)."""
    spread = {**rec.get("spread", {}), "opt_cpu_ms": {"median": med, "q1": med, "q3": med, "iqr": 0.0,
                                                       "min": med, "max": med, "n": 20}}
    return {**rec, "spread": spread}


def test_step_breakdown_brackets_the_optimizer_cpu_time_beside_the_stack() -> None:
    """opt_cpu_ms overlaps the wall-clock optimizer phase, so it is a bracket beside the bar spanning the CPU
    time from the optimizer segment's bottom (fwd 4 + bwd 8 + exposed 1 = 13), never a stacked segment:
    the stack still sums to the step. A record saved before it was timed has no bracket."""
    from kit.plots.steps import OPT_CPU_LABEL

    recs = [with_opt_cpu(with_spread(make_record("ddp"), (18.0, 16.0, 20.0)), 1.5),
            with_spread(make_record("torchrun ddp"), (18.0, 16.0, 20.0))]
    ax = plots.step_breakdown(recs).axes[0]
    stack = ("forward", "backward", "comm exposed (lengthens step)", "optimizer", "other (data, sync, Python)")
    assert [sum(_bars(ax, k)[i] for k in stack) for i in (0, 1)] == pytest.approx([18.0, 18.0])
    (line,) = [ln for ln in ax.get_lines() if ln.get_label() == OPT_CPU_LABEL]
    xs, ys = line.get_xdata(), line.get_ydata()
    assert (min(ys), max(ys)) == pytest.approx((13.0, 14.5)) and min(xs) > 0.3 and max(xs) < 0.5  # run 0, beside
    legend = [t.get_text() for t in ax.get_legend().get_texts()]
    assert legend.index(OPT_CPU_LABEL) == legend.index("optimizer") + 1
    old = plots.step_breakdown([make_record("old")]).axes[0]
    assert not [ln for ln in old.get_lines() if ln.get_label() == OPT_CPU_LABEL]
    assert OPT_CPU_LABEL not in [t.get_text() for t in old.get_legend().get_texts()]
    _save(ax.figure, "step_breakdown_opt_cpu")


def test_comm_vs_knob_whiskers_and_knob_label() -> None:
    recs = [with_spread(make_record(f"b{b}", bucket_cap_mb=b), (20.0, 18.0, 22.0),
                        thr=(3000.0 + b, 2800.0 + b, 3100.0 + b)) for b in (1, 25)]
    fig = plots.comm_vs_knob(recs, knob_label="bucket size (MiB)")
    ax_pct, ax_thr = fig.axes
    assert ax_pct.get_xlabel() == ax_thr.get_xlabel() == "bucket size (MiB)"
    assert list(ax_thr.get_lines()[0].get_ydata()) == [3001.0, 3025.0]  # medians
    assert sorted(_whisker_segments(ax_thr)) == [(2801.0, 3101.0), (2825.0, 3125.0)]
    assert any("whiskers: IQR" in t.get_text() for t in fig.legends[0].get_texts())
    assert "bucket size (MiB)" in fig._suptitle.get_text()


def test_stopped_run_is_labelled_stopped() -> None:
    rec = {**make_record("ddp"), "complete": False}
    ax = plots.step_breakdown([rec]).axes[0]
    assert [t.get_text() for t in ax.get_xticklabels()] == ["ddp (stopped)"]



def test_a_sweep_plots_legend_never_covers_its_data() -> None:
    """A one-point sweep (and every sweep or scaling plot): the legend sits under the axes. Before, loc="best"
    put it over the Throughput panel's one point and its whisker. The check is on the drawn figure: the
    legend's box shares no pixel with any axes, where the data are."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg

    one = [with_spread(make_record("b5", bucket_cap_mb=5), (20.0, 18.0, 22.0), thr=(3000.0, 2800.0, 3100.0))]
    figs = {"one_point_sweep": plots.comm_vs_knob(one, knob="bucket_cap_mb"),
            "sweep": plots.comm_vs_knob([make_record(f"b{b}", bucket_cap_mb=b, emulated=b > 5) for b in (1, 5, 25)]),
            "categorical_sweep": plots.comm_vs_knob([make_record("p"), make_record("e", emulated=True)],
                                                    knob="interconnect"),
            "scaling": plots.scaling([make_record(f"n{n}", world_size=n) for n in (1, 2, 4)],
                                     predicted={1: 1600.0, 2: 3000.0, 4: 5000.0}),
            "one_point_scaling": plots.scaling(one)}
    for name, fig in figs.items():
        canvas = FigureCanvasAgg(fig)
        canvas.draw()
        renderer = canvas.get_renderer()
        legends = fig.legends + [ax.get_legend() for ax in fig.axes if ax.get_legend()]
        assert len(legends) == 1, name
        box = legends[0].get_window_extent(renderer)
        for ax in fig.axes:
            assert not box.overlaps(ax.bbox), (name, box, ax.bbox)  # the axes' area: the points and whiskers
            assert box.y1 <= ax.xaxis.label.get_window_extent(renderer).y0, name  # under the x label too
        _save_drawn(fig, "legend_" + name)

# -- every plot family: a title, units on both axes, a legend, no overlapping text ----------
# Axis labels that name categories (no unit to give); every other axis label carries "(unit)".
_CATEGORIES = {"configuration", "compression", "configuration and rank", "rank", "rank and lane", "rank · lane", "ranks and link"}


def _drawn_texts(fig: Any) -> list[tuple[Any, Any]]:
    """(Text, window extent) of every text the Agg renderer draws: titles, labels, tick labels
    inside the view limits, annotations, legend entries."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.text import Text

    FigureCanvasAgg(fig)
    fig.canvas.draw()
    renderer = fig.canvas.get_renderer()
    off_view = set()
    for ax in fig.axes:
        for axis, lim in ((ax.xaxis, ax.get_xlim()), (ax.yaxis, ax.get_ylim())):
            lo, hi = sorted(lim)
            eps = 1e-9 * max(1.0, abs(lo), abs(hi))
            for ticks, locs in ((axis.get_major_ticks(), axis.get_majorticklocs()),
                                (axis.get_minor_ticks(), axis.get_minorticklocs())):
                off_view |= {id(t.label1) for t, loc in zip(ticks, locs) if not lo - eps <= loc <= hi + eps}
                off_view |= {id(t.label2) for t, loc in zip(ticks, locs) if not lo - eps <= loc <= hi + eps}
    return [(t, t.get_window_extent(renderer)) for t in fig.findobj(Text)
            if t.get_visible() and t.get_text().strip() and id(t) not in off_view]


_GAP_PX = 4  # the least space between two texts on the same line, about a space character at "small"


def text_problems(fig: Any) -> list[str]:
    texts = _drawn_texts(fig)
    box = fig.bbox
    out = [f"cut off at the figure's edge: {t.get_text()!r}" for t, bb in texts
           if bb.x0 < box.x0 - 1 or bb.y0 < box.y0 - 1 or bb.x1 > box.x1 + 1 or bb.y1 > box.y1 + 1]
    for i, (a, ba) in enumerate(texts):
        for b, bb in texts[i + 1:]:
            w = min(ba.x1, bb.x1) - max(ba.x0, bb.x0)
            h = min(ba.y1, bb.y1) - max(ba.y0, bb.y0)
            if w > 1 and h > 1:  # more than a pixel of ink area in common
                out.append(f"{a.get_text()!r} overlaps {b.get_text()!r}")
            elif h > 1 and w > -_GAP_PX:  # side by side with no space between: "fp32fsdp" reads as one word
                out.append(f"{a.get_text()!r} runs into {b.get_text()!r}")
    return out


def labelling_problems(fig: Any) -> list[str]:
    out = []
    title = (fig._suptitle.get_text() if fig._suptitle else "") or fig.axes[0].get_title()
    if not title.strip():
        out.append("no title")
    if not (fig.legends or any(ax.get_legend() for ax in fig.axes)):  # a sweep's legend is the figure's
        out.append("no legend")
    for ax in fig.axes:
        if not ax.axison:
            continue
        shared = [o for o in fig.axes if o is not ax and ax.get_shared_x_axes().joined(ax, o) and o.get_xlabel()]
        for which, label in (("x", ax.get_xlabel()), ("y", ax.get_ylabel())):
            if which == "x" and not label and shared:
                continue  # the axes below carries the shared x axis's label
            if not label.strip():
                out.append(f"{which} axis has no label")
            elif label not in _CATEGORIES and not ("(" in label and ")" in label) and "MiB" not in label \
                    and "samples/s" not in label:
                out.append(f"{which} axis label {label!r} gives no unit")
    return out


def _family_figures() -> dict[str, Any]:
    """Each plot family the kit draws, once as a lesson draws it and once crowded (10 runs)."""
    from kit.engine.trace import merge_profiles
    from kit.experiments.theory.prediction import predict
    from kit.plots.trace import trace_timeline
    from kit.widgets.render import draw_plot

    labels = [f"ddp mlp bs{32 * (i % 3 + 1)} fp32 bucket{b}MiB view accum2"
              for i, b in enumerate((1, 2, 5, 10, 25, 50, 100, 200, 400, 800))]
    crowd = [make_record(lb, bucket_cap_mb=b, step_ms=20 + b / 5, comm_exposed_ms=2 + b / 20)
             for lb, b in zip(labels, (1, 2, 5, 10, 25, 50, 100, 200, 400, 800))]
    few = crowd[:3]
    pipe = make_record("pipeline mlp bs32 fp32 gpipe m4", strategy="pipeline")
    pipe["timeline"] = [{"rank": r, "name": n, "kind": k, "start_ms": s + 3 * r, "end_ms": e + 3 * r}
                        for r in range(2) for n, k, s, e in (
                            ("forward", "compute", 0, 2), ("send to 1", "comm", 2, 2.3),
                            ("recv from 0", "idle", 2.3, 4), ("backward", "compute", 4, 9),
                            ("optimizer", "compute", 9, 10))]
    memmap = {"runs": [{"label": f"{m} x{w} workers", "mode": m, "sum_extra_rss_mib": 80.0 * (i + 1),
                        "sum_extra_pss_mib": 40.0 * (i + 1),
                        "epochs": [{"samples_per_s": 900.0, "cached_before": 0.0, "cold": True},
                                   {"samples_per_s": 2400.0, "cached_before": 1.0, "cold": False}]}
                       for i, (m, w) in enumerate((("memmap", 0), ("memmap", 2), ("ram", 0)))],
              "file": {"mib": 256.0, "fs_type": "ext4"}, "config": {"budget_mb": 512, "world_size": 2}}
    # lesson 09's run in JupyterLab (2026-11-28): throughputs of 48-709 thousand samples/s put a "1e6" offset
    # into the panel's title, and "warm\n100% cached" over a bar as low as its neighbour's note ran into it
    lesson09 = {"runs": [{"label": label, "mode": mode, "sum_extra_rss_mib": rss, "sum_extra_pss_mib": pss,
                          "epochs": [{"samples_per_s": s, "cached_before": c} for s, c in zip(sps, cached)]}
                         for label, mode, rss, pss, sps, cached in (
                             ("memmap, num_workers=0", "memmap", 525, 269, (154945, 468647), (0.0, 1.0)),
                             ("memmap, num_workers=2", "memmap", 1952, 389, (55517, 47800), (0.0, 1.0)),
                             ("in-memory copy", "in_memory", 517, 517, (708731, 606405), (0.99, 0.99)))],
                "file": {"mib": 256.0, "fs_type": "ext4"}, "config": {"world_size": 2}}
    import test_predict  # noqa: E402 - the predictor's synthetic record

    rec = test_predict.record(buckets=[test_predict.PSI] * 4, strategy="ddp", world_size=2)
    rows = [{"ranks": 2, "link": "loopback", "oversubscribed": False, "measured_step_ms": 10.0,
             "predicted_step_ms": 11.0, "step_err_pct": 10.0, "exposed_err_pct": 5.0, "step_iqr_ms": 1.0}]
    trace = merge_profiles({r: _profile(r) for r in (0, 1)})
    from kit.experiments import compare_published, published_runs
    # SC21 rows inside the band, torchtitan's FSDP row outside it, a Float8 row the planner cannot compare
    published = [compare_published(r) for r in published_runs() if r.id in (
        "sc21-t1-1.7B", "sc21-t1-529.6B", "torchtitan-t1-8b-8gpu-FSDP",
        "torchtitan-t1-8b-8gpu-FSDP_torch.compile_Float8")]
    local = [{"strategy": s, "ranks": 2, "repeats": 3, "measured_step_ms": m, "measured_spread_ms": (m - 9, m + 12),
              "predicted_step_ms": p, "predicted_spread_ms": (p - 2, p + 3)} for s, m, p in (("ddp", 116, 74),
                                                                                            ("tp", 84, 115))]
    figs = {
        "step_breakdown": plots.step_breakdown(few),
        "step_breakdown, 10 runs": plots.step_breakdown(crowd),
        # lesson 06's four bars, the most that are named under the bars (steps._NAMED_BARS)
        "step_breakdown, 4 named runs": plots.step_breakdown([with_opt_cpu(make_record(lb), cpu) for lb, cpu in (
            ("ddp mlp bs32 fp32 bucket25MiB view", 2.4), ("zero1 mlp bs32 fp32", 1.2), ("fsdp mlp bs32 fp32 zero3", 1.3),
            ("fsdp mlp bs32 fp32 zero2-like", 1.3))]),
        "memory_breakdown": plots.memory_breakdown(few),
        "memory_breakdown, one run": plots.memory_breakdown(make_record(labels[-1])),  # its label in the title
        "memory_breakdown in the bench, 10 runs": draw_plot("memory_breakdown", crowd),
        "comm_vs_knob": plots.comm_vs_knob(crowd),
        "scaling": plots.scaling([make_record(f"n{n}", world_size=n) for n in (1, 2, 4)],
                                 predicted={1: 1600.0, 2: 3000.0, 4: 5000.0}),
        "step_timeline": plots.step_timeline(make_record("ddp mlp bs32 fp32 bucket25MiB")),
        "step_timeline, pipeline": plots.step_timeline(pipe),
        "bandwidth": plots.bandwidth([collective_record(), collective_record(emulated=True)]),
        "memmap_memory": plots.memmap_memory(memmap),
        "memmap_memory, lesson 09 numbers": plots.memmap_memory(lesson09),
        "scaling_prediction": plots.scaling_prediction([predict(rec, link="10gbe")], measured=[rec]),
        "residuals_plot": plots.residuals_plot(rows),
        "trace_timeline": trace_timeline(trace),
        "plan_vs_published": plots.plan_vs_published(published),
        "local_prediction": plots.local_prediction(local),
    }
    return figs


def _profile(rank: int) -> dict[str, Any]:
    """A rank's profile as kit/rank/profile.py returns it: two DDP steps, torch ops beneath."""
    spans, events = [], []
    for step in range(2):
        t = 1000.0 * step + 50.0 * rank
        for name, s, e in (("forward", 0, 200), ("backward", 200, 600), ("optimizer", 700, 800)):
            spans.append({"name": name, "cat": "phase", "row": "kit", "start_us": t + s, "end_us": t + e, "args": {}})
        spans.append({"name": "bucket all-reduce #0", "cat": "comm", "row": "kit: gradient buckets",
                      "start_us": t + 400, "end_us": t + 700, "args": {}})
        events += [{"ph": "X", "cat": "cpu_op", "name": n, "pid": 9, "tid": 9, "ts": t + s, "dur": d, "args": {}}
                   for n, s, d in (("aten::addmm", 10, 150), ("autograd::engine", 210, 380),
                                   ("c10d::allreduce_", 600, 90), ("Optimizer.step#Adam.step", 710, 80))]
    return {"rank": rank, "pid": 9, "boot_id": "host", "offset_us": None, "wall_minus_perf_us": 0.0,
            "start_us": 0.0, "end_us": 2000.0, "spans": spans, "events": events, "threads": {"9/9": "python"},
            "dropped": 0}


@pytest.fixture(scope="module")
def families() -> dict[str, Any]:
    return _family_figures()


def test_every_plot_family_has_title_units_and_legend(families) -> None:
    problems = {name: p for name, fig in families.items() if (p := labelling_problems(fig))}
    assert problems == {}


def test_no_plot_family_overlaps_or_cuts_off_its_text(families) -> None:
    problems = {}
    for name, fig in families.items():
        if p := text_problems(fig):  # draws the figure on an Agg canvas
            problems[name] = p
        _save_drawn(fig, "family_" + name.replace(" ", "_").replace(",", ""))
    assert problems == {}


def test_a_step_breakdown_with_a_pipeline_keeps_its_run_labels_apart() -> None:
    """The lab bench after fsdp, tp and pipeline runs: the pipeline's one-line "other (data, Python; pipelines:
    waiting for a stage, the bubble)" made the key 2 in wider, and the three wrapped labels under the narrower
    axes ran into each other ('fsdp mlp bs32 fp32' over 'tp gpt bs32 fp32'); so did 2 and 4 pipeline runs."""
    three = [make_record("fsdp mlp bs32 fp32 zero3", strategy="fsdp"), make_record("tp gpt bs32 fp32", strategy="tp"),
             make_record("pipeline mlp bs32 fp32 gpipe m4", strategy="pipeline")]
    assert text_problems(plots.step_breakdown(three)) == []
    for n in (2, 4):
        runs = [make_record(f"pipeline mlp bs32 fp32 gpipe m{4 + i}", strategy="pipeline") for i in range(n)]
        assert text_problems(plots.step_breakdown(runs)) == [], n


def test_a_figure_s_title_is_not_smaller_than_its_panels_titles(families) -> None:
    """memmap_memory's title ("256 MiB file on 2 ranks, ext4", lesson 09) was set in 10 pt over its panels' 12 pt
    titles: read in JupyterLab it looked like a footnote above the panels, not what the whole figure shows."""
    small = {}
    for name, fig in {**families, **_crowded_figures()}.items():
        title = fig._suptitle
        if title is None or not title.get_text():
            continue
        panels = [t for ax in fig.axes for t in (ax.title, ax._left_title, ax._right_title) if t.get_text()]
        if any(t.get_fontsize() > title.get_fontsize() for t in panels):
            small[name] = (title.get_fontsize(), [t.get_fontsize() for t in panels])
    assert small == {}


def test_plan_vs_published_counts_what_the_summary_beside_it_counts(families) -> None:
    """The plan panel prints published_check.summarise's count beside this plot's title: both leave the
    runs the planner cannot compare (Float8) out (the title once said 36 within 15% where the summary said
    34 of 42), and those bars are grey, neither inside nor outside the band."""
    from kit.experiments import compare_published, published_runs
    from kit.experiments.theory.published_check import summarise

    rows = [compare_published(r) for r in published_runs() if r.id in (
        "sc21-t1-1.7B", "sc21-t1-529.6B", "torchtitan-t1-8b-8gpu-FSDP",
        "torchtitan-t1-8b-8gpu-FSDP_torch.compile_Float8")]
    within, n, _ = summarise(rows)["throughput_within_15pct"]
    assert n == 3 and sum(abs(r.ratio - 1) <= 0.15 for r in rows) == within + 1  # the Float8 row, drawn but not counted
    fig = families["plan_vs_published"]
    assert f"{within} of {n} comparable within 15%; 1 grey" in fig._suptitle.get_text()
    colours = [tuple(round(c, 3) for c in b.get_facecolor()[:3]) for b in fig.axes[0].patches[-4:]]
    grey = tuple(round(c, 3) for c in matplotlib.colors.to_rgb(_style.OKABE_ITO["grey"]))
    assert colours.count(grey) == 1 and colours[-1] == grey  # the Float8 row, last of the four


def test_the_text_checker_sees_an_overlap() -> None:
    fig = _style.new_figure()
    ax = fig.axes[0]
    ax.set_title("t")
    ax.text(0.5, 0.5, "the same place")
    ax.text(0.5, 0.5, "the same place, again")
    assert any("overlaps" in p for p in text_problems(fig))


def test_step_breakdown_labels_keep_a_number_with_its_unit_and_the_label_s_own_line_breaks() -> None:
    """Lesson 03's bars read "1 bucket (cap 25" over "MiB)": a label broken between a number and its unit."""
    recs = [make_record("1 bucket (cap 25 MiB)"), make_record("4 buckets (cap 1 MiB)"),
            make_record("naive\n(by hand)")]
    ax = plots.step_breakdown(recs).axes[0]
    shown = [t.get_text() for t in ax.get_xticklabels()]
    for text in shown:
        assert not any(line.split()[0] in ("MiB", "MiB)") for line in text.split("\n") if line.split()), shown
    assert any("25 MiB" in line for line in shown[0].split("\n")), shown
    assert shown[2].split("\n") == ["naive", "(by hand)"], shown


def test_numbered_step_breakdown_points_only_to_the_key_it_draws() -> None:
    """The new-user trial: in a notebook (no bench, no table) the x label sent readers to "the table"."""
    fig = plots.step_breakdown([make_record(f"ddp mlp bs32 fp32 bucket{b}MiB") for b in (1, 2, 5, 10, 25)])
    xlabel = fig.axes[0].get_xlabel()
    assert xlabel.startswith("run (#") and "key below" in xlabel and "table" not in xlabel, xlabel


def test_ring_balance_titles_its_measured_panel_by_what_it_shows() -> None:
    """The new-user trial: two cp runs' measured bars were titled "measured, one run"; a run record times
    its last step's forward, a check says its own way (`compute_ms_of`)."""
    def cp(zigzag: bool, **extra: Any) -> dict[str, Any]:
        return {"label": f"cp gpt bs32 fp32 {'zigzag' if zigzag else 'contiguous'}", "comm": {"report": {
            "attention_work": {"score_entries_per_rank": [300, 800], "compute_ms_per_rank": [0.6, 1.2],
                               "zigzag": zigzag, "layers": 2, **extra}}}}

    titles = {n: plots.ring_balance(recs).axes[1].get_title() for n, recs in (
        ("two runs", [cp(False), cp(True)]), ("one run", [cp(False)]),
        ("two checks", [cp(z, compute_ms_of="median of 5 forwards after an untimed one") for z in (False, True)]))}
    assert titles == {"two runs": "measured, each run's last step", "one run": "measured, the run's last step",
                      "two checks": "measured, median of 5 forwards after an untimed one"}


def test_local_prediction_marks_its_prediction_dotted_as_every_plot_does() -> None:
    """Lesson 13's "On this machine" plot hatched its predicted bars "//", the kit's mark for an emulated link
    (`EMULATED_HATCH`); the kit's other plots mark a formula's bars dotted (`PREDICTED_HATCH`)."""
    rows = [{"strategy": s, "ranks": 2, "repeats": 3, "measured_step_ms": 100.0, "measured_spread_ms": (90.0, 110.0),
             "predicted_step_ms": 80.0, "predicted_spread_ms": (75.0, 85.0)} for s in ("ddp", "tp")]
    ax = plots.local_prediction(rows).axes[0]
    hatches = {b.get_hatch() for b in ax.patches if b.get_facecolor()[:3] == (1.0, 1.0, 1.0)}
    assert hatches == {_style.PREDICTED_HATCH}


def test_plan_vs_published_keys_grey_bars_only_where_it_draws_some() -> None:
    """Lesson 13 draws the 17 comparable runs: no bar is grey, and its legend still keyed "not comparable
    (Float8)"; a key for what is not drawn sends the reader looking for it."""
    from kit.experiments import compare_published, published_runs

    runs = [r for r in published_runs() if r.id in ("sc21-t1-1.7B", "torchtitan-t1-8b-8gpu-FSDP",
                                                      "torchtitan-t1-8b-8gpu-FSDP_torch.compile_Float8")]
    keys = {}
    for name, chosen in (("comparable only", [r for r in runs if r.comparable]), ("with Float8", runs)):
        legend = plots.plan_vs_published([compare_published(r) for r in chosen]).axes[0].get_legend()
        keys[name] = [t.get_text() for t in legend.get_texts()]
    assert "not comparable (Float8)" not in keys["comparable only"]
    assert "not comparable (Float8)" in keys["with Float8"]


def test_a_run_whose_phases_were_not_timed_shows_no_phases() -> None:
    """instrument=False times whole steps only: the record's phase fields are zeros, not measurements.
    The plot draws one undivided dashed bar for its step (not a grey "other" claiming the whole step was
    data and Python), no optimizer CPU bracket; the text table prints "-" in its phase columns and says
    why; the run's text says exposed comm was not timed; the lab bench's table leaves it empty; a sweep's
    exposed-comm panel and the prediction plot's exposed-comm markers leave it out."""
    from kit.experiments.records import rows, table
    from kit.experiments.run_record import record_text
    from kit.plots.steps import OPT_CPU_LABEL, UNTIMED_LABEL
    from kit.widgets.table import records_html

    untimed = with_opt_cpu(with_spread(make_record("ddp uninstrumented"), (18.0, 16.0, 20.0)), 0.0)
    untimed["config"] = {**untimed["config"], "instrument": False}
    timed = with_spread(make_record("ddp"), (18.0, 16.0, 20.0))
    ax = plots.step_breakdown([untimed, timed]).axes[0]
    assert _bars(ax, UNTIMED_LABEL) == pytest.approx([18.0, 0.0])
    assert _bars(ax, "other (data, sync, Python)")[0] == 0.0 and _bars(ax, "forward") == pytest.approx([0.0, 4.0])
    assert not [ln for ln in ax.get_lines() if ln.get_label() == OPT_CPU_LABEL]
    _save(ax.figure, "step_breakdown_untimed")
    untimed_row, timed_row = rows([untimed, timed])
    assert untimed_row["fwd_ms"] is None and untimed_row["comm_overhead_pct"] is None and timed_row["fwd_ms"] == 5.0
    text = table([untimed, timed]).splitlines()
    assert text[1].split().count("-") == 7 and text[2].split().count("-") == 2  # fwd ... exposed, bubble %
    assert text[-1] == 'phase columns "-" for ddp uninstrumented: phases not timed: instrument=False times whole steps only'
    assert "exposed comm      not timed (phases not timed" in record_text(untimed)
    assert "not timed" not in record_text(timed)
    untimed_html, timed_html = records_html([untimed, timed]).split("<tr")[2:4]
    assert "10.0" in timed_html and "10.0" not in untimed_html  # exposed comm: 2.0 ms of a 20.0 ms step
    only = plots.step_breakdown([untimed]).axes[0]
    assert [t.get_text() for t in only.get_legend().get_texts()][:1] == [UNTIMED_LABEL]  # no phases of height 0
    pct = plots.comm_vs_knob([untimed, timed], knob="label").axes[0]
    assert sorted(len(line.get_xdata()) for line in pct.get_lines() if len(line.get_xdata())) == [1]
    assert "1 run(s) not drawn: phases not timed" in pct.get_title()


def _crowded_figures() -> dict[str, Any]:
    """Each plot that grew with its items, drawn with 8 of them (runs, layouts, experts, points)."""
    from kit.experiments import plan
    from kit.experiments.theory.prediction import predict

    import test_predict  # noqa: E402 - the predictor's synthetic record

    labels = [f"ddp mlp bs{32 * (i % 3 + 1)} fp32 bucket{b}MiB view accum2" for i, b in enumerate((1, 2, 5, 10, 25,
                                                                                                  50, 100, 200))]
    runs = [with_spread(make_record(lb, bucket_cap_mb=b, step_ms=20 + b / 5), (20 + b / 5, 19 + b / 5, 22 + b / 5))
            for lb, b in zip(labels, (1, 2, 5, 10, 25, 50, 100, 200))]

    def experts(i: int) -> dict[str, Any]:  # 8 experts, 3 layers, a capacity
        routed = [8 + (3 * e + 5 * i) % 20 for e in range(8)]
        kept = [min(r, 16) for r in routed]
        return {"label": f"ep gpt bs8 fp32 experts8 cf{i}", "comm": {"report": {"expert_load": [
            {"routed": routed, "kept": kept, "dropped": [r - k for r, k in zip(routed, kept)],
             "capacity_per_rank": 8, "ranks": 2}] * 3}}}

    def ring(i: int) -> dict[str, Any]:
        return {"label": f"cp gpt bs8 fp32 {'zigzag' if i % 2 else 'contiguous'} seq{64 * (i + 1)}", "comm": {
            "report": {"attention_work": {"score_entries_per_rank": [100 + 60 * r * (1 - i % 2) for r in range(4)],
                                          "compute_ms_per_rank": [0.5 + 0.2 * r for r in range(4)],
                                          "zigzag": bool(i % 2), "layers": 2}}}}

    def collectives(i: int) -> dict[str, Any]:
        per = {"tp/all_reduce": {"payload_bytes": 1e6 * (i + 1)}}
        return {"label": f"tp gpt bs32 fp32 tp{i + 2}", "comm": {"report": {"measured_per_step": per,
                                                                             "predicted_per_step": per}}}

    memmap = {"runs": [{"label": f"memmap, num_workers={w}", "mode": "memmap", "sum_extra_rss_mib": 500.0 + w,
                        "sum_extra_pss_mib": 250.0, "epochs": [{"samples_per_s": 150000.0, "cached_before": 0.0},
                                                               {"samples_per_s": 460000.0, "cached_before": 1.0}]}
                       for w in (0, 2, 4)], "file": {"mib": 256.0, "fs_type": "ext4"},
              "config": {"world_size": 2, "budget_mb": 1024}}
    rec = test_predict.record(buckets=[test_predict.PSI] * 4, strategy="ddp", world_size=2)
    rec["label"] = labels[-1]  # a long run label in the title
    rows = [{"ranks": n, "link": link, "oversubscribed": n > 2, "measured_step_ms": 10.0 * n * (1 + 0.3 * j),
             "predicted_step_ms": 11.0 * n * (1 + 0.3 * j), "step_err_pct": 10.0, "exposed_err_pct": 5.0,
             "step_iqr_ms": 1.0}
            for j, link in enumerate(("loopback", "10gbe")) for n in (2, 4, 8, 16)]
    return {
        "plan_layouts, 8 layouts": plots.plan_layouts(plan("llama3-70b", nodes=8, seq_len=4096), top=8),
        "scaling_prediction": plots.scaling_prediction(predict(rec, link="10gbe"), measured=[rec]),
        "residuals_plot, 8 points": plots.residuals_plot(rows),
        "expert_load, 8 runs of 8 experts": plots.expert_load([experts(i) for i in range(8)]),
        "ring_balance, 8 runs": plots.ring_balance([ring(i) for i in range(8)]),
        "memmap_memory": plots.memmap_memory(memmap),
        "comm_vs_knob, 8 runs": plots.comm_vs_knob(runs),
        "step_breakdown, 8 runs": plots.step_breakdown(runs),
        "bytes_by_collective, 8 runs": plots.bytes_by_collective([collectives(i) for i in range(8)]),
    }


def test_no_figure_is_wider_than_a_laptop_s_notebook_column() -> None:
    """JupyterLab shrinks a figure wider than its column (about 850 px in a laptop's 1280 px window), text and
    all: at 11 inches (1100 px at 100 dpi) to 77%, too small to read. At 9.6 it shows at about 90%. The plots
    that grew with their items (8 layouts, runs, experts) stay within it, their keys below the axes or their
    labels on more lines instead, and nothing overlaps or leaves the figure."""
    figs = _crowded_figures()
    wide = {name: float(fig.get_size_inches()[0]) for name, fig in figs.items() if fig.get_size_inches()[0] > 9.6}
    assert wide == {}
    problems = {name: p for name, fig in figs.items() if (p := text_problems(fig))}
    assert problems == {}
    for name, fig in figs.items():
        _save_drawn(fig, "crowded_" + name.split(",")[0])


def _text_that_collided() -> dict[str, Any]:
    """The four figures whose notes or names still ran into each other at 9.6 in (2026-11-28), with the data
    that did it: 16 bars in one row, four predictions, points within a millisecond, a one-line time key."""
    from kit.experiments import plan
    from kit.experiments.theory.prediction import predict

    import test_predict  # noqa: E402 - the predictor's synthetic record

    def four_kinds(label: str, scale: float) -> dict[str, Any]:  # 4 collectives in one mesh dimension's row
        per = {k: {"payload_bytes": b * scale} for k, b in (("tp/all_reduce", 3.1e6), ("tp/all_gather", 1.6e6),
                                                             ("tp/reduce_scatter", 1.6e6), ("tp/send", 0.4e6))}
        return {"label": label, "comm": {"report": {"measured_per_step": per, "predicted_per_step": per}}}

    rec = test_predict.record(buckets=[test_predict.PSI] * 4, strategy="ddp", world_size=2)
    strategies = ("ddp", "zero1", "zero2", "zero3")  # comm stops hiding at 16, 2, 2, 4 ranks; 25, 38, 38, 19%
    preds = [{**predict(rec, link="10gbe", strategy=s), "label": f"predicted {s} on 10gbe"} for s in strategies]
    # a loopback and an emulated link's points within a millisecond of each other
    near = [{"ranks": n, "link": link, "oversubscribed": n > 2, "measured_step_ms": m, "predicted_step_ms": p,
             "step_err_pct": 100 * (p - m) / m, "exposed_err_pct": 5.0, "step_iqr_ms": 1.0}
            for link, pts in (("loopback", ((2, 30.0, 31.0), (4, 31.0, 32.0), (8, 33.0, 31.5))),
                              ("10gbe+", ((2, 30.5, 30.8), (4, 32.0, 33.5), (8, 45.0, 48.0)))) for n, m, p in pts]
    return {
        "bytes_by_collective, 4 runs of 4 collectives": plots.bytes_by_collective(
            [four_kinds(f"tp x{w} gpt bs32 fp32 {sp}", w / 2) for w, sp in ((2, "sp"), (4, "sp"), (2, "seq128 sp"),
                                                                            (4, "seq128 sp"))]),
        "scaling_prediction, 4 predictions": plots.scaling_prediction(preds, measured=[rec, {**rec, "emulated": True}]),
        "residuals_plot, points that nearly coincide": plots.residuals_plot(near),
        "plan_layouts, a 1-line time key": plots.plan_layouts(plan("llama3-8b", nodes=1, gpus_per_node=1)),
    }


def test_crowded_names_and_notes_stay_apart() -> None:
    """16 bars named by run and collective, four predictions' "comm stops hiding" notes and efficiencies, the
    rank notes of points that nearly coincide: each readable, none on another, within 9.6 in. And a plan's
    keys each start level with the other under its panel (a 1-GPU plan's time key has one line, its memory
    key four: the time key's line sat level with the memory key's last)."""
    figs = _text_that_collided()
    assert {name: float(fig.get_size_inches()[0]) for name, fig in figs.items() if fig.get_size_inches()[0] > 9.6} == {}
    assert {name: p for name, fig in figs.items() if (p := text_problems(fig))} == {}
    keys = figs["plan_layouts, a 1-line time key"].legends
    assert [leg.get_texts()[0].get_text() for leg in keys] == ["parameters", "compute"]
    memory_top, time_top = (leg.get_texts()[0].get_window_extent().y1 for leg in keys)
    assert abs(memory_top - time_top) < 1, (memory_top, time_top)
    for name, fig in figs.items():
        _save_drawn(fig, "collided_" + name.split(",")[0])
