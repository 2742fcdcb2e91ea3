"""Integration through kit.Cluster: run/sweep reuse ranks, append records at once, stop on request."""
from __future__ import annotations

import json
import threading

import pytest

from kit.experiments import ExperimentConfig, load_jsonl, run, sweep
from kit.experiments.api import shutdown

TINY = dict(model_size="tiny", steps=2, warmup_steps=1)


@pytest.fixture(autouse=True, scope="module")
def _stop_ranks():
    yield
    shutdown()


def test_run_and_sweep_through_cluster(tmp_path) -> None:
    path = tmp_path / "runs.jsonl"
    seen: list[tuple[int, int]] = []
    recs = sweep(ExperimentConfig(**TINY), "bucket_cap_mb", [0.001, 25], results_path=str(path),
                 progress=lambda i, n: seen.append((i, n)))
    assert [r["config"]["bucket_cap_mb"] for r in recs] == [0.001, 25]
    assert len(recs[0]["comm"]["buckets"]) > len(recs[1]["comm"]["buckets"])
    assert seen[0] == (0, 2) and seen[-1] == (2, 2)
    assert [r["run_id"] for r in load_jsonl(path)] == [r["run_id"] for r in recs]
    # A different world size gets fresh ranks (single runs in one process).
    single = run(ExperimentConfig(**TINY, strategy="single", world_size=1), results_path=str(path))
    assert single["env"]["world_size_launched"] == 1 and len(load_jsonl(path)) == 3
    assert {s["rank"] for s in single["steps"]} == {0}


def test_stop_event_ends_a_long_run_early() -> None:
    stop = threading.Event()  # set once a measured step is done: the run is under way, not yet starting
    rec = run(ExperimentConfig(model_size="tiny", steps=100_000, warmup_steps=0), stop=stop,
              progress=lambda k, n: k >= 1 and stop.set())
    assert len(rec["steps"]) < 2 * 100_000
    assert any("stopped early" in n for n in rec["notes"])
    # Both ranks stopped at the same step (otherwise the run would have hung in a collective).
    per_rank = {r: max(s["step"] for s in rec["steps"] if s["rank"] == r) for r in (0, 1)}
    assert per_rank[0] == per_rank[1]


def test_runs_do_not_leak_models_in_the_ranks():
    """The DDP comm hook's state once referenced the model: a cycle through the C++ reducer
    kept every run's model alive (about 50 MiB per MLP run on each rank)."""
    from kit.engine.cluster import Cluster
    from kit.experiments import ExperimentConfig, run

    with Cluster(world_size=2) as c:
        for bucket in (1.0, 25.0):
            run(ExperimentConfig(steps=2, warmup_steps=1, bucket_cap_mb=bucket, interconnect="10gbe"), cluster=c)
        alive = c.run("import gc\ngc.collect()\nsum(1 for o in gc.get_objects() "
                      "if isinstance(o, torch.nn.parallel.DistributedDataParallel))", on_output=lambda *a: None)
    assert alive.values == {0: 0, 1: 0}


def test_compare_on_two_ranks_calls_a_much_bigger_batch_slower() -> None:
    """A real compare on 2 gloo ranks: the structure a lesson prints, and a verdict that must
    come out "slower" for 32x the batch: a 4-5x longer step here, beyond what load noise does to a
    ratio of medians on a busy 2-core machine. (8x the batch gave only 1.5-1.8x: the Adam step and the
    all-reduce of the MLP's 3.4M parameters do not grow with the batch, and one of three pairs caught by a
    burst of other work, ratio 0.93 at a load of 5-8, left the interval spanning 1.)"""
    from kit.experiments import compare

    a = ExperimentConfig(steps=3, warmup_steps=1, batch_size=32)
    # 6 pairs, the fewest that can back an ordering (this test used 3, whose range holds the median 75% of
    # the time; comparison.paired_verdict now claims no ordering from so few)
    out = compare(a, a.replace(batch_size=1024), repeats=6)
    assert out["verdict"] == "slower", out["summary"]
    assert out["order"] == ["A", "B", "B", "A"] * 3 and len(out["pairs"]) == 6
    assert out["ci_low"] <= out["ratio"] <= out["ci_high"] and out["ci_low"] > 1
    assert out["summary"].startswith("batch_size=1024 is ") and "slower than batch_size=32" in out["summary"]
    for side, bs in (("a", 32), ("b", 1024)):
        rec = out[side]
        assert rec["schema"] == "kit.run/2" and rec["config"]["batch_size"] == bs
        assert len(rec["repeats"]) == 6 and rec["repeat_spread"]["step_ms"]["n"] == 6
        assert rec["spread"]["step_ms"]["n"] == 3 * 6  # 3 measured steps x 6 repeats
    assert [p["a_ms"] for p in out["pairs"]] == [r["spread"]["step_ms"]["median"] for r in out["a"]["repeats"]]
    json.dumps(out, allow_nan=False)
