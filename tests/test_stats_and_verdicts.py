"""The measuring layer's statistics with synthetic records: no ranks, no timing thresholds.

Spread fields, repeats, the interleaving order, the bootstrap interval and the verdict rule;
`compare`, `run(repeats=)` and `sweep(repeats=)` driven by stand-ins for the ranks, so the
order of runs and the pairing are checked exactly.
"""
from __future__ import annotations

import json
import random
import threading
from statistics import median
from typing import Any

import pytest

from kit.experiments import ExperimentConfig, compare, run, sweep
from kit.experiments.comparison import paired_verdict, run_median_ms, summary_line
from kit.experiments.records import combine_repeats, merge, table
from kit.experiments.stats import (
    bootstrap_ci, interleave, median_order_ci, min_pairs, per_step_values, quantile, range_level, ratio_ci,
    repeat_spread,
    spread, verdict,
)

CFG = ExperimentConfig(steps=4, warmup_steps=2)


def rows(step_ms: list[list[float]], **phases: float) -> list[dict[str, Any]]:
    """Step rows: step_ms[i][rank]; every phase field present, as StepClock writes them."""
    base = {"fwd_ms": 1.0, "bwd_ms": 2.0, "opt_ms": 0.5, "comm_ms": 1.0, "comm_overlap_ms": 0.5,
            "comm_exposed_ms": 0.5, "loss": 2.0, "samples": 32, **phases}
    return [{**base, "step": i, "rank": r, "step_ms": ms} for i, per in enumerate(step_ms)
            for r, ms in enumerate(per)]


def record(step_ms: list[list[float]], cfg: ExperimentConfig = CFG, stopped: bool = False,
           **phases: float) -> dict[str, Any]:
    """A merged record from synthetic per-rank parts (what run_rank returns on each rank)."""
    all_rows = rows(step_ms, **phases)
    parts = {r: {"rank": r, "steps": [x for x in all_rows if x["rank"] == r], "memory": {},
                 "timeline": [], "buckets": [], "param_bytes": 0, "notes": [], "emulated": False,
                 "env": {}, "stopped": stopped} for r in range(len(step_ms[0]))}
    return merge(parts, cfg)


# -- spread ------------------------------------------------------------------------------------------
def test_quantile_matches_numpy_linear_interpolation() -> None:
    xs = [7.0, 1.0, 3.0, 5.0]
    assert quantile(xs, 0.25) == pytest.approx(2.5)  # numpy.percentile([1,3,5,7], 25)
    assert quantile(xs, 0.5) == pytest.approx(4.0)
    assert quantile(xs, 1.0) == 7.0 and quantile([2.0], 0.75) == 2.0
    with pytest.raises(ValueError):
        quantile([], 0.5)


def test_spread_fields_and_non_finite_values_dropped() -> None:
    s = spread([10.0, 12.0, 11.0, 50.0, float("nan"), None])
    assert s == {"median": 11.5, "q1": 10.75, "q3": 21.5, "iqr": pytest.approx(10.75),
                 "min": 10.0, "max": 50.0, "n": 4}
    assert spread([]) is None


def test_step_is_as_slow_as_its_slowest_rank() -> None:
    vals = per_step_values(rows([[10.0, 14.0], [20.0, 12.0]], comm_exposed_ms=2.0), 64)
    assert vals["step_ms"] == [14.0, 20.0]
    assert vals["comm_overhead_pct"] == pytest.approx([100 * 2 / 14, 100 * 2 / 20])
    assert vals["throughput_samples_s"] == pytest.approx([64e3 / 14, 64e3 / 20])


def test_optimizer_cpu_time_is_spread_where_the_steps_carry_it() -> None:
    """opt_cpu_ms (the optimizer phase's CPU time) gets a spread like the wall-clock phases, the rank mean
    per step; a record whose rows lack it (made before it was timed) has none, not a spread of zeros."""
    rec = record([[10.0, 10.0], [11.0, 11.0], [12.0, 12.0]], opt_cpu_ms=3.0)
    assert rec["spread"]["opt_cpu_ms"]["median"] == 3.0 and rec["spread"]["opt_cpu_ms"]["n"] == 3
    assert "opt_cpu_ms" not in record([[10.0, 10.0], [11.0, 11.0]])["spread"]


