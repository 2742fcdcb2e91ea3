"""Tensor, sequence, context and expert parallelism and meshes, each against one process.

Every check trains (or runs) the hand-written strategy on 2 or 4 gloo ranks and the same model
in one process inside each rank, from the same seed and batches, and returns the differences,
the bytes its collectives carried (counted at each call) and the bytes the formula predicts.
Tolerances: the strategies compute the same fp32 sums in another order (a matmul split in two
halves, then summed by an all-reduce), ~1e-7 relative per op; after 3 SGD steps (lr 0.1) the
weights agree to ~1e-7. A missing or doubled all-reduce changes a gradient by 100% (weights
by lr x |grad| ~ 1e-3) and the loss of the next step: both fail by orders of magnitude.
"""
from __future__ import annotations

import pytest

from kit.experiments.local import run_local

WALL_CLOCK_S = 600
TOL = 1e-5

TWO = [
    ("tp", dict(steps=3, impl="hand")),
    ("tp", dict(steps=3, impl="torch")),
]


@pytest.fixture(scope="module")
def two() -> dict[int, list[dict]]:
    return run_local("kit.experiments.strategies.checks:run_checks", 2, TWO)


def _same_on_every_rank(res: dict[int, list[dict]], i: int, key: str) -> None:
    assert len({repr(res[r][i][key]) for r in res}) == 1, f"{key} differs between ranks"


@pytest.mark.parametrize("i", [0, 1], ids=["hand", "torch"])
def test_tp_matches_one_process_and_the_byte_formula(two: dict, i: int) -> None:
    for r, res in two.items():
        got = res[i]
        assert got["loss_max_abs_diff"] < TOL and got["weights_max_abs_diff"] < TOL, got
        measured, predicted = got["bytes"]["measured"], got["bytes"]["predicted"]
        assert set(measured) == {"tp/all_reduce"}, measured  # Megatron: only all-reduces
        for k in ("calls", "payload_bytes", "wire_bytes"):
            assert measured["tp/all_reduce"][k] == predicted["tp/all_reduce"][k], (k, measured, predicted)
    _same_on_every_rank(two, i, "losses")


def test_tp_activations_split_over_t_as_predicted(two: dict) -> None:
    act = two[0][0]["activations"]
    assert act["measured_bytes_per_layer"] == act["predicted"]["bytes"]
    assert act["single_process_bytes_per_layer"] == act["predicted_one_process"]["bytes"]
    assert act["measured_bytes_per_layer"] < act["single_process_bytes_per_layer"]
