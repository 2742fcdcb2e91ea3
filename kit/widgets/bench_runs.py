"""The lab bench's work: Run and Sweep launch configurations on a thread, Stop asks them to end
(the thread, Stop, `busy` and `wait`: task_thread.TaskThread, shared with the plan panel's parts).
"""
from __future__ import annotations

from typing import Any, Callable, Mapping, Sequence

from kit.widgets.knobs import parse_values
from kit.widgets.table import esc, failure_html
from kit.widgets.task_thread import TaskThread

__all__ = ["BenchRuns", "Runner"]

Runner = Callable[..., Mapping[str, Any]]


class BenchRuns(TaskThread):
    """Run/Sweep/Stop for `LabBench` (which owns the widgets, the records and the configuration); the
    thread, `stop`, `busy` and `wait` are TaskThread's."""

    stopping_text = "stopping after the current step..."
    wait_default_s = 300.0

    _runner: Runner
    _last_sweep_knob: str | None
    records: list[dict[str, Any]]
    cluster: Any
    results_path: str | None
    knobs: Sequence[Any]
    run_button: Any
    sweep_button: Any
    sweep_knob: Any
    sweep_values: Any
    make_config: Callable[..., Any]
    _refresh: Callable[[], None]

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
            vals = list(values) if values is not None else parse_values(spec, self.sweep_values.value)
            configs = [self.make_config(**{knob: v}) for v in vals]
        except ValueError as exc:
            return self._invalid(exc)
        self._last_sweep_knob = knob
        return self._start(configs)

    def _start(self, configs: list[Any]) -> bool:
        return self._launch(self._work, (configs,), "kit-lab-bench")

    def _work(self, configs: list[Any]) -> None:
        n, done = len(configs), 0
        try:
            for i, cfg in enumerate(configs, 1):
                if self._stop.is_set():
                    break
                self.progress.description = f"run {i}/{n}"
                try:
                    rec = self._run_one(cfg)
                except Exception as exc:  # shown in the panel; the kernel must not see it
                    if self._stop.is_set():
                        break
                    self._say(failure_html(cfg.label(), exc), error=True)
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
            self._show_busy(False)

    def _run_one(self, cfg: Any) -> Mapping[str, Any]:
        """One configuration through the runner, its progress shown as "label: step k/n"."""
        label = cfg.label()
        self.status.value = f"{label}: starting ranks..."

        def progress(step: int, total: int) -> None:
            self.progress.max = max(1, int(total))
            self.progress.value = min(int(step), self.progress.max)
            # Measured steps only (run() reports 0 through warm-up); a runner that
            # reports only start (0/1) and end (1/1) has no step count.
            where = (f"step {step}/{total}" if step else "warming up...") if total > 1 \
                else ("running on the ranks..." if step < total else "done")
            self.status.value = f"{label}: {where}"

        return self._runner(cfg, cluster=self.cluster, results_path=self.results_path, progress=progress,
                            stop=self._stop)

    def _invalid(self, exc: BaseException) -> bool:
        self.progress.value, self.progress.description = 0, "not run"  # not the last run's "done"
        self._say(f"Invalid configuration: {esc(str(exc))}", error=True)
        return False

    def _start_buttons(self) -> Sequence[Any]:
        return (self.run_button, self.sweep_button)
