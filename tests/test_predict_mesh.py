"""predict() on a mesh run's record: each dimension's collectives on its own group as the ranks grow.

Synthetic records with exact counts and times (no measurement): the dimensions that split the model
keep their size (tp's all-reduces stay on t ranks, HSDP's shards on s), the data dimension grows to
p / (the others' product), and options the mesh model does not take are refused with what to do.
"""
from __future__ import annotations

from typing import Any

import pytest

from kit.experiments.theory.predict_comm import collective_ms, resolve_link
from kit.experiments.theory.prediction import predict

MIB = 2**20
LINK = (0.0, 1.0)  # alpha 0, 1 GB/s
CHAIN = resolve_link(LINK)


def mesh_record(strategy: str, mesh: dict[str, int], rows: dict[str, tuple[int, float, float]],
                step_ms: float = 50.0, samples: float = 8.0) -> dict[str, Any]:
    """A kit.run/2-shaped mesh record: rows are "<dim>/<kind>": (calls, payload bytes, ms) per step."""
    med = {"median": step_ms, "q1": step_ms, "q3": step_ms, "iqr": 0.0, "min": step_ms, "max": step_ms, "n": 5}
    world = 1
    for v in mesh.values():
        world *= v
    return {"schema": "kit.run/2", "run_id": "synthetic", "label": f"synthetic {mesh}",
            "config": {"strategy": strategy, "workload": "gpt", "world_size": world, "batch_size": 8,
                       "mesh": mesh},
            "env": {"device_type": "cpu", "threads_per_rank": 1}, "steps": [{"step": 0, "rank": 0}],
            "summary": {"step_ms": step_ms, "throughput_samples_s": samples * 1e3 / step_ms},
            "spread": {"step_ms": med},
            "comm": {"report": {"measured_per_step": {
                k: {"calls": c, "payload_bytes": b, "wire_bytes": b, "ms": ms} for k, (c, b, ms) in rows.items()}}},
            "memory": [{"rank": 0, "params_mib": 4.0, "grads_mib": 4.0, "optimizer_mib": 8.0, "activations_mib": 1.0}],
            "timeline": []}


def test_tp_keeps_its_size_while_dp_grows() -> None:
    tp_bytes, grad_bytes = 12 * 64 * 1024, 4 * MIB
    rec = mesh_record("tp", {"dp": 2, "tp": 2}, {"tp/all_reduce": (12, tp_bytes, 10.0),
                                                  "dp/all_reduce": (1, grad_bytes, 5.0)})
    pred = predict(rec, ranks=[1, 3, 4, 8, 64], link=LINK)
    assert pred["ranks"] == [2, 4, 8, 64] and pred["grows"] == "dp"  # multiples of t = 2, from t
    tp_ms = 12 * collective_ms("all_reduce", CHAIN, tp_bytes / 12, 2)
    for pt in pred["points"]:
        d = pt["ranks"] // 2
        assert pt["mesh"] == {"dp": d, "tp": 2}
        by = pt["comm_ms_by_collective"]
        assert by["tp/all_reduce"] == pytest.approx(tp_ms)  # on t ranks at every size
        assert by["dp/all_reduce"] == pytest.approx(collective_ms("all_reduce", CHAIN, grad_bytes, d))
        assert pt["step_ms"] == pytest.approx(50.0 - 15.0 + tp_ms + by["dp/all_reduce"])
        assert pt["comm_exposed_ms"] == pytest.approx(pt["comm_ms"]) and pt["comm_overlap_ms"] == 0
        assert pt["throughput_samples_s"] == pytest.approx(8.0 * d / 2 * 1e3 / pt["step_ms"])  # weak scaling
        assert pt["memory_mib"]["params_mib"] == pytest.approx(4.0)  # dp replicates
    first = pred["points"][0]
    assert first["comm_ms_by_collective"]["dp/all_reduce"] == 0 and first["efficiency"] == pytest.approx(1.0)
    assert pred["points"][-1]["efficiency"] < 1.0 and "mesh" in pred["formulas"] and "mesh" in pred["label"]
    assert any("mesh" in w for w in pred["weakest"])


def test_fsdp_beside_tp_grows_and_shards_the_model_over_more_ranks() -> None:
    rec = mesh_record("tp", {"fsdp": 2, "tp": 2}, {"tp/all_reduce": (12, 1e6, 10.0),
                                                    "fsdp/all_gather": (10, 4e6, 5.0),
                                                    "fsdp/reduce_scatter": (5, 2e6, 3.0)})
    pred = predict(rec, ranks=[4, 16], link=LINK)
    assert pred["grows"] == "fsdp"
    small, big = pred["points"][-2:]
    assert big["mesh"] == {"fsdp": 8, "tp": 2}
    assert big["comm_ms_by_collective"]["tp/all_reduce"] == pytest.approx(small["comm_ms_by_collective"]["tp/all_reduce"])
    assert big["comm_ms_by_collective"]["fsdp/all_gather"] == pytest.approx(
        10 * collective_ms("all_gather", CHAIN, 4e5, 8))
    assert big["memory_mib"]["params_mib"] == pytest.approx(4.0 * 2 / 8)  # 1/d of the tp shard
    assert big["memory_mib"]["activations_mib"] == pytest.approx(1.0)


