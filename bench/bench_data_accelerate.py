"""A dataset larger than memory through np.memmap, and Accelerate against DDP, measured in one run on 2
gloo ranks:

    python bench/bench_data_accelerate.py                       # both parts
    python bench/bench_data_accelerate.py --only memmap --size-mb 1536 --budget-mb 2048
    python bench/bench_data_accelerate.py --only accelerate --json out.json

1. memmap: `memmap_benchmark(size_mb)`: per-rank peak RSS/PSS above the rank's level before the
   data was opened, against the file size; cold vs warm epoch; num_workers 0 and 2; the
   in-memory copy beside it when it fits (`--no-copy` for the Binder case: file over budget).
2. accelerate vs ddp: `compare(ddp, accelerate)` (interleaved pairs, median step time per run)
   on the default MLP, and both records' phase medians. Accelerate's step carries one extra
   collective (gather_for_metrics of per-sample losses); its phase is shown on its own.
The load average is printed: on a shared 2-core box differences under ~15% are noise.
"""
from __future__ import annotations

import argparse
import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from kit.experiments import ExperimentConfig, compare  # noqa: E402
from kit.experiments import shutdown  # noqa: E402
from kit.experiments import memmap_benchmark  # noqa: E402


def _load() -> str:
    return " ".join(f"{x:.1f}" for x in os.getloadavg())


def bench_memmap(size_mb: float, budget_mb: float | None, copy: bool) -> dict:
    rec = memmap_benchmark(size_mb=size_mb, batch_size=256, num_workers=(0, 2), in_memory=copy,
                           budget_mb=budget_mb)
    f = rec["file"]
    print(f"\nmemmap: file {f['mib']:.0f} MiB ({f['samples']} samples x {f['sample_bytes']} B) on {f['fs_type']}, "
          f"written in {f['write_s']:.1f} s; load {_load()}")
    print(f"{'config':26s} {'rank':>4s} {'peak RSS':>9s} {'peak PSS':>9s} {'+RSS':>8s} {'+PSS':>8s}   "
          "epoch samples/s (cached before)")
    for r in rec["runs"]:
        eps = "  ".join(f"e{e['epoch']} {e['samples_per_s']:.0f} ({100 * (e['cached_before'] or 0):.0f}%)"
                        for e in r["epochs"])
        for p in r["per_rank"]:
            print(f"{r['label']:26s} {p['rank']:4d} {p['peak_rss_mib']:9.0f} {p['peak_pss_mib']:9.0f} "
                  f"{p['extra_rss_mib']:8.0f} {p['extra_pss_mib']:8.0f}   {eps if p['rank'] == 0 else ''}")
        print(f"{'':26s} sum  {'':9s} {'':9s} {r['sum_extra_rss_mib']:8.0f} {r['sum_extra_pss_mib']:8.0f}   "
              f"warm/cold {r['warm_over_cold'] or 0:.2f}x")
    return rec


def bench_accelerate(repeats: int, size: str) -> dict:
    a, b = ExperimentConfig(strategy="ddp", model_size=size), ExperimentConfig(strategy="accelerate", model_size=size)
    print(f"\naccelerate vs ddp (mlp {size}, bs32/rank, 2 gloo ranks), load before {_load()}")
    res = compare(a, b, repeats=repeats)
    print(res["summary"], f"; load after {_load()}")
    for side in ("a", "b"):
        rec = res[side]
        sp = rec["spread"]
        parts = "  ".join(f"{k} {sp[k]['median']:.2f}" for k in ("fwd_ms", "bwd_ms", "opt_ms", "comm_ms",
                                                                 "comm_exposed_ms") if k in sp)
        g = sorted(x for r in [rec] for x in (rec["comm"].get("report") or {}).get("gather_for_metrics_ms_by_step", []))
        extra = f"  gather_for_metrics median {g[len(g) // 2]:.2f} (last repeat)" if g else ""
        print(f"  {rec['label']:40s} step median {sp['step_ms']['median']:.2f} ms  {parts}{extra}")
    return {k: res[k] for k in ("summary", "ratio", "ci_low", "ci_high", "verdict", "pairs")}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--only", choices=("memmap", "accelerate"))
    ap.add_argument("--size-mb", type=float, default=512.0)
    ap.add_argument("--budget-mb", type=float, default=None)
    ap.add_argument("--no-copy", action="store_true", help="skip the in-memory copy (file over budget)")
    ap.add_argument("--repeats", type=int, default=6)
    ap.add_argument("--model-size", default="small", choices=("tiny", "small", "base"))
    ap.add_argument("--json")
    args = ap.parse_args()
    out: dict = {}
    try:
        if args.only in (None, "memmap"):
            out["memmap"] = bench_memmap(args.size_mb, args.budget_mb, not args.no_copy)
        if args.only in (None, "accelerate"):
            out["accelerate"] = bench_accelerate(args.repeats, args.model_size)
    finally:
        shutdown()
    if args.json:
        with open(args.json, "w") as f:
            json.dump(out, f)


if __name__ == "__main__":
    main()
