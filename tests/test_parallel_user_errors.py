"""What a new user meets with the parallelism features: plot calls with the wrong shape of input
and refusals whose suggested fix is one clear value (found driving a notebook as a learner)."""
from __future__ import annotations

import matplotlib
import pytest

matplotlib.use("Agg")

from kit.experiments.config import ExperimentConfig, ExperimentConfigError  # noqa: E402


def test_interleaved_micro_batch_fix_is_not_repeated() -> None:
    with pytest.raises(ExperimentConfigError) as e:
        ExperimentConfig(strategy="pipeline", schedule="interleaved_1f1b", virtual_stages=2, micro_batches=1,
                         workload="gpt", model_size="tiny", batch_size=8)
    assert "try micro_batches=2" in str(e.value) and "2 or 2" not in str(e.value)


def _timeline_record() -> dict:
    ev = [{"rank": r, "step": 0, "kind": k, "name": n, "start_ms": s, "end_ms": s + 1.0}
          for r in (0, 1) for k, n, s in (("compute", "forward", 0.0), ("comm", "send to 1", 1.0))]
    return {"label": "pipeline x2", "config": {"strategy": "pipeline"}, "timeline": ev}


def test_step_timeline_takes_a_list_like_the_other_plots() -> None:
    from kit.plots import step_timeline

    older = {**_timeline_record(), "label": "older run"}
    fig = step_timeline([older, _timeline_record()])  # draws the last, as the lab bench does
    assert "pipeline x2" in fig._suptitle.get_text()
    with pytest.raises(TypeError, match="one run record"):
        step_timeline([])


@pytest.mark.parametrize("bad", [None, "ep", 3])
def test_load_plots_name_what_they_take(bad: object) -> None:
    from kit.plots import expert_load, ring_balance

    for fn in (expert_load, ring_balance):
        with pytest.raises(TypeError, match="list of run records"):
            fn(bad)


def test_timeline_tells_a_meshs_dimensions_apart_in_the_legend() -> None:
    from kit.plots import step_timeline

    ev = [{"rank": 0, "step": 0, "kind": "comm", "name": n, "start_ms": s, "end_ms": s + 1.0}
          for n, s in (("pp send", 0.0), ("dp all_reduce", 2.0))]
    fig = step_timeline({"label": "pipeline x4 pp2xdp2", "timeline": ev})
    legend = fig.axes[0].get_legend()
    colors = {t.get_text(): tuple(h.get_facecolor()[0] if hasattr(h.get_facecolor(), "__len__")
                                  and len(h.get_facecolor()) and hasattr(h.get_facecolor()[0], "__len__")
                                  else h.get_facecolor())
              for t, h in zip(legend.get_texts(), legend.legend_handles)}
    assert colors["communication (pp send)"] != colors["communication (dp all_reduce)"]


def _mesh_memory_record(label: str) -> dict:
    mem = [{"rank": r, "params_mib": 1.4, "grads_mib": 1.4, "optimizer_mib": 2.8, "activations_mib": 8.5,
            "predicted": {"params_mib": 1.4, "grads_mib": 1.4, "optimizer_mib": 2.8, "activations_mib": 8.5}}
           for r in range(4)]
    return {"label": label, "config": {"strategy": "tp", "world_size": 4}, "memory": mem}


def test_memory_of_three_four_rank_meshes_keeps_its_labels_apart() -> None:
    from test_plots import text_problems  # noqa: E402

    from kit.plots import memory_breakdown

    recs = [_mesh_memory_record(lb) for lb in ("tp x4 gpt bs32 fp32 dp2xtp2", "tp x4 gpt bs32 fp32 fsdp2xtp2",
                                               "pipeline x4 gpt bs32 fp32 gpipe m2 pp2xdp2")]
    fig = memory_breakdown(recs)
    assert text_problems(fig) == []
    drawn = " ".join(t.get_text() for t in fig.findobj(lambda a: hasattr(a, "get_text")))
    assert all(lb.split()[-1] in drawn.replace("\n", " ") for lb in ("dp2xtp2", "fsdp2xtp2", "pp2xdp2"))
    assert "measured MiB" in fig.axes[0].get_legend().get_title().get_text()  # the numbers on the bars


def test_lab_bench_says_what_batch_size_means_for_the_strategy() -> None:
    pytest.importorskip("ipywidgets")
    from kit.widgets import lab_bench

    bench = lab_bench(runner=lambda *a, **k: None)
    batch = bench.controls["batch_size"]
    assert batch.description == "batch per rank"  # ddp: each rank reads batch_size samples
    for strategy in ("pipeline", "tp"):  # the ranks read one batch together (a mesh's dp splits it)
        bench.controls["strategy"].value = strategy
        assert batch.description == "batch (global)"
    bench.controls["strategy"].value = "ddp"
    assert batch.description == "batch per rank"
    label = bench.controls["virtual_stages"].description
    assert len(label) <= 22, f"{label!r} is cut at the knob table's 165 px"


