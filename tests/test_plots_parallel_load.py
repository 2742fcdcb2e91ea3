"""kit.plots.expert_load and ring_balance drawn from real 2-rank ep and cp runs (CPU, gloo).

What a learner relies on: the bars are the record's numbers (kept + dropped = routed per expert
and layer; query-key pairs per rank), the capacity line sits where the run's capacity is, each
figure has a title, units, a legend and no overlapping text, and a record without the data
says what to run instead. The lab bench offers these plots only once a run carries the data.
"""
from __future__ import annotations

from typing import Any

import matplotlib
import pytest

matplotlib.use("Agg")

from kit.experiments.config import ExperimentConfig  # noqa: E402
from kit.experiments.records import merge  # noqa: E402
from test_plots import _save, labelling_problems, make_record, text_problems  # noqa: E402

TINY_RUN = dict(workload="gpt", steps=2, warmup_steps=1, batch_size=8)  # zigzag cp and the ep runs are also
# test_parallel_memory's and test_parallel_run_records's: run once per session (conftest's run_once)
RUNS = {
    "contiguous": ExperimentConfig(strategy="cp", zigzag=False, **TINY_RUN),
    "zigzag": ExperimentConfig(strategy="cp", zigzag=True, **TINY_RUN),
    "ep": ExperimentConfig(strategy="ep", **TINY_RUN),
    "ep_drops": ExperimentConfig(strategy="ep", capacity_factor=0.5, top_k=1, **TINY_RUN),
}


@pytest.fixture(scope="module")
def records(run_once) -> dict[str, dict]:
    per = run_once(2, RUNS)
    return {name: merge(per[name], cfg) for name, cfg in RUNS.items()}


def _heights(fig: Any, prefix: str) -> list[list[float]]:
    """Bar heights of every container whose label starts with `prefix`, panel by panel."""
    return [[b.get_height() for b in c] for ax in fig.axes for c in ax.containers if c.get_label().startswith(prefix)]


def _readable(fig: Any, name: str) -> None:
    _save(fig, name)
    assert labelling_problems(fig) == []
    assert text_problems(fig) == []


def test_expert_load_bars_are_the_records_counts(records: dict) -> None:
    from kit.plots import expert_load
    recs = [records["ep"], records["ep_drops"]]
    fig = expert_load(recs)
    _readable(fig, "expert_load")
    layers = [r["comm"]["report"]["expert_load"] for r in recs]
    assert _heights(fig, "kept") == [ly["kept"] for li in range(len(layers[0])) for ly in (layers[0][li], layers[1][li])]
    assert _heights(fig, "dropped") == [ly["dropped"] for li in range(len(layers[0]))
                                        for ly in (layers[0][li], layers[1][li])]
    assert sum(sum(ly["dropped"]) for ly in layers[1]) > 0  # factor 0.5 drops: the hatched bars show it
    assert "tokens" in fig.axes[0].get_ylabel()


def test_expert_load_capacity_line_only_with_a_capacity(records: dict) -> None:
    from kit.plots import expert_load
    ly = records["ep_drops"]["comm"]["report"]["expert_load"][0]
    capped = expert_load(records["ep_drops"])
    lines = [seg for coll in capped.axes[0].collections for seg in coll.get_segments()]
    assert {seg[0][1] for seg in lines} == {ly["capacity_per_rank"] * 2}  # per rank's batch, 2 ranks
    assert max(ly["kept"]) <= ly["capacity_per_rank"] * 2
    free = expert_load(records["ep"])
    assert not [c for ax in free.axes for c in ax.collections]  # no capacity factor: no line


def test_ring_balance_bars_are_the_records_work(records: dict) -> None:
    from kit.plots import ring_balance
    recs = [records["contiguous"], records["zigzag"]]
    fig = ring_balance(recs)
    _readable(fig, "ring_balance")
    work = [r["comm"]["report"]["attention_work"] for r in recs]
    counted = [[p.get_height() for p in c] for c in fig.axes[0].containers]
    assert counted == [w["score_entries_per_rank"] for w in work]
    ms = [p.get_height() for c in fig.axes[1].containers for p in c]
    assert ms == pytest.approx([x for w in work for x in w["compute_ms_per_rank"]])
    assert "(ms)" in fig.axes[1].get_ylabel() and "measured" in fig.axes[1].get_title()


