"""The plan panel's "On this machine" part: the planner's time model against runs on the learner's own ranks.

The same check lesson 13 runs (kit.experiments.check_local): measure this machine on 2 CPU ranks, predict
the kit's ddp and tp steps with the planner's `step_time` fed those numbers, run them, interleaved repeats;
then `kit.plots.local_prediction` draws measured beside predicted.

Why a button and a thread, when the planner above re-plans on every change: this part runs real ranks for
a minute or more (plan_task.PanelTask: a thread, Stop, progress, errors in the panel).
"""
from __future__ import annotations

from typing import Any, Callable, Sequence

from kit.widgets.plan_task import PanelTask
from kit.widgets.table import esc

__all__ = ["LocalCheck", "rows_html"]

CHECKED = ("ddp", "tp")  # the strategies this panel predicts and runs (choices.STRATEGIES names them all)
RANKS = 2   # one per core of a 2-core Binder machine; more would share cores, the hardest case for any model


def rows_html(rows: Sequence[dict[str, Any]]) -> str:
    """One line per strategy, each number labelled measured or predicted, and the inputs measured."""
    lines = []
    for r in rows:
        lo, hi = r["measured_spread_ms"]
        err = 100 * (r["predicted_step_ms"] / r["measured_step_ms"] - 1)
        inside = "inside" if lo <= r["predicted_step_ms"] <= hi else "outside"
        reps = f"{r['repeats']} repeat" + ("s" if r["repeats"] > 1 else "")
        lines.append(f"<b>{esc(r['strategy'])}</b>, {r['ranks']} ranks: measured {r['measured_step_ms']:.0f} ms "
                     f"[{lo:.0f}-{hi:.0f} over {reps}], predicted {r['predicted_step_ms']:.0f} ms "
                     f"({err:+.0f}%, {inside} the measured range)")
    m = rows[0]["machines"][-1]
    lines.append(f"inputs, measured on the ranks (last repeat): {m.matmul_gflops:.1f} GFLOP/s per rank, one op "
                 f"{m.op_us:.0f} us, gloo {m.alpha_us:.0f} us per ring step and {m.gbps:.2f} GB/s, one blocking "
                 f"all-reduce after compute {m.call_us / 1e3:.1f} ms, copy {m.mem_gbps:.1f} GB/s")
    return "<br>".join(lines)


class LocalCheck(PanelTask):
    """Check / Stop buttons and a repeats box, a progress bar with a status line, a message, the summary and
    the plot (plan_task.PanelTask).

    Args:
        cluster: ranks to run on (2 of them); None takes them as `kit.experiments.run` does (the ranks
            `%%distributed` started when there are 2, else 2 started once and kept).
        check: `check_local(cluster, strategies, repeats=, steps=, progress=, stop=) -> rows`; default
            kit.experiments.check_local.
    """

    button_text = "Check on this machine"
    what = "the check on this machine"

    def __init__(self, cluster: Any = None, check: Callable[..., list[dict[str, Any]]] | None = None,
                 repeats: int = 3, steps: int = 3) -> None:
        import ipywidgets as w

        self.cluster, self._check, self.steps = cluster, check, steps
        self.rows: list[dict[str, Any]] = []
        self.repeats = w.BoundedIntText(value=repeats, min=1, max=9, description="repeats",
                                        layout=w.Layout(width="150px"), style={"description_width": "60px"})
        self.widget = self._build(
            w, f"measure this machine, predict and run ddp and tp on {RANKS} ranks",
            "<b>On this machine</b>: the same time model, fed numbers measured here (a matmul rate, one op's "
            "cost, gloo's latency and bandwidth, what one blocking all-reduce costs after compute), "
            f"<i>predicts</i> the kit's ddp and tp steps on {RANKS} CPU ranks; the check then runs them and "
            "draws the <i>measured</i> step beside it (interleaved repeats; one took 15 s to a minute on the "
            "busy 2-core machine the kit is tested on). docs/predicting.md, \"The same model on this machine\", "
            "says what the model leaves out.", extra=[self.repeats])
        self.check_button = self.start_button

    def _args(self) -> tuple[Any, ...]:
        return (int(self.repeats.value),)

    def _run(self, repeats: int) -> tuple[str, Any, str] | None:
        from kit.plots.predicted import local_prediction

        self.status.value = f"starting {RANKS} ranks..."
        check = self._check
        if check is None:
            from kit.experiments import check_local as check
        rows = check(self.cluster, CHECKED, repeats=repeats, steps=self.steps, world_size=RANKS,
                     progress=self._progress, stop=self._stop)
        if not rows:
            return None
        self.rows = rows
        return (rows_html(rows), local_prediction(rows),
                f"{rows[0]['repeats']} repeat(s). Where the hatched bar (predicted) reaches into the measured "
                "bar's range, the model prices your run within this machine's noise.")

    def _after_failure(self) -> str:
        return (f"Press <b>{self.button_text}</b> to try again; if the ranks died, "
                "<code>kit.experiments.shutdown()</code> stops them and the next check starts fresh ones.")