def test_bytes_by_collective_of_four_runs_keeps_its_labels_apart() -> None:
    from test_plots import text_problems  # noqa: E402

    from kit.plots import bytes_by_collective

    def rec(label: str) -> dict:
        per = {"cp/all_reduce": {"payload_bytes": 2.6e6}, "cp/send": {"payload_bytes": 6.1e6}}
        return {"label": label, "config": {"strategy": "cp"},
                "comm": {"report": {"measured_per_step": per, "predicted_per_step": per}}}

    fig = bytes_by_collective([rec("cp gpt bs32 fp32 contiguous"), rec("cp gpt bs32 fp32 zigzag")])
    assert text_problems(fig) == []


@pytest.mark.parametrize("bad", [{"tp": 4}, {"tp": 2, "dp": 2}, {"dp": "2", "tp": 2}, "dp x tp"])
def test_check_mesh_refuses_a_shape_before_building_anything(bad: object) -> None:
    from kit.experiments import check_mesh

    with pytest.raises(ValueError, match=r"outermost first.*check_mesh\(\{'dp': 2, 'tp': 2\}\)"):
        check_mesh(bad)  # before any collective: no process group needed


def test_a_refused_configuration_does_not_read_done() -> None:
    pytest.importorskip("ipywidgets")
    from test_widgets import FakeRunner  # noqa: E402

    from kit.widgets import lab_bench

    bench = lab_bench(runner=FakeRunner())
    bench.controls["steps"].value = 5
    assert bench.run() and bench.wait(60)
    assert bench.progress.description == "done"
    bench.controls["strategy"].value = "tp"
    bench.controls["world_size"].value = 3  # no model size's heads split over 3 ranks: refused
    assert not bench.run()
    assert bench.progress.description == "not run" and bench.progress.value == 0
    assert "model_size" in bench.message.value
    sweep_labels = dict((n, lb) for lb, n in bench.sweep_knob.options)
    assert sweep_labels.get("batch_size") == "batch (global)"  # the sweep menu names it as the knob does


def test_step_breakdown_of_a_pipeline_names_its_waiting() -> None:
    from kit.plots import step_breakdown

    summary = {"step_ms": 60.0, "fwd_ms": 3.0, "bwd_ms": 4.0, "opt_ms": 1.0, "comm_ms": 20.0,
               "comm_overlap_ms": 0.0, "comm_exposed_ms": 20.0}
    rec = {"label": "pipeline m4 v2", "config": {"strategy": "pipeline"}, "summary": summary}
    texts = [t.get_text() for t in step_breakdown([rec]).axes[0].get_legend().get_texts()]
    assert any("bubble" in t for t in texts), texts


def test_bench_offers_bytes_per_collective_only_with_counts() -> None:
    from kit.widgets.render import plot_choices

    pipeline = {"label": "pipeline m4 v2", "config": {"strategy": "pipeline"}, "comm": {"report": {}}}
    assert "bytes_by_collective" not in [fn for _, fn in plot_choices([pipeline])]
    tp = {"label": "tp x4", "config": {"strategy": "tp"},
          "comm": {"report": {"measured_per_step": {"tp/all_reduce": {"payload_bytes": 1}}}}}
    assert "bytes_by_collective" in [fn for _, fn in plot_choices([pipeline, tp])]


def test_memory_plot_says_which_part_has_no_formula() -> None:
    from kit.plots import memory_breakdown

    pp = _mesh_memory_record("pipeline x4 pp2xdp2")
    for m in pp["memory"]:
        m["predicted"]["activations_mib"] = None  # the pipeline's activations: no formula
    title = memory_breakdown([_mesh_memory_record("tp x4 dp2xtp2"), pp]).axes[0].get_legend().get_title().get_text()
    assert "no formula for: activations" in title
    full = memory_breakdown([_mesh_memory_record("tp x4 dp2xtp2")]).axes[0].get_legend().get_title().get_text()
    assert "no formula" not in full


def test_bench_table_leaves_knobs_a_run_does_not_use_empty() -> None:
    from kit.widgets.table import records_html

    def rec(label: str, **cfg: object) -> dict:
        config = {"strategy": "pipeline", "world_size": 2, "schedule": "gpipe", "virtual_stages": 1,
                  "micro_batches": 4, "mesh": None, **cfg}
        return {"label": label, "config": config, "summary": {"step_ms": 10.0}}

    table = records_html([rec("pipeline v2", schedule="interleaved_1f1b", virtual_stages=2),
                          rec("tp dp2xtp2", strategy="tp", world_size=4, mesh={"dp": 2, "tp": 2})])
    tp_row = table.split("tp dp2xtp2")[1].split("</tr>")[0]
    assert "gpipe" not in tp_row and "<td>4</td>" in tp_row  # the ranks show; the pipeline's schedule does not


def test_bench_plot_menu_labels_fit_and_figures_keep_their_size() -> None:
    pytest.importorskip("ipywidgets")
    from kit.plots import PLOTS
    from kit.widgets import lab_bench
    from kit.widgets.render import render_png
    from kit.plots._style import new_figure

    assert max(len(label) for label in PLOTS) <= 44, "the plot dropdown (360 px) cuts longer labels"
    bench = lab_bench(runner=lambda *a, **k: None)
    bench._show(render_png(new_figure(width_in=6.0)))
    assert bench.image.layout.width == "600px"  # 6 in at 100 dpi: shown at its size, not stretched


