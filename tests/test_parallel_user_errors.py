"""What a new user meets with the parallelism features: plot calls with the wrong shape of input
and refusals whose suggested fix is one clear value (found driving a notebook as a learner)."""
from __future__ import annotations

import matplotlib
import pytest

matplotlib.use("Agg")

from kit.experiments.config import ExperimentConfig, ExperimentConfigError  # noqa: E402


def test_interleaved_micro_batch_fix_is_not_repeated() -> None:
    with pytest.raises(ExperimentConfigError) as e:
        ExperimentConfig(strategy="pipeline", schedule="interleaved_1f1b", virtual_stages=2, micro_batches=1,
                         workload="gpt", model_size="tiny", batch_size=8)
    assert "try micro_batches=2" in str(e.value) and "2 or 2" not in str(e.value)


def _timeline_record() -> dict:
    ev = [{"rank": r, "step": 0, "kind": k, "name": n, "start_ms": s, "end_ms": s + 1.0}
          for r in (0, 1) for k, n, s in (("compute", "forward", 0.0), ("comm", "send to 1", 1.0))]
    return {"label": "pipeline x2", "config": {"strategy": "pipeline"}, "timeline": ev}


def test_step_timeline_takes_a_list_like_the_other_plots() -> None:
    from kit.plots import step_timeline

    older = {**_timeline_record(), "label": "older run"}
    fig = step_timeline([older, _timeline_record()])  # draws the last, as the lab bench does
    assert "pipeline x2" in fig._suptitle.get_text()
    with pytest.raises(TypeError, match="one run record"):
        step_timeline([])


@pytest.mark.parametrize("bad", [None, "ep", 3])
def test_load_plots_name_what_they_take(bad: object) -> None:
    from kit.plots import expert_load, ring_balance

    for fn in (expert_load, ring_balance):
        with pytest.raises(TypeError, match="list of run records"):
            fn(bad)
