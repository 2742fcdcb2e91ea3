"""The lab bench without a frontend: set controls, click buttons, wait for the work thread.

ipywidgets builds widgets headless (no kernel: a dummy comm), so these tests drive the same
objects a user clicks. One test uses the real `kit.experiments.run` (2 gloo ranks); the rest
pass a small runner so Stop, failures and sweeps are checked in well under a second each.
"""
from __future__ import annotations

import json
import threading
import time
from typing import Any, Mapping

import matplotlib
import pytest

matplotlib.use("Agg")

from kit.experiments import ExperimentConfig  # noqa: E402
from kit.widgets import KNOBS, Knob, LabBench, lab_bench  # noqa: E402

# How long a fake run or sweep may take before a test calls it stuck: a bound on liveness, not a timing
# claim (matplotlib renders each plot in the worker thread, which takes seconds on a loaded 2-core machine).
WORK_S = 120.0

PNG = b"\x89PNG"


def png(bench: LabBench) -> bytes:
    """The plot image's bytes (ipywidgets 8 holds them as a memoryview)."""
    return bytes(bench.image.value)


class FakeRunner:
    """Honours `progress` and `stop` like kit.experiments.run; records look like real ones."""

    def __init__(self, step_s: float = 0.005, fail_on: float | None = None) -> None:
        self.calls: list[Any] = []
        self.step_s, self.fail_on = step_s, fail_on
        self.started = threading.Event()

    def __call__(self, config: Any, cluster: Any = None, results_path: Any = None,
                 progress: Any = None, stop: threading.Event | None = None) -> Mapping[str, Any]:
        self.calls.append(config)
        if self.fail_on is not None and config.bucket_cap_mb == self.fail_on:
            raise RuntimeError("rank 1 died: injected failure")
        done = 0
        for s in range(1, config.steps + 1):
            self.started.set()
            if stop is not None and stop.is_set():
                break
            time.sleep(self.step_s)
            done = s
            if progress:
                progress(s, config.steps)
        step_ms = 10.0 + 20.0 / config.bucket_cap_mb
        return {"schema": "kit.run/2", "run_id": f"r{len(self.calls)}", "label": config.label(),
                "config": config.to_dict(), "emulated": config.interconnect is not None,
                "complete": done == config.steps,  # as kit.experiments.run marks a stopped run
                "notes": [], "steps": [{"step": i} for i in range(done)], "memory": [],
                "timeline": [], "comm": {"bytes_per_step": 0, "buckets": []},
                "summary": {"step_ms": step_ms, "fwd_ms": 3.0, "bwd_ms": 5.0, "opt_ms": 1.0,
                            "comm_ms": 2.0, "comm_overlap_ms": 1.0,
                            "comm_exposed_ms": step_ms - 9.0,
                            "comm_overhead_pct": 100 * (step_ms - 9.0) / step_ms,
                            "throughput_samples_s": 64_000 / step_ms}}


def _bench(runner: Any = None, **kw: Any) -> LabBench:
    bench = lab_bench(runner=runner or FakeRunner(), **kw)
    bench.controls["steps"].value = 5
    return bench


def test_real_run_fills_table_and_plot(tmp_path: Any) -> None:
    """The default runner: a real 2-rank DDP run from a button click."""
    results = tmp_path / "runs.jsonl"
    bench = lab_bench(results_path=str(results))
    bench.controls["model_size"].value = "tiny"
    bench.controls["steps"].value = 5
    bench.controls["bucket_cap_mb"].value = 1.0
    t0 = time.monotonic()
    bench.run_button.click()
    assert bench.busy and bench.stop_button.disabled is False
    assert bench.wait(240), "the run finished within 4 minutes"
    elapsed = time.monotonic() - t0
    assert "Finished 1 run" in bench.message.value, bench.message.value
    (rec,) = bench.records
    assert rec["schema"] == "kit.run/2"
    assert rec["config"]["bucket_cap_mb"] == 1.0 and rec["config"]["world_size"] == 2
    assert rec["summary"]["step_ms"] > 0
    assert png(bench).startswith(PNG)
    assert rec["label"] in bench.table.value
    assert results.exists() and json.loads(results.read_text().splitlines()[-1])["run_id"] \
        == rec["run_id"]
    assert not bench.busy and bench.run_button.disabled is False
    print(f"real run via the bench: {elapsed:.1f} s")


