"""The plan panel's "On this machine" part: the planner's time model against runs on the learner's own ranks.

The same check lesson 13 runs (kit.experiments.check_local): measure this machine on 2 CPU ranks, predict
the kit's ddp and tp steps with the planner's `step_time` fed those numbers, run them, interleaved repeats;
then `kit.plots.local_prediction` draws measured beside predicted.

Why a button and a thread, when the planner above re-plans on every change: this part runs real ranks for
a minute or more. As in the lab bench (bench_runs.py), the work runs on a thread so the kernel stays free
for the Stop click, and the thread touches widgets only by setting traits (ipywidgets 7.7 and 8).
"""
from __future__ import annotations

import threading
import traceback
from typing import Any, Callable, Sequence

from kit.widgets.table import esc

__all__ = ["LocalCheck", "rows_html"]

STRATEGIES = ("ddp", "tp")
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
                 f"{m.op_us:.0f} us, gloo {m.alpha_us:.0f} us per ring step and {m.gbps:.2f} GB/s, copy "
                 f"{m.mem_gbps:.1f} GB/s")
    return "<br>".join(lines)


class LocalCheck:
    """Check / Stop buttons, a progress bar with a status line, a message, the summary and the plot.

    Args:
        cluster: ranks to run on (2 of them); None takes them as `kit.experiments.run` does (the ranks
            `%%distributed` started when there are 2, else 2 started once and kept).
        check: `check_local(cluster, strategies, repeats=, steps=, progress=, stop=) -> rows`; default
            kit.experiments.check_local.
    """

    def __init__(self, cluster: Any = None, check: Callable[..., list[dict[str, Any]]] | None = None,
                 repeats: int = 3, steps: int = 3) -> None:
        import ipywidgets as w

        self.cluster, self._check = cluster, check
        self.rows: list[dict[str, Any]] = []
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.repeats = w.BoundedIntText(value=repeats, min=1, max=9, description="repeats",
                                        layout=w.Layout(width="150px"), style={"description_width": "60px"})
        self.check_button = w.Button(description="Check on this machine", button_style="primary", icon="play",
                                     layout=w.Layout(width="200px"),
                                     tooltip=f"measure this machine, predict and run ddp and tp on {RANKS} ranks")
        self.stop_button = w.Button(description="Stop", button_style="danger", icon="stop", disabled=True,
                                    tooltip="stop after the current piece")
        self.progress = w.IntProgress(value=0, min=0, max=1, description="idle", layout=w.Layout(width="300px"),
                                      style={"description_width": "50px"})
        self.status = w.Label(value="")
        self.message = w.HTML(value="")
        self.summary = w.HTML(value="")
        # Hidden until the first plot: an empty Image shows as a broken-image icon.
        self.image = w.Image(format="png", layout=w.Layout(max_width="700px", display="none"))
        self.steps = steps
        self.check_button.on_click(lambda _b: self.start())
        self.stop_button.on_click(lambda _b: self.stop())
        self.widget = w.VBox([
            w.HTML("<b>On this machine</b>: the same time model, fed numbers measured here (a matmul rate, one "
                   "op's cost, gloo's latency and bandwidth), <i>predicts</i> the kit's ddp and tp steps on "
                   f"{RANKS} CPU ranks; the check then runs them and draws the <i>measured</i> step beside it "
                   "(interleaved repeats; one took 15 s to a minute on the busy 2-core machine the kit is tested on). "
                   "docs/predicting.md, \"The same model on this machine\", says what the model leaves out."),
            w.HBox([self.check_button, self.repeats, self.stop_button]),
            w.HBox([self.progress, self.status]),
            self.message, self.summary, self.image])

    @property
    def busy(self) -> bool:
        """True while a check is running."""
        return self._thread is not None and self._thread.is_alive()

    def start(self) -> bool:
        """Start the check on a thread; False (and a message) if one is already running."""
        if self.busy:
            self.message.value = "<span style='color:#D55E00'>Already checking: press Stop first.</span>"
            return False
        self._stop.clear()
        self.message.value = ""
        self.check_button.disabled, self.stop_button.disabled = True, False
        self.progress.bar_style = "info"
        self._thread = threading.Thread(target=self._work, args=(int(self.repeats.value),), daemon=True,
                                        name="kit-plan-local-check")
        self._thread.start()
        return True

    def stop(self) -> None:
        """Ask the check to end after the current piece (a measurement or one run)."""
        self._stop.set()
        self.status.value = "stopping after the current piece..."

    def wait(self, timeout_s: float = 600.0) -> bool:
        """Block until the check ends (for scripts and tests); True if it ended."""
        t = self._thread
        if t is not None:
            t.join(timeout_s)
        return t is None or not t.is_alive()

    def _progress(self, done: int, total: int, what: str) -> None:
        self.progress.max = max(1, total)
        self.progress.value = min(done, self.progress.max)
        self.progress.description = f"{done}/{total}"
        self.status.value = what if what != "done" else ""

    def _work(self, repeats: int) -> None:
        from kit.plots.predicted import local_prediction
        from kit.widgets.render import render_png

        self.status.value = f"starting {RANKS} ranks..."
        try:
            check = self._check
            if check is None:
                from kit.experiments import check_local as check
            rows = check(self.cluster, STRATEGIES, repeats=repeats, steps=self.steps, world_size=RANKS,
                         progress=self._progress, stop=self._stop)
            if not rows:
                self.message.value = ("Stopped by you before a whole repeat finished: nothing to compare. "
                                      "Press <b>Check on this machine</b> to start again.")
                return
            self.rows = rows
            self.summary.value = rows_html(rows)
            self.image.value = render_png(local_prediction(rows))
            self.image.layout.display = None
            self.message.value = ("Stopped by you: " if self._stop.is_set() else "Finished: ") + (
                f"{rows[0]['repeats']} repeat(s). Where the hatched bar (predicted) reaches into the measured "
                "bar's range, the model prices your run within this machine's noise.")
        except Exception as exc:  # shown in the panel; the kernel must not see it
            tb = "".join(traceback.format_exception(type(exc), exc, exc.__traceback__))
            self.message.value = (
                f"<span style='color:#D55E00'>The check on this machine failed: {esc(type(exc).__name__)}: "
                f"{esc(str(exc))}</span><br>Press <b>Check on this machine</b> to try again; if the ranks "
                "died, <code>kit.experiments.shutdown()</code> stops them and the next check starts fresh ones."
                f"<details><summary>details</summary><pre style='font-size:11px'>{esc(tb)}</pre></details>")
        finally:
            self.check_button.disabled, self.stop_button.disabled = False, True
            self.progress.bar_style = ""
            self.progress.description = "done"
            self.status.value = ""
