"""The lab bench: a control panel that runs real configurations and plots them as they finish.

Why it is built this way (each point was checked in JupyterLab with ipywidgets 8 and is
written for ipywidgets 7.7 too, which Colab ships):
- Runs happen in a `threading.Thread`, so the kernel stays free to take the Stop click
  (bench_runs.py: Run, Sweep, Stop; the thread itself is task_thread.TaskThread, shared with the
  plan panel).
- The thread touches widgets only by setting traits (`value`, `disabled`): `with out:` from a
  thread renders nothing, and jupyter-ui-poll style blocking breaks on ipykernel 7.
- Plots are `Figure` objects saved to PNG bytes into an `Image` widget: no pyplot, no ipympl.
The widgets and their layout are bench_layout.py; the menus that follow the configuration,
bench_menus.py; this module wires them and owns the records, the table and the plot.
"""
from __future__ import annotations

import os
from dataclasses import fields
from typing import Any, Sequence

from kit.keywords import passes_keywords_to
from kit.widgets.bench_layout import BenchWidgets, panel
from kit.widgets.bench_menus import BenchMenus
from kit.widgets.bench_runs import BenchRuns, Runner
from kit.widgets.knobs import KNOBS, Knob, config_defaults, control_value, experiments_attr, make_control
from kit.widgets.relevance import config_values
from kit.widgets.render import draw_plot, plot_choices, plottable, render_png
from kit.widgets.table import esc, load_records, records_html, save_jsonl

__all__ = ["LabBench", "lab_bench"]