def test_real_stop_mid_sweep() -> None:
    """Stop reaches the real ranks: the running config ends early, the next never starts."""
    from kit.experiments import run

    calls: list[Any] = []
    stepping = threading.Event()

    def counting_run(config: Any, **kw: Any) -> Mapping[str, Any]:
        calls.append(config)
        shown = kw.get("progress")

        def progress(step: int, total: int) -> None:  # the ranks report steps: the run is under way
            stepping.set()
            if shown:
                shown(step, total)
        return run(config, **dict(kw, progress=progress))

    bench = lab_bench(runner=counting_run)
    bench.controls["model_size"].value = "tiny"
    bench.controls["steps"].value = 100
    bench.controls["bucket_cap_mb"].value = 1.0
    bench.sweep(knob="steps", values=[2000, 2000])
    assert stepping.wait(120), "the first run of the sweep never reported a step"
    t_stop = time.monotonic()
    bench.stop_button.click()
    assert bench.wait(60)
    assert time.monotonic() - t_stop < 30, "stopped within a step or a rank start, not 2000 steps"
    assert len(calls) == 1 and "Stopped" in bench.message.value
    for rec in bench.records:
        assert len({r["step"] for r in rec["steps"]}) < 2000
        assert any("stopped" in n for n in rec["notes"])


def test_run_uses_controls_and_updates_image() -> None:
    runner = FakeRunner()
    bench = _bench(runner)
    bench.controls["bucket_cap_mb"].value = 5.0
    bench.controls["precision"].value = "bf16"
    bench.run_button.click()
    assert bench.wait(WORK_S)
    assert runner.calls[0].bucket_cap_mb == 5.0 and runner.calls[0].precision == "bf16"
    first = png(bench)
    assert first.startswith(PNG)
    assert bench.progress.value == bench.progress.max == 5
    bench.controls["bucket_cap_mb"].value = 25.0
    bench.run_button.click()
    assert bench.wait(WORK_S)
    assert len(bench.records) == 2 and png(bench) != first
    assert bench.table.value.count("<tr>") == 3  # header + two runs


def test_sweep_runs_each_value_and_plots_against_knob() -> None:
    runner = FakeRunner()
    bench = _bench(runner)
    bench.sweep_knob.value = "bucket_cap_mb"
    bench.sweep_values.value = "1, 5, 25"
    bench.plot_choice.value = "comm_vs_knob"
    bench.sweep_button.click()
    assert bench.wait(WORK_S)
    assert [c.bucket_cap_mb for c in runner.calls] == [1.0, 5.0, 25.0]
    assert "Finished 3 run" in bench.message.value
    assert png(bench).startswith(PNG)


def test_stop_mid_sweep() -> None:
    runner = FakeRunner(step_s=0.05)
    bench = _bench(runner)
    bench.controls["steps"].value = 20
    bench.sweep_values.value = "1, 5, 25, 100"
    bench.sweep_button.click()
    deadline = time.monotonic() + WORK_S
    while len(runner.calls) < 2 and time.monotonic() < deadline:
        time.sleep(0.01)
    bench.stop_button.click()
    assert bench.wait(WORK_S)
    assert len(runner.calls) == 2, "the sweep skipped the values after Stop"
    assert "Stopped" in bench.message.value
    assert len(bench.records) <= 2
    assert bench.stop_button.disabled and not bench.run_button.disabled


def test_invalid_config_shows_message_not_traceback() -> None:
    runner = FakeRunner()
    bench = _bench(runner)
    bench.controls["strategy"].value = "dp"
    bench.controls["world_size"].value = 8
    bench.controls["batch_size"].value = 4  # dp scatters 4 samples over 8 replicas: invalid
    bench.run_button.click()
    assert not bench.busy and runner.calls == []
    assert "Invalid configuration" in bench.message.value
    assert "batch_size=4" in bench.message.value


def test_invalid_sweep_value_names_the_token() -> None:
    bench = _bench()
    bench.sweep_knob.value = "grad_accum_steps"
    bench.sweep_values.value = "1, two"
    bench.sweep_button.click()
    assert "'two' is not a valid value" in bench.message.value