def test_cp_record_counts_causal_work_per_rank(records: dict) -> None:
    """Token i's query meets keys 0..i: a rank holding chunks [s, s+n) computes n*s + n(n+1)/2
    pairs per sequence, head and layer. Zig-zag evens the ranks out; the total is the same."""
    from kit.experiments.parallel.context import chunk_starts
    for name in ("contiguous", "zigzag"):
        w = records[name]["comm"]["report"]["attention_work"]
        seq, t = 32, w["cp"]
        want = [w["layers"] * sum(n * s + n * (n + 1) // 2 for s, n in chunk_starts(seq, r, t, w["zigzag"]))
                for r in range(t)]
        assert w["score_entries_per_rank"] == want, name
        assert all(ms > 0 for ms in w["compute_ms_per_rank"])
    zz = records["zigzag"]["comm"]["report"]["attention_work"]["score_entries_per_rank"]
    assert max(zz) == min(zz)


def test_records_without_the_data_say_what_to_run() -> None:
    from kit.plots import expert_load, ring_balance
    ddp = make_record("ddp mlp bs32")
    with pytest.raises(ValueError, match="strategy='ep'"):
        expert_load([ddp])
    with pytest.raises(ValueError, match="strategy='cp'"):
        ring_balance(ddp)


def test_bench_offers_the_load_plots_only_for_runs_with_the_data(records: dict) -> None:
    from kit.widgets.render import draw_plot, plot_choices
    plain = [fn for _, fn in plot_choices([make_record("ddp mlp bs32")])]
    assert "expert_load" not in plain and "ring_balance" not in plain and "step_breakdown" in plain
    mixed = [make_record("ddp mlp bs32"), records["ep"]]
    offered = [fn for _, fn in plot_choices(mixed)]
    assert "expert_load" in offered and "ring_balance" not in offered
    fig = draw_plot("expert_load", mixed)  # the ddp run is left out, not an error
    assert _heights(fig, "kept")[0] == records["ep"]["comm"]["report"]["expert_load"][0]["kept"]


def test_the_bench_menu_gains_the_plot_when_an_ep_run_lands(records: dict) -> None:
    from kit.widgets import lab_bench
    bench = lab_bench(runner=lambda config, **_kw: dict(records["ep"]))
    assert "expert_load" not in dict(bench.plot_choice.options).values()  # an empty table: not offered
    bench.run()
    assert bench.wait(30)
    assert "expert_load" in dict(bench.plot_choice.options).values()
    assert "ring_balance" not in dict(bench.plot_choice.options).values()
    bench.plot_choice.value = "expert_load"  # draws it
    assert bytes(bench.image.value).startswith(b"\x89PNG") and "Cannot draw" not in bench.message.value
    bench.clear_button.click()
    assert "expert_load" not in dict(bench.plot_choice.options).values()


def test_four_runs_stay_readable_and_more_say_which_are_drawn(records: dict) -> None:
    from kit.plots import expert_load, ring_balance
    eps = [records["ep"], records["ep_drops"]] * 3  # 6 runs: the newest 4 drawn, the title says so
    fig = expert_load(eps, max_runs=4)
    _readable(fig, "expert_load_crowded")
    assert "last 4 of 6 runs" in fig._suptitle.get_text()
    assert len(_heights(fig, "kept")) == 4 * len(records["ep"]["comm"]["report"]["expert_load"])
    cps = [records["contiguous"], records["zigzag"]] * 2
    _readable(ring_balance(cps), "ring_balance_crowded")


def test_counts_get_integer_ticks() -> None:
    """Lesson 12's expert load showed 2.5, 7.5, 12.5 token assignments on its y axis: a count has integer ticks."""
    from kit.plots import expert_load, ring_balance
    load = {"routed": [19, 15, 12, 18], "kept": [16, 11, 10, 16], "dropped": [3, 4, 2, 2]}
    ep = expert_load([{"load": load, "capacity": 8, "ep": 2, "capacity_factor": 1.0},
                      {"load": {**load, "kept": load["routed"], "dropped": [0] * 4}, "capacity": None,
                       "capacity_factor": None}])
    few = {"score_entries_per_rank": [1, 3], "compute_ms_per_rank": [0.55, 0.61], "zigzag": False,
           "compute_ms_of": "median of 5 forwards after an untimed one"}
    cp = ring_balance([few, {**few, "score_entries_per_rank": [2, 2], "zigzag": True}])
    for fig, ax in ((ep, ep.axes[0]), (cp, cp.axes[0])):
        fig.canvas.draw()
        lo, hi = ax.get_ylim()
        ticks = [t for t in ax.get_yticks() if lo <= t <= hi]
        assert len(ticks) >= 3 and all(float(t).is_integer() for t in ticks), ticks
        assert text_problems(fig) == []
    assert cp.axes[1].get_title() == "measured, median of 5 forwards after an untimed one"


def test_ring_balance_key_is_readable_in_the_notebook_column() -> None:
    """The key is where each split's max/min (its imbalance) is written. The 9.6 in figure is shrunk to
    the notebook's column (848 px at 1280 px with the file browser open); its key, drawn x-small (6.9 pt),
    came out 8 px high there. Drawn small (8.3 pt) it reads as the axes' labels do."""
    from kit.plots import ring_balance
    timed = "median of 5 forwards after an untimed one"
    checks = [{"score_entries_per_rank": [528, 1552], "compute_ms_per_rank": [0.18, 0.29], "compute_ms_of": timed,
               "zigzag": False},
              {"score_entries_per_rank": [1040, 1040], "compute_ms_per_rank": [0.56, 0.54], "compute_ms_of": timed,
               "zigzag": True}]
    fig = ring_balance(checks)
    keys = [t for ax in fig.axes for t in ax.get_legend().get_texts()]
    assert [t.get_text() for t in keys[:2]] == ["contiguous, max/min 2.94", "zig-zag, max/min 1.00"]
    assert min(t.get_fontsize() for t in keys) >= 8
