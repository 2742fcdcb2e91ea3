"""The planner against published runs (kit/experiments/theory/data/published_runs.json): the data keeps
every source, the published layouts are expressible, and the summary bench/bench_plan_published.py
prints meets its targets where this test checks them (memory, fit, SC21 Table 2's ZeRO-3 collapse)."""
from __future__ import annotations

from kit.experiments.theory.published import published_runs, source_flops_per_step
from kit.experiments.theory.published_check import compare_published, published_step_s, summarise


def test_every_run_loads_with_its_source_and_a_layout_that_uses_its_gpus() -> None:
    runs = published_runs()
    assert len(runs) == 48 and len({r.id for r in runs}) == 48
    for r in runs:
        assert r.source and r.published and r.metric
        k = r.knobs
        assert k["tp"] * k["pp"] * k["dp"] * k["cp"] == r.cluster.world, r.id
        assert source_flops_per_step(r) > 0 and published_step_s(r) > 0
    korthikanti = next(r for r in runs if r.id == "korthikanti-t5-175B")
    assert abs(published_step_s(korthikanti) - 13.75) / 13.75 < 0.05  # eq.(7) and the MFU give the printed step


def test_zero3_collapses_as_gpus_grow_at_a_fixed_batch_and_ptd_p_does_not() -> None:
    """SC21 Table 2, 174.6B at 1536 sequences: ZeRO-3 measured 144 -> 88 -> 44 TFLOP/s on 384 -> 768 -> 1536
    GPUs; the per-layer gathers must make the predicted throughput fall the same way."""
    table = [compare_published(r) for r in published_runs() if r.id.startswith("sc21-t2-")]  # each planned once
    rows = [c for c in table if "174.6B" in c.run.id]
    zero3 = sorted((c.run.cluster.world, c.predicted) for c in rows if "zero3" in c.run.id)
    ptd = sorted((c.run.cluster.world, c.predicted) for c in rows if "ptd" in c.run.id)
    assert zero3[1][1] < 0.75 * zero3[0][1] and zero3[2][1] < 0.6 * zero3[1][1]
    assert ptd[2][1] > 0.85 * ptd[0][1]
    assert all(pv > zv for (_, zv), (_, pv) in zip(zero3, ptd))  # at 384 too: 153 against 144 measured
    assert all(abs(c.ratio - 1) < 0.25 for c in rows)  # each within 25% of what was measured
    both = summarise(table)
    assert both["sc21_table2_order"] == (6, 6, True, True)  # 529.6B too: PTD-P on 560 above ZeRO-3 on 640


def test_torchtitan_peaks_fit_and_come_within_15_percent() -> None:
    rows = [compare_published(r) for r in published_runs() if r.memory_gib]
    s = summarise(rows)
    assert s["fits"][2] and s["memory_median_error"][2], s


def test_a_published_layout_is_ranked_among_the_layouts_its_software_could_run() -> None:
    """SC21's Megatron-LM had neither a sharded optimizer nor context parallelism: its published layout is
    ranked among layouts without them, and the gap to today's best (with them) is kept beside it."""
    runs = {r.id: r for r in published_runs()}
    sc21, titan = runs["sc21-t1-18.4B"], runs["torchtitan-t2-8b-cp4"]
    assert dict(sc21.limits) == {"cp": 1, "zero": 0} and not titan.limits  # torchtitan trains with cp and FSDP
    c = compare_published(sc21)
    assert c.best.config.zero == 0 and c.best.config.cp == 1
    assert c.gap_today >= c.gap > 0 and c.rank > 1


def test_a_comparison_shown_in_a_cell_is_one_labelled_sentence() -> None:
    """`compare_published(run)` as a cell's value was the dataclass repr: about 2,300 characters of nested specs,
    no sentence, no label saying which number is the paper's and which the planner's."""
    runs = {r.id: r for r in published_runs()}
    c = compare_published(runs["mtnlg-530b-3360"])
    text = repr(c)
    assert len(text) < 400, len(text)
    assert text.startswith("<Comparison mtnlg-530b-3360 (MT-NLG 530B on 420 DGX A100 (3360 GPUs)): TFLOP/s per GPU "
                           f"published {c.run.published:g} (measured), predicted {c.predicted:,.0f} "
                           f"(ratio {c.ratio:.2f}); ")
    assert f"ranks {c.rank} among the planner's, {c.gap:.0%} slower than the best (predicted)" in text
