"""The lab bench: a control panel that runs real configurations and plots them as they finish.

Why it is built this way (each point was checked in JupyterLab with ipywidgets 8 and is
written for ipywidgets 7.7 too, which Colab ships):
- Runs happen in a `threading.Thread`, so the kernel stays free to take the Stop click.
- The thread touches widgets only by setting traits (`value`, `disabled`): `with out:` from a
  thread renders nothing, and jupyter-ui-poll style blocking breaks on ipykernel 7.
- Plots are `Figure` objects saved to PNG bytes into an `Image` widget: no pyplot, no ipympl.
"""
from __future__ import annotations

import html
import threading
from dataclasses import fields
from typing import Any, Callable, Mapping, Sequence

from kit.widgets.knobs import (
    KNOBS, Knob, control_value, experiments_attr, field_default, make_control, parse_values,
)
from kit.widgets.relevance import batch_label, config_values, narrow_mesh_menu, shown
from kit.widgets.render import draw_plot, plot_choices, plottable, render_png
from kit.widgets.table import failure_html, load_records, records_html, save_jsonl

__all__ = ["LabBench", "lab_bench"]

Runner = Callable[..., Mapping[str, Any]]


class LabBench:
    """Choose knobs, Run one configuration or Sweep one knob, and compare the results.

    Args:
        cluster: a running `kit.Cluster` to reuse (faster: no process start per run); None
            lets each run start and stop its own ranks.
        results_path: JSONL file every finished run is appended to by the runner.
        runner: `run(config, cluster=, results_path=, progress=, stop=) -> record`;
            default `kit.experiments.run`.
        knobs: the knob table (default `kit.widgets.knobs.KNOBS`).
    """

    def __init__(self, cluster: Any = None, results_path: str | None = None,
                 runner: Runner | None = None, knobs: Sequence[Knob] = KNOBS) -> None:
        import ipywidgets as w

        ExperimentConfig = experiments_attr("ExperimentConfig")
        self.cluster, self.results_path = cluster, results_path
        self._config_cls = ExperimentConfig
        self._runner: Runner = runner or experiments_attr("run")
        self.records: list[dict[str, Any]] = []
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._last_sweep_knob: str | None = None

        names = {f.name: f for f in fields(ExperimentConfig)}
        self.knobs = [k for k in knobs if k.name in names]
        self.defaults = {k.name: field_default(names[k.name], k.default) for k in self.knobs}
        self.controls = {k.name: make_control(k, self.defaults[k.name]) for k in self.knobs}
        self._meshes = list(self.controls["mesh"].options) if "mesh" in self.controls else []

        sweepable = [(k.label, k.name) for k in self.knobs if k.sweepable]
        self.sweep_knob = w.Dropdown(options=sweepable, value="bucket_cap_mb" if any(
            n == "bucket_cap_mb" for _, n in sweepable) else sweepable[0][1],
            description="sweep", layout=w.Layout(width="260px"),
            style={"description_width": "50px"})
        self.sweep_values = w.Text(value="1, 5, 25, 100", placeholder="values, comma separated",
                                   layout=w.Layout(width="200px"))
        self.run_button = w.Button(description="Run", button_style="primary", icon="play",
                                   tooltip="run the configuration above once")
        self.sweep_button = w.Button(description="Sweep", button_style="info", icon="forward",
                                     tooltip="one run per value of the chosen knob")
        self.stop_button = w.Button(description="Stop", button_style="danger", icon="stop",
                                    disabled=True, tooltip="stop after the current step")
        self.progress = w.IntProgress(value=0, min=0, max=1, description="idle",
                                      layout=w.Layout(width="340px"),
                                      style={"description_width": "60px"})
        self.status = w.Label(value="")
        self.message = w.HTML(value="")
        self.plot_choice = w.Dropdown(options=plot_choices([]), value="step_breakdown",
                                      description="plot", layout=w.Layout(width="360px"),
                                      style={"description_width": "50px"})
        # Hidden until the first plot: an empty Image shows as a broken-image icon.
        self.image = w.Image(format="png", layout=w.Layout(max_width="900px", display="none"))
        self.table = w.HTML(value=records_html([]))
        self.path = w.Text(value=results_path or "kit-results-bench.jsonl",
                           description="file", layout=w.Layout(width="320px"),
                           style={"description_width": "40px"})
        self.save_button = w.Button(description="Save", icon="save",
                                    tooltip="write the table's runs to the file (JSONL)")
        self.load_button = w.Button(description="Load", icon="folder-open",
                                    tooltip="add the runs stored in the file")
        self.clear_button = w.Button(description="Clear", icon="trash",
                                     tooltip="empty the table (files are kept)")

        self.run_button.on_click(lambda _b: self.run())
        self.sweep_button.on_click(lambda _b: self.sweep())
        self.stop_button.on_click(lambda _b: self.stop())
        self.save_button.on_click(lambda _b: self.save())
        self.load_button.on_click(lambda _b: self.load())
        self.clear_button.on_click(lambda _b: self.clear())
        self._choosing = False
        self.plot_choice.observe(lambda _c: None if self._choosing else self.redraw(), names="value")
        self.sweep_knob.observe(self._suggest_values, names="value")

        self.columns = (w.VBox(), w.VBox())
        self._sweep_wanted: str | None = None
        for c in self.controls.values():  # strategy, compression, ...: what they decide is shown
            c.observe(lambda _c: self._arrange(), names="value")
        self._arrange()
        self.widget = w.VBox([
            w.HTML("<b>Lab bench</b>: pick a configuration, <b>Run</b> it, or <b>Sweep</b> "
                   "one knob; every finished run lands in the table and the plot. Only the knobs "
                   "the chosen strategy uses are shown."),
            w.HBox(list(self.columns)),
            w.HBox([self.run_button, self.sweep_knob, self.sweep_values, self.sweep_button,
                    self.stop_button]),
            w.HBox([self.progress, self.status]),
            self.message,
            self.plot_choice,
            self.image,
            w.HBox([self.path, self.save_button, self.load_button, self.clear_button]),
            self.table,
        ])

    # -- configuration -------------------------------------------------------------------
    def values(self) -> dict[str, Any]:
        """The configuration the panel shows now: shown knobs as set, hidden ones at their default."""
        return config_values({name: control_value(c.value) for name, c in self.controls.items()}, self.defaults)

    def visible(self) -> list[str]:
        """The knobs shown for the current configuration, in the panel's order."""
        raw = {name: control_value(c.value) for name, c in self.controls.items()}
        return [name for name in self.controls if shown(name, raw)]

    def _arrange(self) -> None:
        """Two columns of the shown controls; the sweep menu offers only those."""
        names = self.visible()
        if "batch_size" in self.controls:  # per rank for ddp, the whole batch for a pipeline or tp
            self.controls["batch_size"].description = batch_label(self.controls["strategy"].value)
        if self._meshes:
            narrow_mesh_menu(self.controls["mesh"], self._meshes, self.controls["strategy"].value)
        half = (len(names) + 1) // 2
        self.columns[0].children = [self.controls[n] for n in names[:half]]
        self.columns[1].children = [self.controls[n] for n in names[half:]]
        options = [(self.controls[k.name].description, k.name) for k in self.knobs if k.sweepable and k.name in names]
        if list(self.sweep_knob.options) != options:
            before, typed = self.sweep_knob.value, self.sweep_values.value
            # a knob hidden by a strategy switch comes back when the learner switches back
            wanted = self._sweep_wanted if self._sweep_wanted in names else before
            keep = wanted if wanted in names else options[0][1]
            if before not in names:
                self._sweep_wanted = before
            self.sweep_knob.options = options  # resets the value, which suggests new sweep values
            self.sweep_knob.value = keep
            if keep == self._sweep_wanted:
                self._sweep_wanted = None
            if keep == before:
                self.sweep_values.value = typed  # same knob: keep what the learner typed

    def make_config(self, **overrides: Any) -> Any:
        """An `ExperimentConfig` from the controls (raises its ValueError when invalid)."""
        return self._config_cls(**{**self.values(), **overrides})

    def _suggest_values(self, change: Mapping[str, Any]) -> None:
        knob = next(k for k in self.knobs if k.name == change["new"])
        opts = knob.choices() or [False, True]
        self.sweep_values.value = ", ".join("none" if v is None else str(v) for v in opts[:4])

    # -- actions -------------------------------------------------------------------------
    def run(self) -> bool:
        """Start one run of the current configuration; False (and a message) if invalid."""
        try:
            configs = [self.make_config()]
        except ValueError as exc:
            return self._invalid(exc)
        self._last_sweep_knob = None
        return self._start(configs)

    def sweep(self, knob: str | None = None, values: Sequence[Any] | None = None) -> bool:
        """Start one run per value of `knob` (default: the sweep controls' choice)."""
        knob = knob or self.sweep_knob.value
        spec = next(k for k in self.knobs if k.name == knob)
        try:
            vals = list(values) if values is not None else parse_values(
                spec, self.sweep_values.value)
            configs = [self.make_config(**{knob: v}) for v in vals]
        except ValueError as exc:
            return self._invalid(exc)
        self._last_sweep_knob = knob
        return self._start(configs)

    def stop(self) -> None:
        """Ask the running configuration to stop after its current step; skip the rest."""
        self._stop.set()
        self.status.value = "stopping after the current step..."

    def wait(self, timeout_s: float = 300.0) -> bool:
        """Block until the running work ends (for scripts and tests); True if it ended."""
        t = self._thread
        if t is not None:
            t.join(timeout_s)
        return t is None or not t.is_alive()

    @property
    def busy(self) -> bool:
        """True while a run or sweep is in progress."""
        return self._thread is not None and self._thread.is_alive()

    def clear(self) -> None:
        self.records.clear()
        self._refresh()  # an empty table, no image, and the plot menu without the ep/cp plots
        self._say("Table cleared (files on disk are kept).")

    def save(self) -> None:
        n = save_jsonl(list(self.records), self.path.value)
        self._say(f"Saved {n} run(s) to {_esc(self.path.value)}.")

    def load(self) -> None:
        try:
            recs = load_records(self.path.value)
        except (OSError, ValueError) as exc:
            self._say(f"Could not load {_esc(self.path.value)}: {_esc(str(exc))}", error=True)
            return
        have = {r.get("run_id") for r in self.records}
        new = [r for r in recs if r.get("run_id") not in have or r.get("run_id") is None]
        self.records.extend(new)
        self._refresh()
        self._say(f"Loaded {len(new)} run(s) from {_esc(self.path.value)}.")

    # -- work thread ---------------------------------------------------------------------
    def _start(self, configs: list[Any]) -> bool:
        if self.busy:
            self._say("Already running: press Stop first.", error=True)
            return False
        self._stop.clear()
        self._set_busy(True)
        self._say("")
        self._thread = threading.Thread(target=self._work, args=(configs,), daemon=True,
                                        name="kit-lab-bench")
        self._thread.start()
        return True

    def _work(self, configs: list[Any]) -> None:
        n = len(configs)
        done = 0
        try:
            for i, cfg in enumerate(configs, 1):
                if self._stop.is_set():
                    break
                label = cfg.label()
                self.progress.description = f"run {i}/{n}"
                self.status.value = f"{label}: starting ranks..."

                def progress(step: int, total: int, _label: str = label) -> None:
                    self.progress.max = max(1, int(total))
                    self.progress.value = min(int(step), self.progress.max)
                    # Measured steps only (run() reports 0 through warm-up); a runner that
                    # reports only start (0/1) and end (1/1) has no step count.
                    where = (f"step {step}/{total}" if step else "warming up...") if total > 1 \
                        else ("running on the ranks..." if step < total else "done")
                    self.status.value = f"{_label}: {where}"

                try:
                    rec = self._runner(cfg, cluster=self.cluster,
                                       results_path=self.results_path, progress=progress,
                                       stop=self._stop)
                except Exception as exc:  # shown in the panel; the kernel must not see it
                    if self._stop.is_set():
                        break
                    self._failed(label, exc)
                    return
                if rec and not (self._stop.is_set() and not rec.get("steps")):
                    self.records.append(dict(rec))
                    done += rec.get("complete", True) is not False
                    self._refresh()
            cut = bool(self.records) and self.records[-1].get("complete", True) is False
            self._say(f"Finished {done} run(s)." if not self._stop.is_set() else
                      f"Stopped by you: {done} of {n} run(s) finished" + (
                          "; the stopped run is in the table, marked incomplete, and left out "
                          "of the plots." if cut else "."))
        finally:
            self._set_busy(False)

    def _failed(self, label: str, exc: BaseException) -> None:
        self._say(failure_html(label, exc), error=True)

    def _invalid(self, exc: BaseException) -> bool:
        self.progress.value, self.progress.description = 0, "not run"  # not the last run's "done"
        self._say(f"Invalid configuration: {_esc(str(exc))}", error=True)
        return False

    def _set_busy(self, busy: bool) -> None:
        self.run_button.disabled = self.sweep_button.disabled = busy
        self.stop_button.disabled = not busy
        self.progress.bar_style = "info" if busy else ""
        if not busy:
            self.progress.description = "done"
            self.status.value = ""

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
            self._say(f"Cannot draw this plot from these runs: {_esc(str(exc))}", error=True)

    def _show(self, png: bytes) -> None:
        self.image.value = png
        # the figure's own pixel width (PNG header), so a narrow figure is not stretched to the cell's
        # width with its fonts blown up; max_width still shrinks a wide one
        self.image.layout.width = f"{int.from_bytes(png[16:20], 'big')}px" if png[:8] == b"\x89PNG\r\n\x1a\n" else None
        self.image.layout.display = None if png else "none"

    def _ipython_display_(self) -> None:
        from IPython.display import display

        display(self.widget)


def _esc(text: str) -> str:
    return html.escape(text, quote=False)  # text content: quotes may stay readable


def lab_bench(cluster: Any = None, results_path: str | None = None,
              runner: Runner | None = None) -> LabBench:
    """Build the lab bench (display it by leaving it as a cell's last expression)."""
    return LabBench(cluster=cluster, results_path=results_path, runner=runner)