def test_text_table_shows_the_optimizer_cpu_time_in_its_own_column() -> None:
    """A learner reading step times in the table sees the optimizer phase's CPU time beside its wall time,
    under its own header; a record without it (saved before it was timed) prints "-" there."""
    lines = table([record([[10.0, 10.0], [11.0, 11.0]], opt_cpu_ms=0.37),
                   record([[10.0, 10.0], [11.0, 11.0]])]).splitlines()
    head = lines[0]
    col = head.index("opt CPU")
    end = col + len("opt CPU")
    assert lines[1][col:end].strip() == "0.4" and lines[2][col:end].strip() == "-"
    assert head.index(" opt ") < col < head.index("comm")  # beside the wall-clock optimizer column


def test_record_has_spread_beside_the_means_and_is_complete() -> None:
    # One outlier step (a context switch): the mean moves, the median does not.
    rec = record([[10.0, 10.0], [11.0, 11.0], [12.0, 12.0], [100.0, 100.0]])
    assert rec["schema"] == "kit.run/2" and rec["complete"] is True
    assert rec["summary"]["step_ms"] == pytest.approx(33.25)  # kit.run/1 mean, unchanged
    st = rec["spread"]["step_ms"]
    assert (st["median"], st["min"], st["max"], st["n"]) == (11.5, 10.0, 100.0, 4)
    for key in ("fwd_ms", "bwd_ms", "opt_ms", "comm_ms", "comm_overlap_ms", "comm_exposed_ms",
                "comm_overhead_pct", "throughput_samples_s"):
        assert set(rec["spread"][key]) == {"median", "q1", "q3", "iqr", "min", "max", "n"}, key
    json.dumps(rec, allow_nan=False)
    assert "11.5" in table([rec])  # the text table shows the median too


def test_stopped_run_is_marked_incomplete() -> None:
    rec = record([[10.0, 10.0]], stopped=True)
    assert rec["complete"] is False and any("stopped early" in n for n in rec["notes"])
    assert "(stopped)" in table([rec])


def test_combine_repeats_keeps_every_repeat_and_the_run_to_run_spread() -> None:
    reps = [record([[m, m]] * 4) for m in (10.0, 12.0, 20.0)]
    rec = combine_repeats(reps)
    assert [r["run_id"] for r in rec["repeats"]] == [r["run_id"] for r in reps]
    assert sorted({row["repeat"] for row in rec["steps"]}) == [0, 1, 2]
    assert len(rec["steps"]) == 3 * 4 * 2
    assert rec["spread"]["step_ms"]["n"] == 12  # pooled over all measured steps
    assert rec["repeat_spread"]["step_ms"] == spread([10.0, 12.0, 20.0])
    assert rec["summary"]["step_ms"] == pytest.approx(14.0)
    assert rec["summary"]["throughput_samples_s"] == pytest.approx(CFG.global_batch_size * 1e3 / 14.0)
    assert combine_repeats(reps[:1]) is reps[0]
    assert combine_repeats(reps[:1] + [record([[10.0, 10.0]], stopped=True)])["complete"] is False
    assert repeat_spread([]) == {}


# -- interleaving, bootstrap, verdict -----------------------------------------------------------
def test_interleave_alternates_who_goes_first() -> None:
    assert interleave(2, 4) == [0, 1, 1, 0, 0, 1, 1, 0]
    order = interleave(3, 3)
    assert order == [0, 1, 2, 1, 2, 0, 2, 0, 1]
    for r in range(3):  # each round runs every point once; each point leads once
        assert sorted(order[3 * r:3 * r + 3]) == [0, 1, 2]
    assert [order[3 * r] for r in range(3)] == [0, 1, 2]


