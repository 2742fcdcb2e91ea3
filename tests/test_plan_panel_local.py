"""The plan panel's "On this machine" part, without a frontend: click Check, wait for the work thread.

As tests/test_widgets.py does for the lab bench: ipywidgets builds widgets headless, so these tests drive
the objects a learner clicks. One test runs the real check (2 gloo ranks, the real time model); the others
pass a small check so failures and Stop are checked in well under a second each.
"""
from __future__ import annotations

import threading
from typing import Any

import matplotlib
import pytest

matplotlib.use("Agg")
pytest.importorskip("ipywidgets")

from kit.widgets import PlanPanel  # noqa: E402

# How long the check may take before a test calls it stuck: a bound on liveness, not a timing claim (one
# real repeat took 15 s at load 4 on the 2-core machine; minutes under heavy load).
WORK_S = 400.0


def _thread_errors(monkeypatch: Any) -> list[Any]:
    """Exceptions that escaped a thread (into the void, as a learner would see nothing)."""
    seen: list[Any] = []
    monkeypatch.setattr(threading, "excepthook", seen.append)
    return seen


def test_real_check_draws_measured_beside_predicted_and_stops_between_repeats(monkeypatch: Any) -> None:
    """The real check_local on 2 ranks: the status names each piece as it starts, Stop during the second
    repeat keeps the first (every strategy measured once), and the summary and plot label each number."""
    from kit.experiments import shutdown
    escaped = _thread_errors(monkeypatch)
    panel = PlanPanel(model="gpt2", nodes=1)
    local = panel.local
    local.repeats.value = 2
    seen: list[str] = []

    def on_status(ch: Any) -> None:
        seen.append(ch["new"])
        if ch["new"].startswith("repeat 2/2"):
            local.stop()   # from the worker thread, before the second repeat measures anything

    local.status.observe(on_status, names="value")
    try:
        local.check_button.click()
        assert local.check_button.disabled and not local.stop_button.disabled
        assert local.wait(WORK_S), "the check did not end"
    finally:
        shutdown()
    assert not escaped and "failed" not in local.message.value, local.message.value
    assert "repeat 1/2: measuring this machine" in seen
    assert {"repeat 1/2: running ddp on 2 ranks", "repeat 1/2: running tp on 2 ranks"} <= set(seen)
    assert "Stopped by you: 1 repeat(s)" in local.message.value
    assert [r["strategy"] for r in local.rows] == ["ddp", "tp"] and all(r["repeats"] == 1 for r in local.rows)
    for s in ("ddp", "tp"):
        line = next(x for x in local.summary.value.split("<br>") if f"<b>{s}</b>" in x)
        assert "measured" in line and "predicted" in line, line
    assert "inputs, measured" in local.summary.value
    assert bytes(local.image.value).startswith(b"\x89PNG") and local.image.layout.display is None
    assert not local.check_button.disabled and local.stop_button.disabled   # ready for another check


def test_a_failing_check_is_shown_in_the_panel_and_the_button_comes_back(monkeypatch: Any) -> None:
    escaped = _thread_errors(monkeypatch)

    def broken(*_a: Any, **_kw: Any) -> Any:
        raise RuntimeError("rank 1 died: injected failure")

    panel = PlanPanel(model="gpt2", nodes=1, check=broken)
    panel.local.check_button.click()
    assert panel.local.wait(60)
    msg = panel.local.message.value
    assert "The check on this machine failed: RuntimeError: rank 1 died: injected failure" in msg
    assert "try again" in msg and not escaped
    assert not panel.local.check_button.disabled and panel.local.image.layout.display == "none"


def test_stop_before_a_whole_repeat_says_nothing_was_compared() -> None:
    started = threading.Event()

    def slow(cluster: Any, strategies: Any, repeats: int, steps: int, world_size: int, progress: Any,
             stop: threading.Event) -> Any:
        progress(0, 3 * repeats, "repeat 1/3: measuring this machine")
        started.set()
        assert stop.wait(60), "Stop never reached the check"
        return []

    panel = PlanPanel(model="gpt2", nodes=1, check=slow)
    local = panel.local
    local.start()
    assert started.wait(60)
    assert local.status.value == "repeat 1/3: measuring this machine" and local.progress.max == 9
    assert local.start() is False and "Already running" in local.message.value   # one check at a time
    local.stop_button.click()
    assert local.wait(60)
    assert "Stopped by you before anything could be compared" in local.message.value and not local.rows


def test_published_runs_part_plans_each_run_and_labels_predicted_against_published(monkeypatch: Any) -> None:
    """The "Published runs" part on four real runs (SC21 Table 2's smallest, planned for real): the status
    names each run as it is planned, the summary and the plot say predicted and published."""
    from kit.experiments import published_runs
    from kit.widgets.plan_published import PublishedCheck
    escaped = _thread_errors(monkeypatch)
    runs = [r for r in published_runs() if r.id.startswith("sc21-t2")][:4]
    part = PublishedCheck(runs=runs)
    seen: list[str] = []
    part.status.observe(lambda ch: seen.append(ch["new"]), names="value")
    part.start_button.click()
    assert part.wait(WORK_S), "the comparison did not end"
    assert not escaped and "failed" not in part.message.value, part.message.value
    assert [f"planning {r.id}" for r in runs] == [s for s in seen if s.startswith("planning")]
    assert "Finished: 4 of 4 runs planned" in part.message.value and len(part.rows) == 4
    assert "<i>predicted</i> within 15% of <i>published</i>" in part.summary.value
    assert bytes(part.image.value).startswith(b"\x89PNG") and part.image.layout.display is None


def test_published_runs_part_shows_a_failure_in_the_panel(monkeypatch: Any) -> None:
    escaped = _thread_errors(monkeypatch)

    def broken(run: Any) -> Any:
        raise ValueError(f"{run.id}: injected failure")

    panel = PlanPanel(model="gpt2", nodes=1, compare=broken)
    panel.published.start_button.click()
    assert panel.published.wait(60)
    msg = panel.published.message.value
    assert "The comparison with published runs failed: ValueError:" in msg and "injected failure" in msg
    assert "try again" in msg and not escaped and not panel.published.start_button.disabled
