"""The lab bench's widgets and how they are laid out (no behaviour: bench.py wires the clicks).

Why apart from the panel's logic: the layout is long and flat (one widget per line), and reading
what a click does should not mean scrolling past every width and tooltip.
"""
from __future__ import annotations

from typing import Any, Sequence

from kit.widgets.render import plot_choices
from kit.widgets.table import records_html

__all__ = ["BenchWidgets", "panel"]


class BenchWidgets:
    """Every widget below the knobs, as `LabBench` attributes: run/sweep/stop, progress, message,
    plot, table and file."""

    def _make_widgets(self, w: Any, sweepable: Sequence[tuple[str, str]], results_path: str | None) -> None:
        first = "bucket_cap_mb" if any(n == "bucket_cap_mb" for _, n in sweepable) else sweepable[0][1]
        self.sweep_knob = w.Dropdown(options=list(sweepable), value=first, description="sweep",
                                     layout=w.Layout(width="260px"), style={"description_width": "50px"})
        self.sweep_values = w.Text(value="1, 5, 25, 100", placeholder="values, comma separated",
                                   layout=w.Layout(width="200px"))
        self.run_button = w.Button(description="Run", button_style="primary", icon="play",
                                   tooltip="run the configuration above once")
        self.sweep_button = w.Button(description="Sweep", button_style="info", icon="forward",
                                     tooltip="one run per value of the chosen knob")
        self.stop_button = w.Button(description="Stop", button_style="danger", icon="stop",
                                    disabled=True, tooltip="stop after the current step")
        self.progress = w.IntProgress(value=0, min=0, max=1, description="idle", layout=w.Layout(width="340px"),
                                      style={"description_width": "60px"})
        self.status = w.Label(value="")
        self.message = w.HTML(value="")
        self.plot_choice = w.Dropdown(options=plot_choices([]), value="step_breakdown", description="plot",
                                      layout=w.Layout(width="360px"), style={"description_width": "50px"})
        # Hidden until the first plot: an empty Image shows as a broken-image icon. At most the output's width
        # less the widget's 2 px margins: a 900 px cap let a 9.6 in plot (960 px) overflow JupyterLab's 848 px
        # column at 1280 px with the file browser open, cutting off its key's right edge. The var() has a
        # fallback (ipywidgets' own 2 px): where a var() without one is undefined, the declaration is not
        # dropped for ipywidgets' max-width: 100% but computes to max-width: none, and the plot overflows again
        self.image = w.Image(format="png", layout=w.Layout(
            max_width="calc(100% - 2 * var(--jp-widgets-margin, 2px))", display="none"))
        self.table = w.HTML(value=records_html([]))
        self.path = w.Text(value=results_path or "kit-results-bench.jsonl", description="file",
                           layout=w.Layout(width="320px"), style={"description_width": "40px"})
        self.save_button = w.Button(description="Save", icon="save",
                                    tooltip="write the table's runs to the file (JSONL)")
        self.load_button = w.Button(description="Load", icon="folder-open", tooltip="add the runs stored in the file")
        self.clear_button = w.Button(description="Clear", icon="trash", tooltip="empty the table (files are kept)")


def panel(w: Any, b: Any) -> Any:
    """The whole panel, top to bottom, from a bench's widgets (`b.columns` hold the knobs)."""
    return w.VBox([
        w.HTML("<b>Lab bench</b>: pick a configuration, <b>Run</b> it, or <b>Sweep</b> "
               "one knob; every finished run lands in the table and the plot. Only the knobs "
               "the chosen strategy uses are shown."),
        w.HBox(list(b.columns)),
        w.HBox([b.run_button, b.sweep_knob, b.sweep_values, b.sweep_button, b.stop_button]),
        w.HBox([b.progress, b.status]),
        b.message,
        b.plot_choice,
        b.image,
        w.HBox([b.path, b.save_button, b.load_button, b.clear_button]),
        b.table,
    ])
