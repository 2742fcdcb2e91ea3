"""Work that a panel runs on a thread: the thread, the stop Event, `busy`, `wait`, `stop`, and how the
buttons and the progress bar look while it runs. The lab bench (bench_runs.py: Run and Sweep) and the
plan panel's parts (plan_task.py: Check on this machine, Compare with published runs) both build on it.

Why a thread: the kernel stays free for the Stop click. The thread touches widgets only by setting traits
(`value`, `disabled`, `layout.display`), which renders from a thread in ipywidgets 7.7 and 8 alike
(`with out:` from a thread renders nothing).
"""
from __future__ import annotations

import threading
from typing import Any, Callable, Sequence

__all__ = ["TaskThread"]


class TaskThread:
    """Subclasses own the widgets named below (`progress`, `status`, `stop_button`, the buttons that
    start work) and `_say`, call `_init_thread()` in their constructor and start work with `_launch`;
    the work honours `self._stop` and ends with `_show_busy(False)`."""

    stopping_text = "stopping after the current piece..."
    already_running_text = "Already running: press Stop first."
    wait_default_s = 600.0

    _stop: threading.Event
    _thread: threading.Thread | None
    progress: Any
    status: Any
    stop_button: Any

    def _init_thread(self) -> None:
        self._stop = threading.Event()
        self._thread = None

    def _start_buttons(self) -> Sequence[Any]:
        """The buttons that start work: disabled while it runs."""
        raise NotImplementedError

    def _say(self, text: str, error: bool = False) -> None:
        """Show `text` (HTML) in the panel's message; `error` colours it."""
        raise NotImplementedError

    @property
    def busy(self) -> bool:
        """True while the work runs."""
        return self._thread is not None and self._thread.is_alive()

    def stop(self) -> None:
        """Ask the work to end after the current piece."""
        self._stop.set()
        self.status.value = self.stopping_text

    def wait(self, timeout_s: float | None = None) -> bool:
        """Block until the work ends (for scripts and tests; default `wait_default_s`); True if it ended."""
        t = self._thread
        if t is not None:
            t.join(self.wait_default_s if timeout_s is None else timeout_s)
        return t is None or not t.is_alive()

    def _launch(self, work: Callable[..., None], args: tuple[Any, ...], name: str) -> bool:
        """Run `work(*args)` on a thread; False (and the already-running message) if work is running."""
        if self.busy:
            self._say(self.already_running_text, error=True)
            return False
        self._stop.clear()
        self._say("")
        self._show_busy(True)
        self._thread = threading.Thread(target=work, args=args, daemon=True, name=name)
        self._thread.start()
        return True

    def _show_busy(self, busy: bool) -> None:
        for button in self._start_buttons():
            button.disabled = busy
        self.stop_button.disabled = not busy
        self.progress.bar_style = "info" if busy else ""
        if not busy:
            self.progress.description = "done"
            self.status.value = ""
