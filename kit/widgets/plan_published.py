"""The plan panel's "Published runs" part: the planner against the runs published papers measured.

The same comparison lesson 13 draws and bench/bench_plan_published.py prints (kit.experiments
compare_published over published_runs): each run's layout, model, cluster and batch planned, its predicted
throughput over the published one, each in its source's convention, with the +-15% band. Why a button: it
plans every run up to three times (its layout, the space its software allowed, every layout), which takes a
minute on a busy 2-core machine; plan_task.PanelTask runs it on a thread with Stop and errors in the panel.
"""
from __future__ import annotations

from typing import Any, Callable, Sequence

from kit.widgets.plan_task import PanelTask

__all__ = ["PublishedCheck", "summary_html"]


def summary_html(rows: Sequence[Any], summary: dict[str, Any]) -> str:
    """The comparison in words: each figure labelled predicted or published."""
    within, n, _ = summary["throughput_within_15pct"]
    first, ranked = summary["first_choice"]
    near, _, _ = summary["within_10pct_of_best"]
    return (f"{len(rows)} published runs planned. Throughput: <i>predicted</i> within 15% of <i>published</i> for "
            f"{within} of {n} comparable runs; median predicted / published "
            f"{summary['median_predicted_over_published']:.2f}. The published layout is the planner's first "
            f"choice in {first} of {ranked} runs and predicted within 10% of its best in {near}. "
            "Sources and conventions: docs/published-runs.md.")


class PublishedCheck(PanelTask):
    """A button that plans every published run, then the ratio plot (kit.plots.plan_vs_published).

    Args:
        runs: the runs to compare (default kit.experiments.published_runs()).
        compare: `compare(run) -> Comparison`; default kit.experiments.compare_published.
    """

    button_text = "Compare with published runs"
    what = "the comparison with published runs"

    def __init__(self, runs: Sequence[Any] | None = None, compare: Callable[[Any], Any] | None = None) -> None:
        import ipywidgets as w

        self._runs, self._compare = runs, compare
        self.rows: list[Any] = []
        self.widget = self._build(
            w, "plan each published run's layout and set the prediction against what its paper measured",
            "<b>Published runs</b>: the planner's <i>predicted</i> throughput for runs published papers "
            "<i>measured</i> (Megatron SC21, Korthikanti et al. 2022, torchtitan, MT-NLG and others), each in "
            "its source's convention, one bar per run with the +-15% band.")

    def _run(self) -> tuple[str, Any, str] | None:
        from kit.experiments.theory.published import published_runs
        from kit.experiments.theory.published_check import compare_published, summarise
        from kit.plots.plan import plan_vs_published

        runs = list(self._runs if self._runs is not None else published_runs())
        one = self._compare or compare_published
        rows = []
        for i, run in enumerate(runs):
            self._progress(i, len(runs), f"planning {run.id}")
            if self._stop.is_set():
                break
            rows.append(one(run))
        self._progress(len(rows), len(runs), "done")
        if self._stop.is_set() and not any(r.ratio is not None for r in rows):
            return None
        self.rows = rows
        return (summary_html(rows, summarise(rows)), plan_vs_published(rows),
                f"{len(rows)} of {len(runs)} runs planned.")
