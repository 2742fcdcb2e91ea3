"""A small panel: pick a measured run, a link and a strategy, and watch the predicted curve move.

    from kit.widgets import prediction_panel
    panel = prediction_panel(records)   # records kit.experiments.run returned: lab_bench().records, load_jsonl(...)

Why no run button: predicting is arithmetic on a record (kit.experiments.theory.prediction), so every
change redraws at once; the measured points are the records themselves, drawn where their
world size and link match the chosen ones. Built like the lab bench (Figure -> PNG -> Image;
no pyplot, no ipympl), so it works in Lab, Notebook 7, VS Code and Colab.
"""
from __future__ import annotations

from typing import Any, Iterable, Mapping, Sequence

__all__ = ["PredictionPanel", "prediction_panel"]

_NO_ACC = "none (measured compute)"


class PredictionPanel:
    """Dropdowns for the run, link, strategy and accelerator; a slider for the largest rank count."""

    def __init__(self, records: Sequence[Mapping[str, Any]] | Mapping[str, Any]) -> None:
        import ipywidgets as w

        from kit.experiments.theory.accelerators import ACCELERATORS
        from kit.experiments.theory.links import LINKS
        from kit.experiments.theory.prediction import PREDICTABLE

        if isinstance(records, Mapping):  # prediction_panel(rec), one run: before, "'str' object has no attribute 'get'"
            records = [records]
        if isinstance(records, (str, bytes)) or not isinstance(records, Iterable):
            raise TypeError(f"prediction_panel takes the records kit.experiments.run returns (a list, or one "
                            f"record), not {type(records).__name__}: rec = kit.experiments.run(config); prediction_panel([rec])")
        self.records = [r for r in records if isinstance(r, Mapping) and str(r.get("schema", "")).startswith("kit.run")
                        and r.get("steps")]
        if not self.records:
            raise ValueError("prediction_panel needs at least one kit.run record with measured steps "
                             "(run one with kit.experiments.run or the lab bench)")
        self.prediction: dict[str, Any] | None = None
        style = {"description_width": "70px"}
        self.run_choice = w.Dropdown(options=[(f"{i}: {r.get('label')}", i) for i, r in enumerate(self.records)],
                                     value=0, description="measured", style=style, layout=w.Layout(width="420px"))
        self.link = w.Dropdown(options=["loopback"] + list(LINKS), value="infiniband", description="link",
                               style=style)
        self.loopback_gbps = w.FloatText(value=1.0, description="loopback GB/s", style={"description_width": "100px"},
                                         layout=w.Layout(width="200px"),
                                         tooltip="the gloo loopback 'link' (collective benchmark busbw)")
        self.strategy = w.Dropdown(options=list(PREDICTABLE), value="ddp", description="strategy", style=style)
        self.accelerator = w.Dropdown(options=[_NO_ACC] + list(ACCELERATORS), value=_NO_ACC,
                                      description="compute", style=style)
        self.max_log2 = w.IntSlider(value=10, min=1, max=10, description="up to 2^", style=style)
        self.message = w.HTML(value="")
        self.image = w.Image(format="png", layout=w.Layout(max_width="1000px"))
        for c in (self.run_choice, self.link, self.loopback_gbps, self.strategy, self.accelerator, self.max_log2):
            c.observe(lambda _ch: self.redraw(), names="value")
        self.widget = w.VBox([
            w.HTML("<b>Predict at scale</b>: every line is <i>predicted</i> from the chosen measured run; "
                   "big dots are measured runs that match it."),
            w.HBox([self.run_choice, self.strategy]),
            w.HBox([self.link, self.loopback_gbps, self.accelerator]),
            self.max_log2, self.message, self.image])
        self.redraw()

    def redraw(self) -> None:
        """Predict with the current choices and draw; a bad choice shows its message instead."""
        from kit.experiments.theory.prediction import predict
        from kit.plots.memory import mib_text
        from kit.plots.predicted import matching_measured, scaling_prediction
        from kit.widgets.render import render_png

        base = self.records[self.run_choice.value]
        link: Any = (0.0, float(self.loopback_gbps.value)) if self.link.value == "loopback" else self.link.value
        acc = None if self.accelerator.value == _NO_ACC else self.accelerator.value
        mesh = bool((base.get("config") or {}).get("mesh"))
        self.strategy.disabled = mesh  # a mesh run is predicted on its own mesh
        try:
            self.prediction = predict(base, ranks=[2**k for k in range(self.max_log2.value + 1)], link=link,
                                      strategy=None if mesh else self.strategy.value, accelerator=acc)
        except ValueError as e:
            self.message.value = f"<span style='color:#D55E00'>{e}</span>"
            return
        measured = [] if acc else matching_measured(self.records, base, self.link.value)
        stop = self.prediction["comm_stops_hiding_at"]
        last = self.prediction["points"][-1]
        mem_mib = last["memory_mib"]["total_mib"]  # a tiny model's 0.39 MiB once read "memory 0 MiB per rank"
        mem = mib_text(mem_mib)  # "<0.01" and "12,346", never "1.2e-05"
        self.message.value = (f"predicted at {last['ranks']} ranks: step {last['step_ms']:.1f} ms, exposed comm "
                              f"{last['comm_exposed_ms']:.1f} ms, efficiency {100 * last['efficiency']:.0f}%, "
                              f"memory {mem} MiB per rank; "
                              "communication "
                              + (f"stops hiding at {stop} ranks" if stop else "stays hidden")
                              + f". Weakest: {self.prediction['weakest'][0]}")
        self.image.value = render_png(scaling_prediction(self.prediction, measured=measured))


def prediction_panel(records: Sequence[Mapping[str, Any]] | Mapping[str, Any]) -> Any:
    """Build the panel and return its widget (the last expression of a cell shows it)."""
    return PredictionPanel(records).widget