def test_runner_failure_is_shown_and_panel_recovers() -> None:
    bench = _bench(FakeRunner(fail_on=5.0))
    bench.sweep_values.value = "1, 5, 25"
    bench.sweep_button.click()
    assert bench.wait(WORK_S)
    assert "failed" in bench.message.value and "injected failure" in bench.message.value
    assert "<details>" in bench.message.value  # traceback folded away
    assert len(bench.records) == 1 and not bench.busy


def test_a_failed_run_names_the_error_once() -> None:
    """A run whose ranks were shut down under it (`%dist shutdown` while the bench ran) read
    "failed: CellError: CellError: rank 1 died ...": a CellError's text starts with its name."""
    from kit.errors import CellError, RankFailure
    from kit.widgets.table import failure_html

    died = CellError({1: RankFailure(1, "Shutdown", "the ranks were shut down while this ran", died=True)})
    said = failure_html("ddp mlp", died).split("<details>")[0]
    assert said.count("CellError") == 1 and "rank 1 died: " in said, said
    assert "failed: ValueError: bad" in failure_html("ddp mlp", ValueError("bad"))


def test_interconnect_none_and_presets() -> None:
    runner = FakeRunner()
    bench = _bench(runner)
    assert bench.values()["interconnect"] is None
    assert "10gbe" in [v for _, v in bench.controls["interconnect"].options]
    bench.controls["interconnect"].value = "10gbe"
    bench.run()
    assert bench.wait(WORK_S)
    assert runner.calls[0].interconnect == "10gbe"
    assert "[emulated]" in bench.table.value


def test_save_clear_load_roundtrip(tmp_path: Any) -> None:
    bench = _bench()
    bench.sweep(knob="bucket_cap_mb", values=[1.0, 25.0])
    assert bench.wait(WORK_S)
    bench.path.value = str(tmp_path / "bench.jsonl")
    bench.save_button.click()
    assert "Saved 2 run" in bench.message.value
    bench.clear_button.click()
    assert bench.records == [] and png(bench) == b"" and bench.image.layout.display == "none"
    bench.load_button.click()
    assert len(bench.records) == 2 and png(bench).startswith(PNG)
    bench.load_button.click()  # same runs again: not duplicated
    assert len(bench.records) == 2


def test_load_of_a_missing_or_foreign_file_says_so(tmp_path: Any) -> None:
    # A typo in the file name used to say "Loaded 0 run(s) from ..." as if the file were empty.
    bench = _bench()
    bench.path.value = str(tmp_path / "kit-results-bnech.jsonl")
    bench.load_button.click()
    assert "No file" in bench.message.value and "#D55E00" in bench.message.value, bench.message.value
    other = tmp_path / "notes.txt"
    other.write_text("not a run record\n")
    bench.path.value = str(other)
    bench.load_button.click()
    assert "no run records" in bench.message.value and "#D55E00" in bench.message.value, bench.message.value
    assert bench.records == []


def test_every_plot_choice_draws_from_bench_runs() -> None:
    bench = _bench()
    bench.sweep(knob="world_size", values=[2, 3])
    assert bench.wait(WORK_S)
    for _, name in bench.plot_choice.options:
        bench.image.value = b""
        bench.plot_choice.value = name
        bench.redraw()
        assert png(bench).startswith(PNG), name
        assert "Cannot draw" not in bench.message.value, name


def test_knob_table_drops_rows_the_config_lacks() -> None:
    extra = Knob("compression_hook", "compression", "choice", ("none", "fp16"))
    bench = LabBench(runner=FakeRunner(), knobs=(*KNOBS, extra))
    assert "compression_hook" not in bench.controls
    assert "bucket_cap_mb" in bench.controls


def test_table_shows_only_config_columns_that_differ() -> None:
    from kit.widgets.table import records_html

    runner = FakeRunner()
    bench = _bench(runner)
    bench.sweep(knob="bucket_cap_mb", values=[1.0, 25.0])
    assert bench.wait(WORK_S)
    html = records_html(bench.records)
    assert "<th>bucket MiB</th>" in html and "<th>batch</th>" not in html
    assert "<th>step ms (median ± IQR)</th>" in html and "<th>samples/s</th>" in html


