"""What a new user meets in the first minutes, each checked (the README's own steps are in
tests/test_readme.py, its snippets in tests/test_doc_snippets.py)."""
from __future__ import annotations

import pathlib
import re
import subprocess
import sys

import pytest

from kit.config import LaunchConfig
from kit.errors import ConfigError

ROOT = pathlib.Path(__file__).resolve().parent.parent
WALL_CLOCK_S = 240


def test_demo_says_what_to_do_next_and_each_step_exists(tmp_path):
    out = subprocess.run([sys.executable, "-m", "kit", "demo"], cwd=tmp_path, capture_output=True, text=True,
                         timeout=180)
    assert out.returncode == 0, out.stderr[-2000:]
    after = out.stdout.split("\nnext:\n", 1)[1]
    assert "jupyter lab lessons/" in after and (ROOT / "lessons" / "00_quickstart.ipynb").exists()
    named = re.findall(r"from kit\.widgets import (\w+); (\w+)\(\)", after)  # the lab bench, the planner
    assert {n for n, _ in named} == {"lab_bench", "plan_panel"}
    for name, called in named:
        space: dict = {}
        exec(f"from kit.widgets import {name}", space)  # as typed: the import gives a function to call
        assert called == name and callable(space[name]), name


@pytest.mark.parametrize("visible, asked, says, never", [
    (0, 1, "asked for 1 GPU but 0 are visible", ("Use --gpus", "1 GPUs")),
    (0, 2, "Use --cpus 2 (this machine has no GPU)", ("Use --gpus",)),
    (1, 2, "Use --gpus 1 or --cpus 2", ("2 GPU ",)),
])
def test_strict_without_enough_gpus_names_a_fix_that_works(visible, asked, says, never):
    from kit.engine.devices import place

    with pytest.raises(ConfigError) as e:
        place(LaunchConfig(world_size=asked, device="gpu", strict=True), gpu_count=visible)
    assert says in str(e.value) and not any(n in str(e.value) for n in never), str(e.value)


def test_a_users_interrupt_is_not_called_a_root_cause():
    from kit.errors import CellError, RankFailure

    stopped = {r: RankFailure(r, "KeyboardInterrupt", "", "Traceback ...\nKeyboardInterrupt", 2, time_s=r)
               for r in (0, 1)}
    note = "[kit] interrupted at your request; every rank and its variables are kept."
    shown = CellError(stopped, [note])._render_traceback_()
    assert "root cause" not in shown[0] and shown[-1] == note
    failed = {**stopped, 1: RankFailure(1, "ValueError", "bad", "Traceback ...\nValueError: bad", 3, time_s=0)}
    assert "(root cause: first failure observed)" in CellError(failed)._render_traceback_()[0]


def test_root_cause_is_said_only_when_other_ranks_failed_otherwise():
    """A NameError on one rank, or a SyntaxError every rank raised alike, is the error itself: the headline adds
    `(root cause: first failure observed)` only where other ranks failed otherwise, when it tells them apart."""
    from kit.errors import CellError, RankFailure

    def error(rank: int, ename: str, evalue: str, t: float) -> RankFailure:
        return RankFailure(rank, ename, evalue, f"Traceback ...\n{ename}: {evalue}", 3, time_s=t)

    alone = CellError({1: error(1, "NameError", "name 'x' is not defined", 1)})._render_traceback_()
    alike = CellError({r: error(r, "SyntaxError", "expected ':'", r) for r in (0, 1)})._render_traceback_()
    assert alone[0] == "CellError: rank 1 raised NameError at line 3: name 'x' is not defined", alone
    assert alike[0] == "CellError: rank 0 raised SyntaxError at line 3: expected ':'" and "rank 1: the same SyntaxError" in alike
    released = {0: error(0, "ValueError", "bad", 1), 1: error(1, "CollectiveMismatchError", "rank 1 was released", 2)}
    assert CellError(released)._render_traceback_()[0].endswith("  (root cause: first failure observed)")


