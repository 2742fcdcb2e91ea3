"""Instrumentation overhead: phase timers, comm hook stamps and memory accounting on vs off.

    python bench/bench_instrumentation.py

One process group (2 gloo ranks), runs alternating on/off so both see the same machine noise;
reports the median step time of each and their ratio (target <= 1.03). "off" keeps DDP's
built-in C++ all-reduce (no Python comm hook, no grad hooks): the uninstrumented baseline.
"""
from __future__ import annotations

import statistics

from kit.experiments import ExperimentConfig
from kit.experiments.harness.local import run_each
from kit.experiments import merge

PAIRS = 6


def main() -> None:
    for workload in ("mlp", "gpt"):
        base = ExperimentConfig(workload=workload, steps=15, warmup_steps=3)
        cfgs = [base.replace(instrument=flag) for _ in range(PAIRS) for flag in (False, True)]
        per_rank = run_each("kit.experiments.runner:run_rank", 2, [(c.to_dict(),) for c in cfgs])
        ms = {False: [], True: []}
        for i, c in enumerate(cfgs):
            ms[c.instrument].append(merge({r: per_rank[r][i] for r in per_rank}, c)["summary"]["step_ms"])
        off, on = statistics.median(ms[False]), statistics.median(ms[True])
        print(f"{workload}: step ms off {off:7.2f}  on {on:7.2f}  ratio on/off = {on / off:.3f} (target <= 1.03)"
              f"   off runs {[round(x, 1) for x in ms[False]]}  on runs {[round(x, 1) for x in ms[True]]}")


if __name__ == "__main__":
    main()