def test_bench_mesh_menu_offers_only_the_strategys_meshes() -> None:
    pytest.importorskip("ipywidgets")
    from kit.widgets import lab_bench

    bench = lab_bench(runner=lambda *a, **k: None)
    mesh = bench.controls["mesh"]
    bench.controls["strategy"].value = "tp"
    assert [v for _, v in mesh.options if isinstance(v, dict)] == [{"dp": 2, "tp": 2}, {"fsdp": 2, "tp": 2}]
    mesh.value = {"dp": 2, "tp": 2}
    bench.controls["strategy"].value = "pipeline"  # dp x tp does not fit a pipeline: back to none
    assert [v for _, v in mesh.options if isinstance(v, dict)] == [{"pp": 2, "dp": 2}]
    assert not isinstance(mesh.value, dict)
    bench.controls["model_size"].value = "small"
    assert bench.make_config().mesh is None


def test_bytes_by_collective_of_one_run_names_it() -> None:
    from kit.plots import bytes_by_collective

    per = {"tp/all_reduce": {"payload_bytes": 3e6}, "fsdp/all_gather": {"payload_bytes": 2.9e6}}
    rec = {"label": "tp x4 gpt bs32 fp32 fsdp2xtp2", "config": {"strategy": "tp"},
           "comm": {"report": {"measured_per_step": per, "predicted_per_step": per}}}
    assert "fsdp2xtp2" in bytes_by_collective(rec).axes[0].get_title()


def test_bytes_by_collective_draws_one_collective_as_bars_not_slabs() -> None:
    """A tp run's one all_reduce (the lab bench's "Bytes per collective" after a tp run): its measured and
    predicted bars each took 44% of the axes' width, two slabs; now at most a sixth, as with 3 collectives."""
    from test_plots import text_problems  # noqa: E402

    from kit.plots import bytes_by_collective

    per = {"tp/all_reduce": {"payload_bytes": 6.3e6}}
    rec = {"label": "tp gpt bs32 fp32", "config": {"strategy": "tp"},
           "comm": {"report": {"measured_per_step": per, "predicted_per_step": per}}}
    for recs in (rec, [rec, {"label": "ddp mlp bs32 fp32", "config": {"strategy": "ddp"}, "comm": {}}]):
        fig = bytes_by_collective(recs)
        ax = fig.axes[0]
        span = abs(ax.get_xlim()[1] - ax.get_xlim()[0])
        assert all(p.get_width() / span <= 1 / 6 for p in ax.patches if p.get_height() > 0), span
        assert text_problems(fig) == []


def test_bytes_by_collective_keeps_its_legend_off_the_bars() -> None:
    """HSDP's dp row has one collective, whose two bars filled the axes: the legend sat on the predicted one."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg

    from kit.plots import bytes_by_collective

    per = {"dp/all_reduce": {"payload_bytes": 1.33e6}, "fsdp/all_gather": {"payload_bytes": 5.3e6},
           "fsdp/reduce_scatter": {"payload_bytes": 2.66e6}}
    rec = {"label": "fsdp x4 gpt bs32 fp32 zero3 dp2xfsdp2", "config": {"strategy": "fsdp"},
           "comm": {"report": {"measured_per_step": per, "predicted_per_step": per}}}
    fig = bytes_by_collective(rec)
    FigureCanvasAgg(fig).draw()
    ax = fig.axes[0]
    box = ax.get_legend().get_window_extent()
    bars = [p.get_window_extent() for p in ax.patches if p.get_height() > 0]
    assert bars and not [b for b in bars if b.overlaps(box)], (box, bars)


def test_bytes_by_collective_reads_the_runs_counts_once_not_once_per_dimension(monkeypatch: pytest.MonkeyPatch) -> None:
    """An HSDP run has two mesh dimensions (dp, fsdp): every run's counts were read once to find the dimensions,
    then again for each dimension (three reads here, 1 + d on a d-dimension mesh). Now once; the same bars."""
    import kit.plots.parallel as parallel

    reads: list[int] = []
    rows = parallel._rows
    monkeypatch.setattr(parallel, "_rows", lambda recs: reads.append(len(recs)) or rows(recs))
    per = {"dp/all_reduce": {"payload_bytes": 1.33e6}, "fsdp/all_gather": {"payload_bytes": 5.3e6},
           "fsdp/reduce_scatter": {"payload_bytes": 2.66e6}}
    rec = {"label": "fsdp x4 gpt bs32 fp32 zero3 dp2xfsdp2", "config": {"strategy": "fsdp"},
           "comm": {"report": {"measured_per_step": per, "predicted_per_step": per}}}
    fig = parallel.bytes_by_collective([rec, {**rec, "label": "fsdp x4 gpt bs64 fp32 zero3 dp2xfsdp2"}])
    assert reads == [2]
    assert len([ax for ax in fig.axes if ax.patches]) == 2  # a row of bars per dimension, as before