def test_stopped_run_is_kept_marked_and_left_out_of_plots(monkeypatch: Any) -> None:
    import kit.widgets.bench as bench_mod

    drawn: list[list[str]] = []
    real_draw = bench_mod.draw_plot

    def spy(name: str, records: Any, **kw: Any) -> Any:
        drawn.append([r["run_id"] for r in records])
        return real_draw(name, records, **kw)
    monkeypatch.setattr(bench_mod, "draw_plot", spy)
    runner = FakeRunner(step_s=0.05)
    bench = _bench(runner)
    bench.run()
    assert bench.wait(WORK_S)  # one complete run
    bench.controls["steps"].value = 100
    bench.run()
    assert runner.started.wait(WORK_S)
    time.sleep(0.2)
    bench.stop_button.click()
    assert bench.wait(WORK_S)
    assert [r["complete"] for r in bench.records] == [True, False]
    msg = bench.message.value
    assert "Stopped by you" in msg and "incomplete" in msg and "instrument=True" not in msg
    assert "[stopped: incomplete, not plotted]" in bench.table.value
    assert drawn[-1] == [bench.records[0]["run_id"]]  # the stopped run is not plotted
    stopped = bench.records[1]
    bench.clear()
    bench.records.append(stopped)  # only a stopped run left
    bench.redraw()
    assert png(bench) == b""  # nothing complete to draw: no picture rather than a misleading one


def test_progress_says_warming_up_then_counts_measured_steps() -> None:
    texts: list[str] = []

    def runner(config: Any, progress: Any = None, **kw: Any) -> Mapping[str, Any]:
        progress(0, config.steps)  # what kit.experiments.run reports through warm-up
        texts.append(bench.status.value)
        progress(3, config.steps)
        texts.append(bench.status.value)
        return FakeRunner()(config, **kw)

    bench = _bench(runner)
    bench.run()
    assert bench.wait(WORK_S)
    assert texts[0].endswith("warming up...") and texts[1].endswith("step 3/5")


def test_table_shows_median_and_iqr() -> None:
    from kit.widgets.table import records_html

    rec = FakeRunner()(ExperimentConfig(steps=2))
    rec["spread"] = {"step_ms": {"median": 31.25, "q1": 30.0, "q3": 33.5, "iqr": 3.5,
                                 "min": 29.0, "max": 40.0, "n": 2}}
    html = records_html([rec])
    assert "31.2 ± 3.5" in html or "31.3 ± 3.5" in html
    old = FakeRunner()(ExperimentConfig(steps=2))
    assert "(mean)" in records_html([old])  # a kit.run/1 record: the mean, said to be one


def test_sweep_plot_axis_uses_the_knob_label() -> None:
    from kit.widgets.render import draw_plot

    recs = [FakeRunner()(ExperimentConfig(
        steps=2, bucket_cap_mb=b)) for b in (1.0, 25.0)]
    fig = draw_plot("comm_vs_knob", recs)
    assert fig.axes[0].get_xlabel() == "bucket size (MiB)"


# -- one thing at a time: only the knobs the chosen strategy uses ------------------------------
def test_ddp_shows_only_its_knobs_and_powersgd_only_with_powersgd() -> None:
    bench = _bench()
    shown = bench.visible()
    assert {"bucket_cap_mb", "compression", "interconnect"} <= set(shown)
    assert not {"reshard_after_forward", "powersgd_rank", "start_powerSGD_iter", "ps_mode", "straggler_ms"} & set(shown)
    assert len(shown) == 13  # was every knob (19 rows), FSDP's, PowerSGD's and the parameter server's included
    assert [c.description for col in bench.columns for c in col.children] == \
        [k.label for k in bench.knobs if k.name in shown]
    bench.controls["compression"].value = "powersgd"
    assert {"powersgd_rank", "start_powerSGD_iter"} <= set(bench.visible())
    bench.controls["strategy"].value = "fsdp"
    assert "reshard_after_forward" in bench.visible() and "bucket_cap_mb" not in bench.visible()
    assert "bucket_cap_mb" not in [o[1] for o in bench.sweep_knob.options]  # nor offered to sweep
    bench.controls["strategy"].value = "ddp"
    assert bench.sweep_knob.value == "bucket_cap_mb"  # back with its strategy


