"""memmap_benchmark: a dataset file read through np.memmap + DistributedSampler on 2 gloo ranks.

Reference: torch's DistributedSampler itself. Each rank must read (from the file's content:
column 0 holds the sample index) exactly the samples its sampler names for that epoch, so
every sample is read once per epoch over the ranks and set_epoch moves samples between ranks.
Memory: the in-memory copy costs each rank a whole private copy (extra RSS >= 90% of the file);
through memmap the ranks' extra PSS together stays well below the in-memory copies' total.
The first epoch is cold (page-cache fraction from mincore after POSIX_FADV_DONTNEED), the
second warm.
"""
from __future__ import annotations

import json

import pytest

from kit.experiments.benchmarks.memmap_bench import MemmapBenchError, fs_type, memmap_benchmark

SIZE_MB = 32.0


@pytest.fixture(scope="module")
def record(cluster, tmp_path_factory) -> dict:
    d = str(tmp_path_factory.mktemp("memmap"))
    if fs_type(d) in ("tmpfs", "ramfs"):
        pytest.skip("the test's temp folder is on tmpfs: no cold epoch possible there")
    return memmap_benchmark(size_mb=SIZE_MB, batch_size=64, num_workers=(0, 2), directory=d, track_ids=True,
                            seed=5, cluster=cluster)


def test_record_is_json_and_complete(record: dict) -> None:
    json.dumps(record, allow_nan=False)
    assert [r["label"] for r in record["runs"]] == ["memmap, num_workers=0", "memmap, num_workers=2",
                                                    "in-memory copy"]
    assert record["file"]["mib"] == pytest.approx(SIZE_MB, rel=0.01)
    assert "POSIX_FADV_DONTNEED" in record["cold_method"]


def test_each_sample_once_per_epoch_as_the_sampler_says(record: dict) -> None:
    import torch
    from torch.utils.data import DistributedSampler
    n = record["file"]["samples"]
    for run in record["runs"]:
        assert run["coverage"] == {"each_sample_once_per_epoch": True, "rank0_set_changes_between_epochs": True}
        for rank, epochs in run["ids"].items():
            for e, ids in enumerate(epochs):
                ref = DistributedSampler(torch.arange(n), num_replicas=2, rank=int(rank), shuffle=True, seed=5)
                ref.set_epoch(e)
                assert sorted(ids) == sorted(ref), f"{run['label']} rank {rank} epoch {e}"


def test_memory_memmap_against_in_memory_copy(record: dict) -> None:
    mm, copy = record["runs"][0], record["runs"][2]
    file_mib = record["file"]["mib"]
    for r in copy["per_rank"]:  # np.load: every rank holds the whole file privately
        assert r["extra_rss_mib"] >= 0.9 * file_mib and r["extra_pss_mib"] >= 0.9 * file_mib
    assert mm["sum_extra_pss_mib"] < 0.8 * copy["sum_extra_pss_mib"]
    for r in mm["per_rank"]:  # a rank maps the file; it never holds more than the file's pages
        assert r["extra_rss_mib"] < 1.3 * file_mib


def test_first_epoch_cold_second_warm(record: dict) -> None:
    for run in record["runs"][:2]:
        cold, warm = run["epochs"][0], run["epochs"][1]
        assert cold["cold"] and not warm["cold"]
        if cold["cached_before"] is not None:  # mincore unavailable: the record says None
            assert cold["cached_before"] < 0.1 and warm["cached_before"] > 0.9


def test_plot_draws_the_record(record: dict) -> None:
    import matplotlib
    matplotlib.use("Agg")
    from kit.plots import memmap_memory
    fig = memmap_memory(record)
    mem, t = fig.axes
    assert len(mem.patches) == 6 and len(t.patches) == 6  # 3 configs x (RSS, PSS) and x 2 epochs


@pytest.mark.parametrize("kw, words", [
    (dict(size_mb=0), "size_mb=0 must be a number > 0"),
    (dict(epochs=1), "needs both"),
    (dict(num_workers=(0, -1)), "integers >= 0"),
    (dict(size_mb=0.001, sample_kib=4), "fewer than one sample"),
    (dict(size_mb=64, budget_mb=100), "in_memory=False"),
    (dict(directory="/dev/shm"), "lives in RAM"),
    (dict(directory="/nonexistent/dir"), "not a writable folder"),
])
def test_refusals(kw: dict, words: str) -> None:
    if kw.get("directory") == "/dev/shm" and fs_type("/dev/shm") != "tmpfs":
        pytest.skip("no tmpfs at /dev/shm here")
    with pytest.raises(MemmapBenchError, match=words):
        memmap_benchmark(**kw, cluster=object())  # refused before any rank is asked


def test_the_page_cache_share_before_each_epoch_reads_as_percent_per_epoch() -> None:
    """Lesson 09 printed `cached before: [(0.0, 1.0)]`: fractions without a unit or an epoch named, and a
    run whose share mincore could not measure (None) counted as 0."""
    from kit.experiments import cached_before_line

    def result(*pairs: tuple) -> dict:
        return {"runs": [{"epochs": [{"cached_before": c0}, {"cached_before": c1}]} for c0, c1 in pairs]}

    assert cached_before_line(result(*[(0.0, 1.0)] * 6)) == (
        "file's pages in the page cache as each epoch began, 6 runs: epoch 0 0%, epoch 1 100%")
    assert cached_before_line(result((0.0, 1.0), (0.004, 0.98), (None, 1.0))).endswith(
        ": epoch 0 0% (1 not measured), epoch 1 98-100%")
    assert cached_before_line(result((None, None))).endswith("1 run: epoch 0 not measured, epoch 1 not measured")