def test_bootstrap_is_seeded_and_brackets_the_median() -> None:
    xs = [1.10, 1.25, 1.18, 1.21, 1.15, 1.30, 1.12]
    lo, hi = bootstrap_ci(xs, seed=3)
    assert (lo, hi) == bootstrap_ci(xs, seed=3)  # the same pairs print the same line
    assert min(xs) <= lo <= median(xs) <= hi <= max(xs)
    assert bootstrap_ci([1.2], seed=0) == (1.2, 1.2)
    # Five pairs: the median's bootstrap interval is the pairs' range (all must agree).
    five = [0.97, 1.04, 1.01, 1.08, 1.02]
    assert bootstrap_ci(five) == (min(five), max(five))


def test_order_statistic_interval_and_the_widened_bootstrap() -> None:
    assert median_order_ci([3.0, 1.0, 2.0, 5.0, 4.0]) == (1.0, 5.0)  # < 6 values: the range
    assert median_order_ci([float(i) for i in range(1, 10)]) == (2.0, 8.0)  # 9: 96.1% coverage
    seven = [1.00, 1.04, 1.05, 1.06, 1.07, 1.08, 1.30]
    b_lo, b_hi = bootstrap_ci(seven)
    assert b_lo > 1.00  # the bootstrap alone would exclude the pair at 1.00 ...
    assert ratio_ci(seven) == (1.00, 1.30)  # ... the verdict's interval keeps it: no "slower"
    assert verdict(median(seven), *ratio_ci(seven)) == "same within noise"


def test_one_disagreeing_pair_of_six_means_no_verdict() -> None:
    agree = paired_verdict([10.0] * 6, [12.0, 12.5, 11.8, 12.2, 12.1, 11.9])
    assert agree["verdict"] == "slower"
    one_off = paired_verdict([10.0] * 6, [12.0, 12.5, 9.9, 12.2, 12.1, 11.9])
    assert one_off["verdict"] == "same within noise" and one_off["ci_low"] < 1


@pytest.mark.parametrize("ratio, lo, hi, expected", [
    (1.20, 1.10, 1.30, "slower"),
    (0.80, 0.70, 0.90, "faster"),
    (1.01, 0.97, 1.06, "same within noise"),   # the interval spans 1
    (1.015, 1.005, 1.02, "same within noise"),  # excludes 1, but below the 2% minimum effect
    (0.985, 0.98, 0.995, "same within noise"),
    (1.05, 1.001, 1.09, "slower"),
])
def test_verdict_needs_the_interval_and_the_minimum_effect(ratio: float, lo: float, hi: float,
                                                           expected: str) -> None:
    assert verdict(ratio, lo, hi, min_effect=0.02) == expected


def test_paired_verdict_uses_per_pair_ratios_not_pooled_means() -> None:
    # The machine drifts 2x between pairs; within each pair B is 10% slower. Pooled means
    # would drown that in the drift; per-pair ratios see it every time.
    a = [10.0, 20.0, 10.0, 20.0, 15.0, 10.0]
    b = [11.0, 22.0, 11.0, 22.0, 16.5, 11.0]
    out = paired_verdict(a, b)
    assert out["ratio"] == pytest.approx(1.1) and out["verdict"] == "slower"
    assert [p["ratio"] for p in out["pairs"]] == pytest.approx([1.1] * 6)
    with pytest.raises(ValueError, match="no complete pairs"):
        paired_verdict([], [])


# -- compare / run / sweep driven by stand-ins ---------------------------------------------------
class FakeRunner:
    """Answers like kit.experiments.run: a record whose steps have a chosen median."""

    def __init__(self, slow_batch: float = 1.0, noise: float = 0.03, seed: int = 0,
                 stop_on_call: int | None = None) -> None:
        self.calls: list[ExperimentConfig] = []
        self.slow_batch, self.noise, self.rng = slow_batch, noise, random.Random(seed)
        self.stop_on_call = stop_on_call

    def __call__(self, cfg: ExperimentConfig, **_: Any) -> dict[str, Any]:
        self.calls.append(cfg)
        base = 50.0 * (self.slow_batch if cfg.batch_size > 32 else 1.0)
        base *= 1.0 + self.rng.uniform(-self.noise, self.noise)
        ms = [[base * (1 + 0.01 * i)] * 2 for i in range(cfg.steps)]
        return record(ms, cfg, stopped=len(self.calls) == self.stop_on_call)