def test_a_hidden_knob_keeps_its_default_and_never_invalidates_a_run() -> None:
    bench = _bench()
    bench.controls["strategy"].value = "param_server"
    bench.controls["straggler_ms"].value = 50.0
    bench.controls["strategy"].value = "ddp"  # straggler_ms is a parameter-server knob
    cfg = bench.make_config()
    assert cfg.straggler_ms == 0.0 and cfg.strategy == "ddp"
    bench.controls["strategy"].value = "single"  # world size hidden: one process
    assert bench.make_config().world_size == 1


def test_the_knob_table_agrees_with_the_config() -> None:
    """A shown knob's every choice is one the config accepts for that strategy; a knob the config
    restricts to some strategies is shown exactly there (bucket size under FSDP is ignored by the
    strategy's code rather than refused, so only the restricted knobs can be checked both ways)."""
    from kit.experiments.config import STRATEGIES, ExperimentConfigError
    from kit.widgets.relevance import IMPLIED, config_values, shown

    restricted = {"compression", "reshard_after_forward", "ps_mode", "straggler_ms", "grad_accum_steps",
                  "interconnect"}
    shown_but_refused, hidden_but_accepted = [], []
    for strategy in STRATEGIES:
        for knob in KNOBS:
            values = {"strategy": strategy}
            if knob.name in ("powersgd_rank", "start_powerSGD_iter"):
                values["compression"] = "powersgd"
            if knob.name == "virtual_stages":
                values["schedule"] = "interleaved_1f1b"
            for choice in knob.choices() or [not knob.default]:
                if knob.name == "strategy" or knob.name == "world_size" and choice < 2 or choice == knob.default:
                    continue  # one rank is "single"; a default is always accepted
                try:
                    ExperimentConfig(**{"world_size": 2, **IMPLIED.get(strategy, {}), **values, knob.name: choice})
                    accepted = True
                except ExperimentConfigError:
                    accepted = False
                if shown(knob.name, values) and not accepted:
                    shown_but_refused.append((strategy, knob.name, choice))
                if knob.name in restricted and not shown(knob.name, values) and accepted:
                    hidden_but_accepted.append((strategy, knob.name, choice))
    # a value, not the knob, is refused here: the message says why (no sharded grad scaler wired up)
    fp16 = [(s, "precision", "fp16") for s in ("zero1", "fsdp", "param_server")]
    # tp/sp/cp/ep: a rank count or model size that does not split the heads, sequence or experts
    # is refused with the sizes that do (config_parallel); the knobs themselves apply
    splits = [(s, k, c) for s, k, c in shown_but_refused
              if s in ("tp", "sp", "cp", "ep") and k in ("world_size", "model_size")]
    assert {s for s, _, _ in splits} == {"tp", "sp", "cp", "ep"}
    # a mesh belongs to one strategy (tp: dp x tp, fsdp x tp; pipeline: pp x dp; fsdp: dp x fsdp, HSDP) and
    # fixes the world size (the bench sets it: relevance.config_values); the others are refused with that strategy
    meshes = [(s, k, c) for s, k, c in shown_but_refused if k == "mesh"]
    for s, _, mesh in meshes:
        values = config_values({**IMPLIED.get(s, {}), "strategy": s, "workload": "gpt", "mesh": mesh, "world_size": 2},
                               ExperimentConfig(world_size=2).to_dict())
        owner = "pipeline" if "pp" in mesh else "tp" if "tp" in mesh else "fsdp"
        if s == owner:
            assert ExperimentConfig(**values).world_size == 4  # accepted once the bench sets the world size
        else:
            with pytest.raises(ExperimentConfigError, match=f"set strategy='{owner}'"):
                ExperimentConfig(**values)
    assert {s for s, _, _ in meshes} == {"tp", "pipeline", "fsdp"}
    # model_parallel/pipeline: more stages (world_size x virtual_stages) than the model has blocks
    # is refused with the counts that fit (config_rules._check_stages)
    stages = [(s, k, c) for s, k, c in shown_but_refused
              if s in ("model_parallel", "pipeline") and k in ("world_size", "virtual_stages")]
    assert ("pipeline", "world_size", 8) in stages and ("pipeline", "virtual_stages", 3) in stages
    rest = [x for x in shown_but_refused if x not in splits and x not in stages and x[1] != "mesh"]
    assert sorted(set(rest)) == sorted(fp16) and hidden_but_accepted == []


