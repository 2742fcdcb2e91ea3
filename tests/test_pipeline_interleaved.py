"""Interleaved 1F1B (virtual stages) in the pipeline strategy: the schedule, its refusals, a
2-rank run equal to one process, and the record's bubble beside (p-1)/(v m + p-1).

The schedules are checked by a pure-Python simulation that runs every rank's list of operations
against the others with the strategy's semantics (isend never blocks, recv blocks, one channel's
messages match in the order sent): no deadlock, no message matched to the wrong operation, and,
with equal chunk ops and free messages, exactly the formula's bubble.
"""
from __future__ import annotations

import pytest
import torch

from kit.experiments.config import ExperimentConfig, ExperimentConfigError
from kit.experiments.harness.local import run_each, run_local
from kit.experiments.harness.params_vs_ddp import params_after_steps
from kit.experiments.measure.workloads import build_workload
from kit.experiments.records import merge
from kit.experiments.theory.bubble import predicted_bubble
from kit.experiments.theory.pipeline_schedule import ScheduleError, schedule, simulate


@pytest.mark.parametrize("p", [2, 4])
@pytest.mark.parametrize("v", [1, 2, 3])
@pytest.mark.parametrize("k", [1, 2, 3, 4])
def test_interleaved_schedule_runs_without_deadlock_and_gives_the_formula(p: int, v: int, k: int) -> None:
    m = k * p
    sim = simulate("interleaved_1f1b", p, m, v)  # raises on a deadlock or a mismatched message
    assert sim["bubble"] == pytest.approx(predicted_bubble(p, m, v))
    if v > 1:  # the point of interleaving: a smaller bubble than the same m without it
        assert sim["bubble"] < simulate("1f1b", p, m)["bubble"]


@pytest.mark.parametrize("kind", ["gpipe", "1f1b"])
@pytest.mark.parametrize("p,m", [(2, 1), (2, 4), (4, 2), (4, 8)])
def test_plain_schedules_give_gpipes_bubble(kind: str, p: int, m: int) -> None:
    assert simulate(kind, p, m)["bubble"] == pytest.approx((p - 1) / (m + p - 1))


def test_the_simulation_catches_a_deadlock_and_a_wrong_match() -> None:
    # rank 0 waits for a gradient of a micro-batch rank 1 has not yet received: both wait in recv
    with pytest.raises(ScheduleError, match="deadlock"):
        simulate("1f1b", 2, 1, plans=[[("B", 0, 0), ("F", 0, 0)], [("F", 0, 0), ("B", 0, 0)]])
    # rank 0 receives gradients in the other order than rank 1 sends them: gloo would match the
    # first one sent to the wrong backward
    with pytest.raises(ScheduleError, match="out of order"):
        simulate("gpipe", 2, 2, plans=[[("F", 0, 0), ("F", 0, 1), ("B", 0, 1), ("B", 0, 0)],
                                       [("F", 0, 0), ("B", 0, 0), ("F", 0, 1), ("B", 0, 1)]])


def test_megatron_order_chunks_in_groups_of_p_with_its_warm_up() -> None:
    p, m, v = 4, 8, 2
    ops = schedule("interleaved_1f1b", 0, p, m, v)
    forwards = [(c, i) for op, c, i in ops if op == "F"]
    assert forwards[:8] == [(0, 0), (0, 1), (0, 2), (0, 3), (1, 0), (1, 1), (1, 2), (1, 3)]
    warm = (p - 0 - 1) * 2 + (v - 1) * p  # Megatron-LM's warm-up on rank 0
    assert [op for op, _, _ in ops[:warm + 1]] == ["F"] * (warm + 1) and ops[warm + 1][0] == "B"
    assert ops[warm + 1] == ("B", 1, 0)  # the first backward is the last chunk's
    assert schedule("interleaved_1f1b", 1, 2, 4, 1) == schedule("1f1b", 1, 2, 4)  # v = 1 is 1F1B


def test_config_refusals_say_the_fix() -> None:
    base = dict(strategy="pipeline", schedule="interleaved_1f1b", virtual_stages=2)
    with pytest.raises(ExperimentConfigError, match=r"multiple of 2 .*try micro_batches=2 or 4"):
        ExperimentConfig(**base, micro_batches=3, batch_size=6)
    with pytest.raises(ExperimentConfigError, match=r"needs strategy='pipeline' with schedule='interleaved_1f1b'"):
        ExperimentConfig(strategy="pipeline", schedule="1f1b", virtual_stages=2)
    with pytest.raises(ExperimentConfigError, match=r"5 blocks .* 6 stages is too many; use virtual_stages <= 2"):
        ExperimentConfig(**{**base, "virtual_stages": 3}, workload="mlp", model_size="small")
    with pytest.raises(ExperimentConfigError, match="on mesh=.* is not implemented"):
        ExperimentConfig(**base, workload="gpt", world_size=4, mesh={"pp": 2, "dp": 2}, batch_size=16)
    with pytest.raises(ExperimentConfigError, match="must be >= 1"):
        ExperimentConfig(strategy="pipeline", virtual_stages=0)
    cfg = ExperimentConfig(**base, workload="gpt", model_size="tiny", micro_batches=4, batch_size=8)
    assert "interleaved_1f1b m4 v2" in cfg.label()