def test_compare_runs_interleaved_pairs_and_reports_slower() -> None:
    fake = FakeRunner(slow_batch=1.15)
    a, b = CFG, CFG.replace(batch_size=128)
    # 6 pairs, the fewest that can back an ordering at 95% (this test used 4, whose range holds the median
    # 87.5% of the time: "slower (95% CI ...)" from 4 pairs was the defect test_too_few_pairs_... now checks)
    out = compare(a, b, repeats=6, runner=fake)
    assert [c.batch_size for c in fake.calls] == [32, 128, 128, 32] * 3
    assert out["order"] == ["A", "B", "B", "A"] * 3
    assert out["verdict"] == "slower" and out["ci_low"] > 1 and 1.05 < out["ratio"] < 1.25
    assert out["summary"].startswith("batch_size=128 is ") and "slower than batch_size=32" in out["summary"]
    assert "95% CI" in out["summary"] and "6 interleaved pairs" in out["summary"]
    assert len(out["pairs"]) == 6 and len(out["a"]["repeats"]) == len(out["b"]["repeats"]) == 6
    assert out["pairs"][0]["a_ms"] == run_median_ms(out["a"]["repeats"][0])
    json.dumps(out, allow_nan=False)
    back = compare(b, a, repeats=6, runner=FakeRunner(slow_batch=1.15))
    assert back["verdict"] == "faster" and "faster than" in back["summary"]


@pytest.mark.parametrize("n, level", [(2, "50%"), (3, "75%"), (5, "94%")])
def test_too_few_pairs_claim_no_ordering_and_say_why(n: int, level: str) -> None:
    """Every pair 10% slower, but n < 6 pairs: before, "B is 1.10x slower (95% CI 1.10-1.10, 2 interleaved
    pairs)", a 95% the range of 2 pairs (50%) cannot give; compare(repeats=2), or one stopped early, said it."""
    out = paired_verdict([10.0] * n, [11.0] * n)
    assert out["verdict"] == "same within noise" and out["too_few_pairs"] is True
    text = summary_line(out, "A", "B")
    assert text.startswith(f"B and A: no ordering claimed from {n} interleaved pairs (step time ratio 1.10")
    assert f"holds the median only {level} of the time); 6 pairs or more give a 95% CI" in text
    assert "95% CI 1" not in text
    six = paired_verdict([10.0] * 6, [11.0] * 6)
    assert six["verdict"] == "slower" and six["too_few_pairs"] is False
    quick = compare(CFG, CFG.replace(batch_size=128), repeats=2, runner=FakeRunner(slow_batch=1.15))
    assert quick["verdict"] == "same within noise" and "no ordering claimed from 2" in quick["summary"]
    assert min_pairs() == 6 and range_level(6) > 0.95 > range_level(5)


def test_compare_of_a_config_with_itself_is_same_within_noise() -> None:
    out = compare(CFG, CFG, repeats=6, runner=FakeRunner(noise=0.05, seed=7))
    assert out["verdict"] == "same within noise" and "same within noise" in out["summary"]
    assert out["summary"].startswith("B (the same config) and A (")


def test_compare_names_strategies_and_overrides_steps() -> None:
    fake = FakeRunner()
    out = compare(CFG.replace(strategy="dp"), CFG, repeats=2, steps=3, warmup_steps=1, runner=fake)
    assert {(c.steps, c.warmup_steps) for c in fake.calls} == {(3, 1)}
    assert (out["name_a"], out["name_b"]) == ("dp", "ddp")
    with pytest.raises(ValueError, match="at least 2 pairs"):
        compare(CFG, CFG, repeats=1, runner=fake)


def test_compare_drops_a_stopped_round_from_the_pairs() -> None:
    out = compare(CFG, CFG.replace(batch_size=64), repeats=3, runner=FakeRunner(stop_on_call=3))
    assert len(out["pairs"]) == 2 and out["complete"] is False  # round 2 (B A) lost its B


