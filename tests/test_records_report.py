"""kit.experiments.bucket_report: lesson 03's two lines per DDP run, read from a hand-made record (the
function's input), so the test pins what a learner reads: the bucket sizes in reduce order, and the
all-reduce split into its hidden and exposed parts."""
from __future__ import annotations

from kit.experiments import bucket_report

MIB = 2**20


def ddp_record(bucket_bytes: list[int], cap_mb: float) -> dict:
    summary = {"step_ms": 61.4, "fwd_ms": 10.0, "bwd_ms": 30.2, "opt_ms": 5.0, "comm_ms": 24.6,
               "comm_overlap_ms": 9.5, "comm_exposed_ms": 15.1}
    return {"config": {"bucket_cap_mb": cap_mb}, "summary": summary, "steps": [],
            "comm": {"buckets": [{"index": i, "bytes": b} for i, b in enumerate(bucket_bytes)]}}


def test_bucket_report_lists_the_buckets_in_reduce_order_and_splits_the_all_reduce():
    four = [4 * MIB + 41_000, 4 * MIB + 4096, 4 * MIB + 4096, MIB + 4096]  # the mlp at cap 1, as DDP reduced them
    first, second = bucket_report(ddp_record(four, 1)).splitlines()
    assert first == "cap 1 MiB: 4 bucket(s), 4.04 + 4.00 + 4.00 + 1.00 MiB"
    assert second == "   step 61 ms, backward 30 ms; all-reduce 25 ms = 10 hidden + 15 exposed"


def test_bucket_report_of_one_bucket_and_a_fractional_cap():
    first = bucket_report(ddp_record([13_688_872], 0.25)).splitlines()[0]
    assert first == "cap 0.25 MiB: 1 bucket(s), 13.05 MiB"