def test_stage_blocks_table_matches_the_workloads() -> None:
    from kit.experiments.choices import STAGE_BLOCKS
    for name, sizes in STAGE_BLOCKS.items():
        for size, n in sizes.items():
            assert len(build_workload(name, size, n_samples=2).model) == n, (name, size)


INTERLEAVED = ExperimentConfig(strategy="pipeline", schedule="interleaved_1f1b", virtual_stages=2, workload="gpt",
                               model_size="tiny", batch_size=8, micro_batches=4, steps=3, warmup_steps=1, seed=3)


def test_two_ranks_interleaved_equal_one_process_after_steps() -> None:
    cfg = INTERLEAVED
    ds = build_workload(cfg.workload, cfg.model_size, seed=7, n_samples=cfg.global_batch_size * cfg.steps).dataset
    x, y = ds.x, ds.y
    per = run_local("kit.experiments.harness.params_vs_ddp:params_after_steps", 2, cfg.to_dict(), x, y,
                    threads_per_rank=1)
    ref = params_after_steps(cfg.replace(strategy="single", world_size=1, schedule="gpipe", virtual_stages=1).to_dict(),
                             x, y)
    got = {**per[0]["params"], **per[1]["params"]}
    assert set(got) == set(ref["params"])
    assert set(per[0]["params"]).isdisjoint(per[1]["params"])  # each stage's weights on one rank only
    assert per[0]["losses"] == pytest.approx(ref["losses"], rel=1e-5)
    assert len(set(ref["losses"])) == cfg.steps  # the weights moved: a vacuous check would not
    # atol 1e-4 = 10% of one Adam step (lr 1e-3): attention's key bias has a zero gradient in exact
    # arithmetic, so Adam turns its rounding noise (summed per micro-batch here) into steps of up
    # to lr (seen: 3e-5); the same tolerance as tests/test_strategy_sharding_and_compression.py.
    # A wrong chunk order, a missing 1/m or a skipped micro-batch moves every parameter by ~lr.
    for k, w in ref["params"].items():
        torch.testing.assert_close(got[k], w, rtol=1e-4, atol=1e-4, msg=lambda s: f"{k}: {s}")


def test_record_carries_the_bubble_beside_the_interleaved_formula() -> None:
    cfg = INTERLEAVED.replace(steps=2)
    per = run_each("kit.experiments.runner:run_rank", 2, [(cfg.to_dict(),)])
    rec = merge({r: per[r][0] for r in per}, cfg)
    pipe = rec["pipeline"]
    assert pipe["virtual_stages"] == 2 and pipe["formula_text"] == "(p-1)/(v*m+p-1)"
    assert pipe["formula"] == pytest.approx(1 / 9)  # p=2, m=4, v=2
    assert 0 < pipe["measured"] < 1 and rec["summary"]["bubble_pct"] is not None
    assert any("(p-1)/(v*m+p-1)" in n for n in rec["notes"])
    assert "interleaved_1f1b m4 v2" in rec["label"]


def test_pipeline_bubble_bench_runs_the_interleaved_order_and_says_its_formula(monkeypatch: pytest.MonkeyPatch) -> None:
    # tiny sizes: the numbers are timings (not asserted), the shape and the formula are not
    items = [(2, 2, 1, 8, 16, 2), (4, 1, 1, 8, 16, 2)]
    res = run_each("kit.experiments.parallel.pipeline_bubble:pipeline_bubble", 2, items, threads_per_rank=1)[0]
    assert [r["formula"] for r in res] == pytest.approx([1 / 5, 1 / 5])  # (p-1)/(v m+p-1) both
    for r in res:
        assert 0 <= r["measured"] < 1 and 0 <= r["waiting"] < 1 and r["descheduled"] >= 0
        assert len(r["measured_per_step"]) == 1 and r["fwd_op_ms"] > 0
    from kit.experiments.parallel import pipeline_bubble as pb
    monkeypatch.setattr(pb.dist, "get_world_size", lambda: 2)  # refused before any message is sent
    with pytest.raises(ValueError, match="multiple of the 2 ranks"):
        pb.pipeline_bubble(micro_batches=1, virtual=2)


@pytest.mark.parametrize("backend", ["nccl", "cuda:nccl"])
def test_pipeline_benches_on_nccl_ranks_say_to_use_cpu_ranks(monkeypatch: pytest.MonkeyPatch, backend: str) -> None:
    """The bubble and p2p benches send CPU layers' activations over gloo: on NCCL ranks (named either way torch
    allows) they say to run on CPU ranks, before torch's "No backend type associated with device type cpu"."""
    from kit.experiments.parallel import pipeline_bubble as pb
    monkeypatch.setattr(pb.dist, "is_initialized", lambda: True)
    monkeypatch.setattr(pb.dist, "get_backend", lambda group=None: backend)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)  # no GPU here: the rank's device is all it asks
    for bench in (lambda: pb.pipeline_bubble(micro_batches=4), pb.p2p_overhead):
        with pytest.raises(RuntimeError, match="Run it on CPU ranks"):
            bench()