class FakeCluster:
    """Stands in for kit.Cluster: `call` answers each rank as run_rank would, and reports
    progress the way the ranks do (warm-up and the memory probe included)."""

    world_size = 2

    def __init__(self) -> None:
        self.configs: list[dict[str, Any]] = []

    def call(self, fn: str, config: dict[str, Any], stoppable: bool, on_progress: Any = None, stop: Any = None) -> dict:
        self.configs.append(config)
        cfg = ExperimentConfig.from_dict(config)
        total = cfg.warmup_steps + cfg.steps + 1
        for s in range(1, total + 1):
            if on_progress:
                on_progress(0, s, total)
        ms = 10.0 * len(self.configs)
        rec_rows = rows([[ms, ms]] * cfg.steps)
        return {r: {"rank": r, "steps": [x for x in rec_rows if x["rank"] == r], "memory": {},
                    "timeline": [], "buckets": [], "param_bytes": 0, "notes": [], "emulated": False,
                    "env": {}, "stopped": False} for r in (0, 1)}


def test_run_repeats_and_progress_counts_measured_steps_only() -> None:
    seen: list[tuple[int, int]] = []
    c = FakeCluster()
    rec = run(CFG, cluster=c, repeats=3, progress=lambda k, n: seen.append((k, n)))
    assert len(c.configs) == 3 and len(rec["repeats"]) == 3
    assert rec["repeat_spread"]["step_ms"]["median"] == 20.0
    assert {n for _, n in seen} == {3 * CFG.steps}  # measured steps of all repeats
    ks = [k for k, _ in seen]
    assert ks == sorted(ks) and ks[0] == 0 and ks[-1] == 3 * CFG.steps
    assert ks.count(0) >= CFG.warmup_steps  # warm-up reports 0 measured steps
    with pytest.raises(ValueError, match="repeats"):
        run(CFG, cluster=c, repeats=0)


def test_sweep_repeats_run_round_robin_and_combine_per_point() -> None:
    c = FakeCluster()
    recs = sweep(CFG, "bucket_cap_mb", [1.0, 5.0, 25.0], cluster=c, repeats=2)
    assert [x["bucket_cap_mb"] for x in c.configs] == [1.0, 5.0, 25.0, 5.0, 25.0, 1.0]
    assert [r["config"]["bucket_cap_mb"] for r in recs] == [1.0, 5.0, 25.0]
    assert all(len(r["repeats"]) == 2 for r in recs)


def test_a_sweep_of_no_values_or_of_one_value_not_in_a_list_says_what_to_give() -> None:
    """values=[] and a bare values=5 are refused saying what to give, before anything runs: never a
    ZeroDivisionError from the run order or "'int' object is not iterable"."""
    c = FakeCluster()
    with pytest.raises(ValueError, match=r"^values=\[\]: give at least one value of bucket_cap_mb to run, e.g. "
                                         r"sweep\(base, 'bucket_cap_mb', \[25.0\]\)"):
        sweep(CFG, "bucket_cap_mb", [], cluster=c)
    with pytest.raises(TypeError, match=r"^values=5: give the values of bucket_cap_mb as a list"):
        sweep(CFG, "bucket_cap_mb", 5, cluster=c)  # type: ignore[arg-type]
    assert c.configs == []
    assert [r["config"]["bucket_cap_mb"] for r in sweep(CFG, "bucket_cap_mb", (5.0,), cluster=c)] == [5.0]