def test_ranks_interrupted_at_different_lines_are_said_to_differ_and_where():
    """A DDP loop interrupted: rank 1 stops in backward (line 3), rank 0 after opt.step() (line 4), so their
    step counts and weights now differ. The error names each rank's line and the note says what may differ, so
    `step` 790 on rank 0 and 789 on rank 1 in the next cell comes as no surprise."""
    from kit.errors import CellError, RankFailure, interrupted_note

    apart = {0: RankFailure(0, "KeyboardInterrupt", "", "Traceback ...\nKeyboardInterrupt", 4, time_s=2, cell="In [12]"),
             1: RankFailure(1, "KeyboardInterrupt", "", "Traceback ...\nKeyboardInterrupt", 3, time_s=1, cell="In [12]")}
    note = interrupted_note(apart, (0, 1))
    assert "rank 0 at line 4, rank 1 at line 3" in note and "may now differ between the ranks" in note, note
    shown = CellError(apart, [note])._render_traceback_()
    assert "rank 0: the same KeyboardInterrupt at line 4 of In [12]" in shown, shown
    one_done = interrupted_note({1: apart[1]}, (0, 1))
    assert "rank 1 at line 3, rank 0 had finished the cell" in one_done and "may now differ" in one_done, one_done
    level = {r: RankFailure(r, "KeyboardInterrupt", "", "tb", 3, time_s=r) for r in (0, 1)}
    assert interrupted_note(level, (0, 1)) == "[kit] interrupted at your request; every rank and its variables are kept."
    assert "rank 1: the same KeyboardInterrupt" in CellError(level)._render_traceback_()  # same line: not repeated


def test_planner_text_counts_the_nics_of_the_node_asked_for():
    from kit.experiments import cluster_spec

    assert "6 x 50 GB/s = 300 GB/s egress per node" in cluster_spec(2, 6).describe()  # was "8 x 50 GB/s"
    assert "8 x 50 GB/s = 400 GB/s egress per node" in cluster_spec(2, 8).describe()
    assert "(1 GPU)" in cluster_spec(1, 1).describe()


def test_planner_legends_stay_below_the_axis_labels_when_nothing_fits():
    from kit.experiments import plan
    from kit.plots import plan_layouts

    p = plan("llama3-405b", nodes=1, gpus_per_node=1)
    assert not p.layouts and p.smallest is not None
    fig = plan_layouts(p)
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    canvas = FigureCanvasAgg(fig)
    canvas.draw()
    renderer = canvas.get_renderer()
    assert len(fig.legends) == 2  # one key per panel, below the figure
    for ax in fig.axes:
        label = ax.xaxis.label.get_window_extent(renderer)
        for legend in fig.legends:
            box = legend.get_window_extent(renderer)
            assert box.y1 <= label.y0, (ax.get_xlabel(), box, label)  # the legend's top under the label
    assert "nothing fits" in fig._suptitle.get_text()


def _bench():
    sys.path.insert(0, str(ROOT / "tests"))
    from test_widgets import FakeRunner

    from kit.widgets import lab_bench
    return lab_bench(runner=FakeRunner())


def test_lab_bench_suggests_only_sweep_values_the_configuration_accepts():
    bench = _bench()
    bench.sweep_knob.value = "world_size"
    assert "1" not in bench.sweep_values.value.split(", ")  # ddp needs 2 ranks: 1 was offered, then refused
    assert bench.sweep() is True
    bench.wait()
    bench.sweep_values.value = "2, 4"  # typed by the learner: kept when the configuration changes
    bench.controls["batch_size"].value = 16
    assert bench.sweep_values.value == "2, 4"


def test_predicted_scaling_after_an_fsdp_run_is_titled_fsdp():
    sys.path.insert(0, str(ROOT / "tests"))
    from test_predict import PSI, record

    from kit.widgets.render import draw_plot
    title = draw_plot("scaling_prediction", [record(buckets=[PSI] * 4, strategy="fsdp", world_size=2)])._suptitle
    assert title.get_text().startswith("predicted fsdp (zero3) on"), title.get_text()
    title = draw_plot("scaling_prediction", [record(buckets=[PSI] * 4, strategy="tp", world_size=2)])._suptitle
    assert "tp is not one predict() models, so this is DDP" in title.get_text()


CODE_WIDTH_CHARS = 105  # JupyterLab at 1280 px with the file browser open: an 846 px code cell, ~108 characters


@pytest.mark.parametrize("lesson", sorted(p.stem for p in (ROOT / "lessons").glob("[0-9][0-9]_*.ipynb")))
def test_lesson_code_is_not_cut_at_the_right_edge(lesson):
    """Every lesson's code lines stay inside the cell's right edge (JupyterLab does not wrap code)."""
    import json

    nb = json.loads((ROOT / "lessons" / f"{lesson}.ipynb").read_text())
    long = [line for c in nb["cells"] if c["cell_type"] == "code" for line in "".join(c["source"]).splitlines()
            if len(line) > CODE_WIDTH_CHARS]
    assert not long, long