def test_hsdp_adds_replicas_and_keeps_its_shards() -> None:
    rec = mesh_record("fsdp", {"dp": 2, "fsdp": 2}, {"dp/all_reduce": (5, 1e6, 4.0),
                                                      "fsdp/all_gather": (10, 4e6, 5.0),
                                                      "fsdp/reduce_scatter": (5, 2e6, 3.0)})
    pts = predict(rec, ranks=[2, 32], link=LINK)["points"]
    assert [p["ranks"] for p in pts] == [2, 32] and pts[-1]["mesh"] == {"dp": 16, "fsdp": 2}
    assert pts[0]["comm_ms_by_collective"]["fsdp/all_gather"] == pytest.approx(
        pts[-1]["comm_ms_by_collective"]["fsdp/all_gather"])
    assert pts[-1]["comm_ms_by_collective"]["dp/all_reduce"] == pytest.approx(
        5 * collective_ms("all_reduce", CHAIN, 2e5, 16))
    assert pts[-1]["memory_mib"]["params_mib"] == pytest.approx(4.0)  # the shards stay 1/s


def test_pipeline_mesh_sends_cost_one_message_each() -> None:
    rec = mesh_record("pipeline", {"pp": 2, "dp": 2}, {"pp/send": (2, 64 * 1024, 0.2), "dp/all_reduce": (1, 1e6, 3.0)})
    pt = predict(rec, ranks=[8], link=LINK)["points"][-1]
    assert pt["comm_ms_by_collective"]["pp/send"] == pytest.approx(2 * 32 * 1024 / 1e9 * 1e3)


@pytest.mark.parametrize("kw,word", [(dict(strategy="ddp"), "strategy"), (dict(accelerator="h100"), "accelerator"),
                                     (dict(batch="global"), "batch"), (dict(compression=2.0), "compression")])
def test_options_the_mesh_model_does_not_take_are_refused_with_what_to_do(kw: dict, word: str) -> None:
    rec = mesh_record("tp", {"dp": 2, "tp": 2}, {"tp/all_reduce": (12, 1e6, 10.0), "dp/all_reduce": (1, 1e6, 5.0)})
    with pytest.raises(ValueError) as e:
        predict(rec, **kw)
    assert word in str(e.value) and "own mesh" in str(e.value) and "one-dimensional run" in str(e.value)


def test_a_mesh_record_without_counts_says_what_to_give() -> None:
    rec = mesh_record("tp", {"dp": 2, "tp": 2}, {})
    with pytest.raises(ValueError, match="comm.report.measured_per_step"):
        predict(rec)


def test_the_lab_benchs_prediction_plot_predicts_a_mesh_run_on_its_mesh() -> None:
    pytest.importorskip("matplotlib")
    from kit.plots.predicted import last_run_prediction
    rec = mesh_record("fsdp", {"dp": 2, "fsdp": 2}, {"dp/all_reduce": (5, 1e6, 4.0), "fsdp/all_gather": (10, 4e6, 5.0)})
    fig = last_run_prediction([rec])
    assert "mesh dp2 x fsdp2" in fig._suptitle.get_text()


def test_the_non_communication_time_comes_from_each_timed_step_itself() -> None:
    """Rank 0's timed steps each kept 40 ms outside the collectives; the median step (60) less the last step's
    collectives (60) would keep none. The model takes the median of each step's own difference."""
    rec = mesh_record("tp", {"dp": 2, "tp": 2}, {"tp/all_reduce": (12, 12 * 64 * 1024, 30.0),
                                                  "dp/all_reduce": (1, 4 * MIB, 30.0)}, step_ms=60.0)
    rec["steps"] = [{"step": i, "rank": r, "step_ms": st, "comm_ms": c}
                    for i, (st, c) in enumerate(((100.0, 60.0), (50.0, 10.0), (60.0, 20.0))) for r in (0, 1)]
    rec["steps"][1]["comm_ms"] = 0.0  # rank 1's steps are not rank 0's: left out
    pred = predict(rec, ranks=[4], link=LINK)
    assert pred["inputs"]["other_ms"] == pytest.approx(40.0)
    assert "median over rank 0's measured steps" in pred["inputs"]["how"]
    pt = pred["points"][-1]
    assert pt["step_ms"] == pytest.approx(40.0 + pt["comm_ms"])


def test_rank_counts_the_mesh_cannot_have_are_refused_when_none_is_left() -> None:
    """ranks=[3] on a mesh keeping tp=2 returned only the 2-rank baseline nobody asked for; now it says why."""
    rec = mesh_record("tp", {"dp": 2, "tp": 2}, {"tp/all_reduce": (12, 12 * 64 * 1024, 10.0),
                                                  "dp/all_reduce": (1, 4 * MIB, 5.0)})
    with pytest.raises(ValueError, match=r"multiples of 2; ask for some of \[2, 4, 8, 16\]"):
        predict(rec, ranks=[3, 5], link=LINK)
    assert predict(rec, ranks=[3, 8], link=LINK)["ranks"] == [2, 8]  # one possible: the others dropped, as documented
