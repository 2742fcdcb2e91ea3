"""A part of the plan panel whose work takes a while: a start button, Stop, a progress bar with a status line,
a message, a summary and a plot (plan_local.py: the check on this machine; plan_published.py: the planner
against published runs).

The thread, Stop, `busy` and `wait` are task_thread.TaskThread's, as in the lab bench (bench_runs.py); a
failure is shown in the panel's message, never raised into a thread nobody watches.
"""
from __future__ import annotations

import traceback
from typing import Any, Sequence

from kit.widgets.table import esc
from kit.widgets.task_thread import TaskThread

__all__ = ["PanelTask"]


class PanelTask(TaskThread):
    """Subclasses call `_build` in their constructor and implement `_run(args)`, which reports through
    `_progress`, honours `self._stop`, and returns (summary HTML, Figure, message) or None when stopped
    before anything could be shown."""

    already_running_text = ("Already running (your first press started it): wait for it to finish, "
                            "or press Stop to end it and start again.")
    button_text = "Start"
    what = "the work"    # in messages: "The check on this machine failed: ..."

    def _build(self, w: Any, tooltip: str, intro: str, extra: Sequence[Any] = (), width_px: int = 700) -> Any:
        self._init_thread()
        self.start_button = w.Button(description=self.button_text, button_style="primary", icon="play",
                                     layout=w.Layout(width=f"{max(160, 9 * len(self.button_text) + 40)}px"),
                                     tooltip=tooltip)
        self.stop_button = w.Button(description="Stop", button_style="danger", icon="stop", disabled=True,
                                    tooltip="stop after the current piece")
        self.progress = w.IntProgress(value=0, min=0, max=1, description="idle", layout=w.Layout(width="300px"),
                                      style={"description_width": "50px"})
        self.status = w.Label(value="")
        self.message = w.HTML(value="")
        self.summary = w.HTML(value="")
        # Hidden until the first plot: an empty Image shows as a broken-image icon.
        self.image = w.Image(format="png", layout=w.Layout(max_width=f"{width_px}px", display="none"))
        self.start_button.on_click(lambda _b: self.start())
        self.stop_button.on_click(lambda _b: self.stop())
        return w.VBox([w.HTML(intro), w.HBox([self.start_button, *extra, self.stop_button]),
                       w.HBox([self.progress, self.status]), self.message, self.summary, self.image])

    def _args(self) -> tuple[Any, ...]:
        """What `_run` gets, read from the controls when the button is pressed (not from the thread)."""
        return ()

    def _run(self, *args: Any) -> tuple[str, Any, str] | None:
        raise NotImplementedError

    def _start_buttons(self) -> Sequence[Any]:
        return (self.start_button,)

    def _say(self, text: str, error: bool = False) -> None:
        self.message.value = f"<span style='color:#D55E00'>{text}</span>" if error else text

    def start(self) -> bool:
        """Start the work on a thread; False (and a message) if it is already running."""
        return self._launch(self._work, self._args(), f"kit-{type(self).__name__}")

    def _progress(self, done: int, total: int, what: str) -> None:
        self.progress.max = max(1, total)
        self.progress.value = min(done, self.progress.max)
        self.progress.description = f"{done}/{total}"
        self.status.value = what if what != "done" else ""

    def _work(self, *args: Any) -> None:
        from kit.widgets.render import render_png

        try:
            shown = self._run(*args)
            if shown is None:
                self.message.value = (f"Stopped by you before anything could be compared. Press "
                                      f"<b>{esc(self.button_text)}</b> to start again.")
                return
            summary, fig, message = shown
            self.summary.value = summary
            self.image.value = render_png(fig)
            self.image.layout.display = None
            self.message.value = ("Stopped by you: " if self._stop.is_set() else "Finished: ") + message
        except Exception as exc:  # shown in the panel; the kernel must not see it
            tb = "".join(traceback.format_exception(type(exc), exc, exc.__traceback__))
            self.message.value = (
                f"<span style='color:#D55E00'>{esc(self.what[0].upper() + self.what[1:])} failed: "
                f"{esc(type(exc).__name__)}: {esc(str(exc))}</span><br>{self._after_failure()}"
                f"<details><summary>details</summary><pre style='font-size:11px'>{esc(tb)}</pre></details>")
        finally:
            self._show_busy(False)

    def _after_failure(self) -> str:
        return f"Press <b>{esc(self.button_text)}</b> to try again."