def test_a_misspelt_keyword_to_run_sweep_or_compare_names_the_one_meant() -> None:
    """A misspelt keyword gets the one meant, not Python's bare "run() got an unexpected keyword argument
    'repeat'". The check acts before any run (the fake cluster sees none) and leaves each signature as written
    (tab completion reads it)."""
    import inspect
    c = FakeCluster()
    with pytest.raises(TypeError, match=r"^run\(\) has no keyword repeat= \(did you mean repeats=\?\); "
                                        r"its keywords: config, cluster, results_path, .*repeats"):
        run(CFG, repeat=2, cluster=c)
    with pytest.raises(TypeError, match=r"^sweep\(\) has no keyword repeat= \(did you mean repeats=\?\)"):
        sweep(CFG, "bucket_cap_mb", [1, 5], repeat=3, cluster=c)
    with pytest.raises(TypeError, match=r"^compare\(\) has no keyword min_efect= \(did you mean min_effect=\?\), "
                                        r"xyz=; its keywords: a, b, repeats"):
        compare(CFG, CFG, min_efect=0.1, xyz=1, cluster=c)
    assert c.configs == []
    assert list(inspect.signature(run).parameters)[:3] == ["config", "cluster", "results_path"]
    assert "repeats" in inspect.signature(sweep).parameters and "min_effect" in inspect.signature(compare).parameters
    assert run(CFG, cluster=c, repeats=1)["config"]["bucket_cap_mb"] == CFG.bucket_cap_mb  # a good call runs


def test_sweep_stop_keeps_finished_points() -> None:
    stop = threading.Event()
    c = FakeCluster()
    seen: list[int] = []

    def progress(k: int, n: int) -> None:
        seen.append(k)
        if k == 2:
            stop.set()
    recs = sweep(CFG, "bucket_cap_mb", [1.0, 5.0, 25.0], cluster=c, repeats=2, stop=stop,
                 progress=progress)
    assert len(c.configs) == 2 and [r["config"]["bucket_cap_mb"] for r in recs] == [1.0, 5.0]


class InterruptedCluster(FakeCluster):
    """FakeCluster whose call number `at` is interrupted as the kernel sees it: every rank raised
    KeyboardInterrupt (the stop button forwarded to the ranks), as kit.Cluster.call reports it."""

    def __init__(self, at: int, failures: dict[int, Any] | None = None) -> None:
        super().__init__()
        self.at, self.failures = at, failures

    def call(self, fn: str, config: dict[str, Any], *args: Any, **kw: Any) -> dict:
        if len(self.configs) + 1 == self.at:
            from kit.errors import CellError, RankFailure
            if self.failures is not None:  # as kit.Cluster.call raises a request the interrupt ended
                raise CellError(self.failures, interrupted=True)
            raise CellError({r: RankFailure(r, "KeyboardInterrupt", "") for r in (0, 1)})
        return super().call(fn, config, *args, **kw)


@pytest.mark.parametrize("repeats", [1, 2])
def test_an_interrupted_sweep_returns_the_points_that_finished(tmp_path, capsys, repeats: int) -> None:
    """The stop button during point 4 of 6: before, the CellError's rank traceback and nothing returned
    (`s = sweep(...)` left s unset; with repeats=2 not even results_path had the finished runs)."""
    path = tmp_path / "sweep.jsonl"
    values = [1.0, 2.0, 4.0, 8.0, 16.0, 25.0]
    recs = sweep(CFG, "bucket_cap_mb", values, cluster=InterruptedCluster(at=4), repeats=repeats,
                 results_path=str(path))
    said = capsys.readouterr().out
    done = {1: [1.0, 2.0, 4.0], 2: [1.0, 2.0, 4.0]}[repeats]  # repeats=2 runs 1 2 3 4 5 6, 2 3 4 ...: 3 done
    assert [r["config"]["bucket_cap_mb"] for r in recs] == done
    assert len(path.read_text().splitlines()) == 3
    assert said.startswith("[kit] sweep interrupted: returning the 3 of 6 point(s) that finished, bucket_cap_mb=1.0")
    assert "not run: 8.0, 16.0, 25.0; the run in progress was dropped" in said
    assert said.rstrip().endswith("the cell goes on with them, and a Run All with the cells after it.")
    # a failure is not an interrupt, and an interrupt before anything finished has nothing to return
    with pytest.raises(Exception, match="KeyboardInterrupt"):
        sweep(CFG, "bucket_cap_mb", values, cluster=InterruptedCluster(at=1))


