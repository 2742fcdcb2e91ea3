"""A small lab-bench panel for planning a run: model, cluster, sequence length -> ranked layouts, and how
far to trust it: the planner against published runs and the same time model checked on this machine.

    from kit.widgets import plan_panel
    plan_panel()        # last expression of a cell: the panel shows

Why no run button for the plan: planning is arithmetic (kit.experiments.theory, no torch, well under a
second), so every change re-plans at once. Its "Published runs" part (plan_published.py) plans some fifty
runs and its "On this machine" part (plan_local.py) runs ranks, so each has one. Built like the other
panels (Figure -> PNG -> Image; no pyplot).
"""
from __future__ import annotations

import html
from typing import Any

from kit.experiments.theory.cluster import MAX_GPUS_PER_NODE, MAX_NODES
from kit.keywords import passes_keywords_to

__all__ = ["PlanPanel", "plan_panel"]


class PlanPanel:
    """Dropdowns for model and accelerator, number boxes for nodes, GPUs per node and sequence length (None: the
    model's own, as `plan()` takes it, following the model menu until a length is typed); below,
    how far to trust it: the "Published runs" comparison (`compare`: plan_published.PublishedCheck's) and the
    "On this machine" check (`cluster`, `check`: plan_local.LocalCheck's)."""

    def __init__(self, model: str = "llama3-8b", nodes: int = 1, gpus_per_node: int = 8, accelerator: str = "h100",
                 seq_len: int | None = None, cluster: Any = None, check: Any = None, compare: Any = None) -> None:
        import ipywidgets as w

        from kit.experiments.theory.cluster import NODE_PRESETS
        from kit.experiments.theory.models import MODELS, get_model
        from kit.widgets.plan_local import LocalCheck
        from kit.widgets.plan_published import PublishedCheck

        model, accelerator = _checked(model, nodes, gpus_per_node, accelerator, seq_len)
        self.plan: Any = None
        # seq_len=None: the model's own training length, as plan() takes it; the box follows the model menu
        # until the learner types a length (the panel said 4096 where plan("llama3-8b") plans 8192)
        self.seq_follows_model = seq_len is None
        seq_len = get_model(model).seq_len if seq_len is None else seq_len
        style = {"description_width": "90px"}
        self.model = w.Dropdown(options=list(MODELS), value=model, description="model", style=style)
        self.accelerator = w.Dropdown(options=list(NODE_PRESETS), value=accelerator, description="GPU", style=style)
        self.nodes = w.BoundedIntText(value=nodes, min=1, max=BOXES["nodes"][1], description="nodes", style=style)
        self.gpus = w.BoundedIntText(value=gpus_per_node, min=1, max=BOXES["gpus_per_node"][1], description="GPUs/node",
                                     style=style)
        self.seq = w.BoundedIntText(value=seq_len, min=BOXES["seq_len"][0], max=BOXES["seq_len"][1], step=1024,
                                    description="seq len", style=style)
        self.text = w.HTML(value="")
        self.image = w.Image(format="png", layout=w.Layout(max_width="1100px"))
        self.published = PublishedCheck(compare=compare)
        self.local = LocalCheck(cluster=cluster, check=check)
        self.model.observe(self._model_chosen, names="value")
        self.seq.observe(self._seq_typed, names="value")
        for c in (self.accelerator, self.nodes, self.gpus):
            c.observe(lambda _ch: self.redraw(), names="value")
        self.widget = w.VBox([
            w.HTML("<b>Plan a run</b>: every layout of the model on the cluster, <i>predicted</i> memory and step "
                   "time, best first (docs/predicting.md, \"Planning a run\")."),
            w.HBox([self.model, self.accelerator, self.seq]), w.HBox([self.nodes, self.gpus]),
            self.text, self.image, self.published.widget, self.local.widget])
        self.redraw()

    def _model_chosen(self, _change: Any) -> None:
        from kit.experiments.theory.models import get_model

        own = get_model(self.model.value).seq_len
        if self.seq_follows_model and self.seq.value != own:
            self.seq.value = own  # its observer re-plans
            self.seq_follows_model = True  # set by the panel, not typed
        else:
            self.redraw()

    def _seq_typed(self, _change: Any) -> None:
        self.seq_follows_model = False
        self.redraw()

    def redraw(self) -> None:
        """Plan with the current choices; an impossible one shows its reason instead."""
        from kit.experiments.theory.plan import plan
        from kit.plots.plan import plan_layouts
        from kit.widgets.render import render_png

        try:
            self.plan = plan(self.model.value, nodes=self.nodes.value, gpus_per_node=self.gpus.value,
                             accelerator=self.accelerator.value, seq_len=self.seq.value)
        except ValueError as e:
            self.text.value = f"<span style='color:#D55E00'>{html.escape(str(e))}</span>"
            self.image.layout.display = "none"  # the last plan's plot under this plan's error read as this plan's
            return
        self.text.value = f"<pre style='font-size:11px'>{html.escape(self.plan.describe())}</pre>"
        drawn = bool(self.plan.layouts or self.plan.smallest)
        if drawn:
            self.image.value = render_png(plan_layouts(self.plan, top=8))
        self.image.layout.display = None if drawn else "none"


# what each number box takes; nodes x GPUs per node is the largest cluster plan() and predict() take too (one bound)
BOXES = {"nodes": (1, MAX_NODES), "gpus_per_node": (1, MAX_GPUS_PER_NODE), "seq_len": (128, 1 << 20)}


def _checked(model: Any, nodes: Any, gpus_per_node: Any, accelerator: Any, seq_len: Any) -> tuple[str, str]:
    """The panel's starting choices, refused in words: ipywidgets said only "TraitError: Invalid selection: value
    not found" for a model or GPU its menu lacks, and moved a number outside its box to the nearest end
    unsaid (nodes=100000 planned 4096 nodes)."""
    from kit.experiments.theory.cluster import NODE_PRESETS
    from kit.experiments.theory.models import get_model

    if not isinstance(model, str):
        raise TypeError(f"model={model!r}: the panel's menu takes a preset's name; plan(ModelSpec(...)) plans "
                        "any other model")
    try:
        get_model(model)  # an unknown name: the presets and the nearest one
    except ValueError as e:
        raise ValueError(f"{e}. The panel's menu takes the presets' names") from None
    if not isinstance(accelerator, str) or accelerator.lower() not in NODE_PRESETS:
        raise ValueError(f"accelerator={accelerator!r}: the panel knows {', '.join(NODE_PRESETS)}; another GPU is "
                         "plan(model, cluster=ClusterSpec(...)) with its figures (docs/predicting.md)")
    for name, v in (("nodes", nodes), ("gpus_per_node", gpus_per_node), ("seq_len", seq_len)):
        if name == "seq_len" and v is None:
            continue  # the model's own
        lo, hi = BOXES[name]
        if isinstance(v, bool) or not isinstance(v, int) or not lo <= v <= hi:
            raise ValueError(f"{name}={v!r}: the panel's box takes a whole number from {lo} to {hi:,}; "
                             f"plan(..., {name}=...) takes others")
    return model.lower(), accelerator.lower()


@passes_keywords_to(PlanPanel)  # help(plan_panel) and completion list PlanPanel's keywords, not **kw
def plan_panel(**kw: Any) -> Any:
    """Build the panel and return its widget (the last expression of a cell shows it); the keywords are
    PlanPanel's."""
    return PlanPanel(**kw).widget
