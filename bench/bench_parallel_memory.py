"""Memory per rank by kind for tp, sp, cp and ep through the run loop, measured over the formula.

    python bench/bench_parallel_memory.py [--no-mesh]

One run of each strategy (2 gloo ranks, gpt small, batch 8, 2 steps; tp also on a dp x tp = 2 x 2
mesh, 4 ranks): per rank and kind (parameters, gradients, Adam state, the whole forward's
activations) the bytes measured on the rank over theory/parallel_memory.py's prediction (1.000 =
the formula counts every byte); for ep also the activations over the balanced-routing formula and
the rows its experts received per layer. Bytes, not timings: the load does not change them.
"""
from __future__ import annotations

import os
import sys

from kit.experiments.config import ExperimentConfig
from kit.experiments.harness.local import run_each
from kit.experiments.records import merge

TINY = dict(workload="gpt", steps=2, warmup_steps=1, batch_size=8)
TWO = {"tp": dict(strategy="tp"), "sp": dict(strategy="sp"), "cp": dict(strategy="cp"),
       "ep E4 top2": dict(strategy="ep"), "ep E4 top1 cf0.5": dict(strategy="ep", top_k=1, capacity_factor=0.5)}
FOUR = {"tp mesh dp2 x tp2": dict(strategy="tp", world_size=4, mesh={"dp": 2, "tp": 2})}


def _lines(world: int, runs: dict[str, dict]) -> list[str]:
    cfgs = {name: ExperimentConfig(**kw, **TINY) for name, kw in runs.items()}
    per = run_each("kit.experiments.runner:run_rank", world, [(c.to_dict(),) for c in cfgs.values()])
    out = []
    for i, (name, cfg) in enumerate(cfgs.items()):
        for mem in merge({r: per[r][i] for r in per}, cfg)["memory"]:
            ratios = "  ".join(f"{k.removesuffix('_mib')} {v['measured_over_predicted']:.6f} "
                               f"({v['measured_mib']:.3f} MiB)" for k, v in mem["by_kind"].items())
            out.append(f"  {name:18s} rank {mem['rank']}: {ratios}")
            ep = mem.get("ep_activations")
            if ep:
                rows = [layer["received"] for layer in ep["per_layer_routing"]]
                out.append(f"  {'':18s}         activations / balanced routing {ep['measured_over_balanced']:.3f}; "
                           f"rows received per layer {rows}, capacity {ep['capacity']}")
    return out


def main() -> None:
    if any(arg not in ("--no-mesh",) for arg in sys.argv[1:]):
        sys.exit(__doc__)
    lines = [f"load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores",
             "measured / predicted per kind (theory/parallel_memory.py), 2 ranks:", *_lines(2, TWO)]
    if "--no-mesh" not in sys.argv:
        lines += ["4 ranks:", *_lines(4, FOUR)]
    print("\n".join(lines))


if __name__ == "__main__":
    sys.exit(main())