def test_table_and_plot_show_the_same_exposed_comm_percent() -> None:
    """The table and the plot show the same exposed-communication share for a run: both read the
    median over the steps (the table once read the record's means, 49.7 % against the plot's 39 %:
    one slow step pulls the means apart)."""
    import re

    from kit.experiments.records import merge
    from kit.plots import comm_vs_knob
    from kit.widgets.table import records_html

    cfg = ExperimentConfig(steps=5)
    parts = []
    for rank in (0, 1):
        steps = [{"step": i, "rank": rank, "step_ms": s, "loss": 1.0, "samples": 32, "fwd_ms": 2.0, "bwd_ms": 4.0,
                  "opt_ms": 1.0, "comm_ms": e, "comm_overlap_ms": 0.0, "comm_exposed_ms": e}
                 for i, (s, e) in enumerate(((10.0, 1.0), (10.0, 1.0), (10.0, 1.0), (40.0, 30.0), (60.0, 50.0)))]
        parts.append({"rank": rank, "steps": steps, "memory": {}, "timeline": [], "buckets": [1024],
                      "param_bytes": 1024, "notes": [], "emulated": False, "env": {"device_type": "cpu"},
                      "stopped": False})
    rec = merge(dict(enumerate(parts)), cfg)
    assert rec["summary"]["comm_overhead_pct"] == pytest.approx(100 * 16.6 / 26)  # the means: 63.8 %
    row = re.findall(r"<td[^>]*>([^<]*)</td>", records_html([rec]))
    plotted = comm_vs_knob([rec], knob="bucket_cap_mb").axes[0].get_lines()[0].get_ydata()[0]
    assert plotted == pytest.approx(10.0)  # the median step: 1 ms of 10
    assert f"{plotted:.1f}" in row and f"{rec['summary']['comm_overhead_pct']:.1f}" not in row


def test_switching_to_tp_or_sp_moves_a_model_the_split_refuses_to_the_smallest_that_fits() -> None:
    """The tiny gpt has 1 head, which tp/sp over 2 ranks cannot split (the config refuses it): the
    bench moves to the smallest model size the split accepts and says so in one line."""
    from kit.experiments.config import ExperimentConfigError

    bench = _bench()
    bench.controls["model_size"].value = "tiny"
    assert bench.controls["model_size"].value == "tiny" and bench.message.value == ""  # ddp splits no heads
    with pytest.raises(ExperimentConfigError, match="heads"):
        ExperimentConfig(strategy="tp", workload="gpt", model_size="tiny", world_size=2)
    for strategy in ("tp", "sp"):
        bench.controls["strategy"].value = "ddp"
        bench.controls["model_size"].value = "tiny"
        bench.controls["strategy"].value = strategy
        assert bench.controls["model_size"].value == "small"
        assert "tiny" in bench.message.value and "small" in bench.message.value
        assert bench.make_config().model_size == "small"
    bench.controls["model_size"].value = "tiny"  # chosen again under sp: moved again
    assert bench.controls["model_size"].value == "small"
    bench.controls["strategy"].value = "tp"
    bench.controls["mesh"].value = {"dp": 2, "tp": 2}  # the mesh's tp dimension is what splits the heads
    bench.controls["model_size"].value = "tiny"
    assert bench.controls["model_size"].value == "small" and bench.make_config().mesh == {"dp": 2, "tp": 2}
    bench.controls["model_size"].value = "base"  # a size that fits is left alone
    assert bench.controls["model_size"].value == "base"


def test_the_plot_s_width_cap_holds_where_jupyterlab_s_margin_variable_is_undefined() -> None:
    """The image's max-width is calc(100% - 2 * var(--jp-widgets-margin)): where the variable is undefined
    (a front end without ipywidgets' stylesheet), a var() without a fallback makes max-width compute to `none`,
    and a 9.6 in plot overflows the column again. Each var() carries a fallback (ipywidgets' 2 px)."""
    import re

    bench = LabBench(runner=FakeRunner())
    cap = bench.image.layout.max_width
    uses = re.findall(r"var\(([^()]*)\)", cap)
    assert uses and all("," in u and u.split(",", 1)[1].strip() for u in uses), cap