def test_an_interrupted_sweep_of_ddp_runs_returns_the_points_that_finished_when_the_kit_released_a_rank() -> None:
    """Interrupting a DDP run can leave one rank waiting in the gradient all-reduce, which the kit releases by
    closing the group (docs/faults.md N12): that rank raises gloo's error, not KeyboardInterrupt. The sweep
    was still interrupted, its ranks kept: before, that traceback came and the finished points were lost.
    A rank that died during the interrupt is a failure: it is raised."""
    from kit.errors import RankFailure

    released = {0: RankFailure(0, "RuntimeError", "was blocked in a collective that rank(s) 1, stopped by the "
                               "interrupt, never joined, so the kit closed their connections"),
                1: RankFailure(1, "KeyboardInterrupt", "")}
    recs = sweep(CFG, "bucket_cap_mb", [1.0, 2.0, 4.0], cluster=InterruptedCluster(at=3, failures=released))
    assert [r["config"]["bucket_cap_mb"] for r in recs] == [1.0, 2.0]
    died = {0: RankFailure(0, "Died", "killed by signal 9", died=True), 1: RankFailure(1, "KeyboardInterrupt", "")}
    with pytest.raises(Exception, match="killed by signal 9"):
        sweep(CFG, "bucket_cap_mb", [1.0, 2.0, 4.0], cluster=InterruptedCluster(at=3, failures=died))


def test_an_interrupted_run_of_repeats_returns_the_repeats_that_finished(capsys) -> None:
    rec = run(CFG, cluster=InterruptedCluster(at=3), repeats=4)
    assert len(rec["repeats"]) == 2 and rec["complete"] is False
    assert "interrupted: 2 of the 4 repeats asked for" in rec["notes"]
    assert capsys.readouterr().out.startswith("[kit] run interrupted: returning the 2 of 4 repeat(s) that finished")
    with pytest.raises(Exception, match="KeyboardInterrupt"):  # the first repeat interrupted: nothing to return
        run(CFG, cluster=InterruptedCluster(at=1), repeats=4)


def test_an_interrupted_compare_judges_the_pairs_that_finished(capsys) -> None:
    calls = {"n": 0}
    fake = FakeRunner(slow_batch=1.15)

    def runner(cfg: ExperimentConfig, **kw: Any) -> dict[str, Any]:
        calls["n"] += 1
        if calls["n"] == 6:   # during round 3's first run
            raise KeyboardInterrupt
        return fake(cfg, **kw)
    out = compare(CFG, CFG.replace(batch_size=128), runner=runner)
    assert len(out["pairs"]) == 2 and out["complete"] is False and out["too_few_pairs"] is True
    assert "no ordering claimed from 2 interleaved pairs" in out["summary"]
    said = capsys.readouterr().out
    assert said.startswith("[kit] compare interrupted: judging the 2 of 6 pair(s) that finished")
    # the cell does not fail, so JupyterLab's Run All goes on: lesson 01 and 04, stopped in a verdict, ran to the end
    assert "the cell goes on with them, and a Run All with the cells after it." in said
    with pytest.raises(KeyboardInterrupt):  # nothing finished: the interrupt stands
        compare(CFG, CFG, runner=lambda *a, **k: (_ for _ in ()).throw(KeyboardInterrupt()))


def test_conclude_states_only_the_sentence_the_verdict_backs(capsys) -> None:
    from kit.experiments import conclude
    res = {"verdict": "same within noise", "summary": "ddp and dp: same within noise on this machine"}
    text = conclude(res, faster="DDP wins.", slower="DDP loses.", same="No ordering here.")
    assert text.splitlines() == ["[verdict: same within noise] ddp and dp: same within noise on this machine",
                                 "No ordering here."]
    assert "DDP" not in capsys.readouterr().out
    with pytest.raises(ValueError):
        conclude({"verdict": "maybe", "summary": ""})


