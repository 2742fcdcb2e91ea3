"""Tensor, sequence, context and expert parallelism, meshes and the pipeline bubble, in one run.

    python bench/bench_parallelisms.py [--quick] [--json out.json]

Prints, for each hand-written strategy (2 gloo ranks; meshes on 4): the bytes its collectives
carried per kind (counted at each call) over the formula's prediction (ratio 1.00 = the formula
counts every collective), the max |difference| from one process (weights after 3 SGD steps; ring
attention: output and q, k, v gradients), the causal work per rank of ring attention (contiguous
and zig-zag split), each rank's PSS on a 2x2 mesh, and the pipeline bubble at m = 1, 2, 4, 8, 16
without and with interleaving (v = 2 virtual stages per rank, interleaved 1F1B, m even) beside
(p-1)/(v m + p-1); bench/bench_pipeline_bubble.py measures it on larger ops with the per-op and
per-message overhead beside. Bubbles are timings: noisy on a shared machine (the load average is
printed); the rest is exact.
"""
from __future__ import annotations

import argparse
import json
import os
import sys

from kit.experiments.harness.local import run_each, run_local

TWO = [("tp", dict(impl="hand")), ("tp", dict(impl="torch")), ("sp", {}),
       ("ring_attention", dict(zigzag=False)), ("ring_attention", dict(zigzag=True)),
       ("ep", dict(capacity_factor=None)), ("ep", dict(capacity_factor=1.0))]
FOUR = [("ring_attention", dict(zigzag=False)), ("ring_attention", dict(zigzag=True)),
        ("mesh", dict(mesh={"dp": 2, "tp": 2})), ("mesh", dict(mesh={"fsdp": 2, "tp": 2})),
        ("mesh", dict(mesh={"pp": 2, "dp": 2}))]


def _label(name: str, kw: dict) -> str:
    return name + ("" if not kw else " " + " ".join(f"{k}={v}" for k, v in kw.items()))


def _row(name: str, kw: dict, got: dict) -> str:
    measured, predicted = got["bytes"]["measured"], got["bytes"]["predicted"]
    ratios = ", ".join(f"{k} {v['payload_bytes'] / predicted[k]['payload_bytes']:.2f}"
                       f" ({v['payload_bytes'] / 2**10:.0f} KiB, {v['calls']} calls)" for k, v in measured.items())
    diff = got["max_abs_diff"]
    return f"  {_label(name, kw):38s} max|diff| {diff:.1e}   bytes measured/predicted: {ratios}"


def checks(world: int, items: list) -> list[str]:
    res = run_local("kit.experiments.harness.checks:run_checks", world, items)
    lines = []
    for i, (name, kw) in enumerate(items):
        got = res[0][i]
        lines.append(_row(name, kw, got))
        if name == "ring_attention":
            lines.append(f"  {'':38s} causal score entries per rank: {got['score_entries_per_rank']}")
        if name == "ep":
            lines.append(f"  {'':38s} expert load (routed/kept/dropped): {got['load']}")
        if name == "mesh" and kw["mesh"] == {"dp": 2, "tp": 2}:
            pss = [res[r][i]["pss_mib"] for r in sorted(res)]
            lines.append(f"  {'':38s} PSS per rank (MiB): {[round(p) for p in pss]}, sum {sum(pss):.0f} MiB")
    return lines


def bubbles(quick: bool) -> list[str]:
    ms = (4, 8) if quick else (1, 2, 4, 8, 16)
    # interleaved 1F1B needs m a multiple of p = 2 (Megatron-LM); bench_pipeline_bubble.py says more
    items = [(m, v, 2 if quick else 3) for v in (1, 2) for m in ms if v == 1 or m % 2 == 0]
    res = run_each("kit.experiments.parallel.pipeline_bubble:pipeline_bubble", 2, items)
    lines = []
    for r in res[0]:
        d = 100 * (r["measured"] - r["formula"])
        lines.append(f"  p=2 m={r['micro_batches']:2d} v={r['virtual']}: measured {100 * r['measured']:5.1f}%  "
                     f"formula {100 * r['formula']:5.1f}%  difference {d:+5.1f} points  "
                     f"waiting in recv {100 * r['waiting']:5.1f}%  "
                     f"(steps {', '.join(f'{100 * b:.0f}' for b in r['measured_per_step'])})")
    return lines


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="m = 4, 8 only and fewer steps for the bubble")
    ap.add_argument("--json", help="also write the lines to this file")
    a = ap.parse_args()
    out = [f"load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores", "2 ranks:"]
    out += checks(2, TWO)
    out += ["4 ranks:"] + checks(4, FOUR)
    out += ["pipeline bubble (balanced stages, compute-bound micro-batches; v = virtual stages per rank):"]
    out += bubbles(a.quick)
    out.append(f"load average {os.getloadavg()[0]:.1f} at the end")
    print("\n".join(out))
    if a.json:
        with open(a.json, "w") as f:
            json.dump(out, f, indent=1)


if __name__ == "__main__":
    sys.exit(main())