class LabBench(BenchWidgets, BenchMenus, BenchRuns):
    """Choose knobs, Run one configuration or Sweep one knob, and compare the results.

    Args:
        cluster: a running `kit.Cluster` to reuse (faster: no process start per run); None
            lets each run start and stop its own ranks.
        results_path: JSONL file every finished run is appended to by the runner.
        runner: `run(config, cluster=, results_path=, progress=, stop=) -> record`;
            default `kit.experiments.run`.
        knobs: the knob table; None: `kit.widgets.knobs.KNOBS` (None, so that help() and completion show
            one word, not the table's 27 entries).
    """

    def __init__(self, cluster: Any = None, results_path: str | None = None,
                 runner: Runner | None = None, knobs: Sequence[Knob] | None = None) -> None:
        import ipywidgets as w

        self.cluster, self.results_path = cluster, results_path
        self._config_cls = experiments_attr("ExperimentConfig")
        self._runner = runner or experiments_attr("run")
        self.records: list[dict[str, Any]] = []
        self._init_thread()
        self._last_sweep_knob: str | None = None
        self._sweep_wanted: str | None = None
        self._choosing = False

        names = {f.name: f for f in fields(self._config_cls)}
        self.knobs = [k for k in (KNOBS if knobs is None else knobs) if k.name in names]
        defaults = config_defaults()  # ExperimentConfig's own: the table restates none
        self.defaults = {k.name: defaults[k.name] for k in self.knobs}
        self.controls = {k.name: make_control(k, self.defaults[k.name]) for k in self.knobs}
        self._meshes = list(self.controls["mesh"].options) if "mesh" in self.controls else []
        sweepable = [(k.label, k.name) for k in self.knobs if k.sweepable]
        self._make_widgets(w, sweepable, results_path)  # bench.run_button, .table, ...
        self.columns = (w.VBox(), w.VBox())
        self._wire()
        self._arrange()
        self.widget = panel(w, self)

    def _wire(self) -> None:
        """What each click and each change does."""
        self.run_button.on_click(lambda _b: self.run())
        self.sweep_button.on_click(lambda _b: self.sweep())
        self.stop_button.on_click(lambda _b: self.stop())
        self.save_button.on_click(lambda _b: self.save())
        self.load_button.on_click(lambda _b: self.load())
        self.clear_button.on_click(lambda _b: self.clear())
        self.plot_choice.observe(lambda _c: None if self._choosing else self.redraw(), names="value")
        self.sweep_knob.observe(self._suggest_values, names="value")
        for c in self.controls.values():  # strategy, compression, ...: what they decide is shown
            c.observe(lambda _c: self._arrange(), names="value")

    # -- configuration -------------------------------------------------------------------
    def values(self) -> dict[str, Any]:
        """The configuration the panel shows now: shown knobs as set, hidden ones at their default."""
        return config_values({name: control_value(c.value) for name, c in self.controls.items()}, self.defaults)

    def make_config(self, **overrides: Any) -> Any:
        """An `ExperimentConfig` from the controls (raises its ValueError when invalid)."""
        return self._config_cls(**{**self.values(), **overrides})

    # -- the table and its file ----------------------------------------------------------
    def clear(self) -> None:
        self.records.clear()
        self._refresh()  # an empty table, no image, and the plot menu without the ep/cp plots
        self._say("Table cleared (files on disk are kept).")

    def save(self) -> None:
        n = save_jsonl(list(self.records), self.path.value)
        self._say(f"Saved {n} run(s) to {esc(self.path.value)}.")

    def load(self) -> None:
        if not os.path.isfile(self.path.value):  # a typo must not read as an empty file
            self._say(f"No file {esc(self.path.value)} (in {esc(os.getcwd())}): check the name, or Save first.",
                      error=True)
            return
        try:
            recs = load_records(self.path.value)
        except (OSError, ValueError) as exc:
            self._say(f"Could not load {esc(self.path.value)}: {esc(str(exc))}", error=True)
            return
        if not recs:
            self._say(f"{esc(self.path.value)} has no run records (lines of kit.run JSON, as Save writes).",
                      error=True)
            return
        have = {r.get("run_id") for r in self.records}
        new = [r for r in recs if r.get("run_id") not in have or r.get("run_id") is None]
        self.records.extend(new)
        self._refresh()
        self._say(f"Loaded {len(new)} run(s) from {esc(self.path.value)}.")

    # -- what the panel shows ------------------------------------------------------------
    def _say(self, text: str, error: bool = False) -> None:
        color = "#D55E00" if error else "inherit"
        self.message.value = f"<div style='color:{color}'>{text}</div>" if text else ""

    def _refresh(self) -> None:
        self.table.value = records_html(self.records)
        choices = plot_choices(plottable(self.records))  # ep/cp load plots once a run has their data
        if list(self.plot_choice.options) != choices:
            keep, self._choosing = self.plot_choice.value, True  # one redraw below, not one per change
            try:
                self.plot_choice.options = choices
                self.plot_choice.value = keep if keep in dict(choices).values() else "step_breakdown"
            finally:
                self._choosing = False
        self.redraw()

    def redraw(self) -> None:
        """Draw the chosen plot from the table's runs into the image (any thread)."""
        recs = plottable(self.records)  # runs stopped mid-way stay in the table, not the plot
        if not recs:
            self._show(b"")
            return
        name = self.plot_choice.value
        try:
            fig = draw_plot(name, recs, knob=self._last_sweep_knob,
                            labels={k.name: k.label for k in self.knobs})
            self._show(render_png(fig))
        except Exception as exc:  # a plot that cannot draw these runs says so
            self._say(f"Cannot draw this plot from these runs: {esc(str(exc))}", error=True)

    def _show(self, png: bytes) -> None:
        self.image.value = png
        # the figure's own pixel width (PNG header), so a narrow figure is not stretched to the cell's
        # width with its fonts blown up; max_width still shrinks a wide one
        self.image.layout.width = f"{int.from_bytes(png[16:20], 'big')}px" if png[:8] == b"\x89PNG\r\n\x1a\n" else None
        self.image.layout.display = None if png else "none"

    def _ipython_display_(self) -> None:
        from IPython.display import display

        display(self.widget)


@passes_keywords_to(LabBench)  # help(lab_bench) and completion list LabBench's keywords, `knobs` too
def lab_bench(cluster: Any = None, **kw: Any) -> LabBench:
    """Build the lab bench (display it by leaving it as a cell's last expression); the keywords are
    LabBench's, with its defaults."""
    return LabBench(cluster=cluster, **kw)