def test_conclude_after_too_few_pairs_states_none_of_the_lessons_sentences(capsys) -> None:
    """An interrupted compare judged on 2 pairs claims no ordering: lesson 08's cell printed its "same" sentence,
    a claim that 2 pairs cannot back, and lesson 01's showed "[verdict: same within noise]" above a ratio of
    1.66 (range 1.43-1.90)."""
    from kit.experiments import conclude
    from kit.experiments.comparison import paired_verdict

    res = paired_verdict([10.0, 10.0], [13.0, 13.5])
    res["summary"] = "no ordering claimed from 2 interleaved pairs"
    text = conclude(res, faster="B wins.", slower="B loses.", same="The straggler costs nothing.")
    assert text.splitlines() == ["[verdict: none, too few pairs] no ordering claimed from 2 interleaved pairs",
                                 "Only 2 pair(s) finished: too few to back any of this cell's sentences; run it "
                                 "again for a verdict."], text
    assert "costs nothing" not in capsys.readouterr().out


def test_a_cell_ending_in_conclude_shows_the_verdict_once(capsys) -> None:
    """A cell ending in `conclude(...)` shows its verdict once: printed, not again as the cell's Out[] value."""
    from IPython.testing.globalipapp import start_ipython

    shell = start_ipython() or __import__("IPython").get_ipython()
    # a notebook's kernel (ipykernel) calls `_ipython_display_`; a terminal IPython 7 (this test's shell
    # there) turns that off, so turn it on as the kernel has it: the test is about notebooks
    shell.display_formatter.ipython_display_formatter.enabled = True
    shell.user_ns["res"] = {"verdict": "slower", "summary": "ddp vs dp: slower"}
    capsys.readouterr()
    shell.run_cell("from kit.experiments import conclude\nconclude(res, slower='DDP loses here.')")
    assert capsys.readouterr().out.count("DDP loses here.") == 1


def test_a_run_made_with_instrument_off_says_its_phases_were_not_timed() -> None:
    """instrument=False times whole steps only: the merged record says so in its label and a note, the
    table names the run under "-" phase columns, the bucket report and a prediction refuse to read its
    0.0 phases as times (they would put the whole step into "other")."""
    from kit.experiments.records import bucket_report
    from kit.experiments.record_readers import NOT_TIMED
    from kit.experiments.theory.predict_inputs import measured_pieces
    rec = record([[10.0, 10.0], [11.0, 11.0]], cfg=CFG.replace(instrument=False))
    assert rec["label"].endswith(" uninstrumented") and any(n.startswith(NOT_TIMED) for n in rec["notes"])
    lines = table([rec]).splitlines()
    col = lines[0].index("fwd")
    assert lines[1][col:col + 3].strip() == "-" and lines[-1].startswith(f'phase columns "-" for {rec["label"]}: ')
    assert table([rec, rec]).count("phase columns") == 1  # repeats of one run: named once
    assert "not timed" in bucket_report(rec) and "hidden" not in bucket_report(rec)
    with pytest.raises(ValueError, match="instrument=False"):
        measured_pieces(rec)
    timed = record([[10.0, 10.0], [11.0, 11.0]])
    assert "uninstrumented" not in timed["label"] and "hidden" in bucket_report(timed)


def test_a_mesh_prediction_from_an_untimed_run_uses_the_wires_own_times() -> None:
    """A mesh record's step rows carry comm_ms 0.0 when instrument=False (never timed): the mesh model
    then takes the non-communication time as the step less the wire's own collective times, instead of
    the whole step (which put the collectives in twice)."""
    from kit.experiments.theory.predict_mesh import mesh_pieces
    rec = {"config": {"strategy": "tp", "mesh": {"dp": 2, "tp": 2}, "instrument": False},
           "comm": {"report": {"measured_per_step": {"tp/all_reduce": {"calls": 2, "payload_bytes": 100.0,
                                                                       "ms": 10.0}}}},
           "summary": {"step_ms": 30.0, "throughput_samples_s": 100.0},
           "steps": [{"rank": 0, "step": 0, "step_ms": 30.0, "comm_ms": 0.0}]}
    assert mesh_pieces(rec)["other_ms"] == 20.0
    timed = {**rec, "config": {**rec["config"], "instrument": True},
             "steps": [{"rank": 0, "step": 0, "step_ms": 30.0, "comm_ms": 12.0}]}
    assert mesh_pieces(timed)["other_ms"] == 18.0  # timed: each step less its own collectives
