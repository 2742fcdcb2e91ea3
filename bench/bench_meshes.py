"""The four meshes through the run loop on 4 gloo ranks, one run each, beside one process.

    python bench/bench_meshes.py [--model-size small] [--steps 5] [--json out.json]

For `strategy="tp", mesh={"dp": 2, "tp": 2}`, `mesh={"fsdp": 2, "tp": 2}`,
`strategy="pipeline", mesh={"pp": 2, "dp": 2}` and HSDP, `strategy="fsdp", mesh={"dp": 2, "fsdp": 2}`
(kit.experiments.run on one 4-rank cluster, the gpt workload), prints per mesh dimension and
collective kind the bytes counted at the calls over the formula's (rank 0, per step; 1.00 = the
formula counts every collective) and their measured time, the strategy's check against one process
(max |weight difference| on a small GPT after 3 SGD steps) and the largest |loss difference| from
the `single` strategy on the same batches (HSDP's batch_size is each rank's, as fsdp's: its `single`
reads the 4 ranks' batches at once), parameters per rank measured
over the formula, each rank's PSS and their sum (Binder gives 2 GB), and the median step. Step
times are noisy on a shared machine (the load average is printed); the rest is exact.
"""
from __future__ import annotations

import argparse
import json
import os
import pathlib

from kit.engine.cluster import Cluster
from kit.experiments import ExperimentConfig, run
from kit.experiments.choices import GLOBAL_BATCH

MESHES = [dict(strategy="tp", mesh={"dp": 2, "tp": 2}), dict(strategy="tp", mesh={"fsdp": 2, "tp": 2}),
          dict(strategy="pipeline", mesh={"pp": 2, "dp": 2}, micro_batches=2),
          dict(strategy="fsdp", mesh={"dp": 2, "fsdp": 2})]  # HSDP


def _lines(rec: dict, single: dict) -> list[str]:
    rep = rec["comm"]["report"]
    out = [f"{rec['label']}: median step {rec['spread']['step_ms']['median']:.0f} ms"]
    for kind, m in rep["measured_per_step"].items():
        p = rep["predicted_per_step"][kind]
        out.append(f"  {kind:22s} {m['calls']:4d} calls {m['payload_bytes'] / 2**10:9.1f} KiB, "
                   f"measured/predicted {m['payload_bytes'] / p['payload_bytes']:.2f} ({m['ms']:.1f} ms)")
    ref = {r["step"]: r["loss"] for r in single["steps"]}
    loss = max(abs(r["loss"] - ref[r["step"]]) for r in rec["steps"])
    out.append(f"  vs one process: check (small GPT) max |weight diff| "
               f"{rep['check_vs_one_process']['diffs']['weights']:.1e}; max |loss diff| from `single` {loss:.1e}")
    mem = rec["memory"]
    out.append("  params per rank MiB (measured/predicted): " + ", ".join(
        f"{m['params_mib']:.3f}/{m['by_kind']['params_mib']['predicted_mib']:.3f}" for m in mem))
    act = [m["by_kind"]["activations_mib"]["measured_over_predicted"] for m in mem]
    out.append("  activations per rank measured/predicted: "
               + ", ".join("not predicted" if a is None else f"{a:.3f}" for a in act))
    pss = [m["mesh"]["pss_mib"] for m in mem]
    if None not in pss:
        out.append(f"  PSS per rank MiB: {[round(p) for p in pss]}, sum {sum(pss):.0f} MiB")
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model-size", default="small")
    ap.add_argument("--steps", type=int, default=5)
    ap.add_argument("--json", help="also write the lines to this file")
    a = ap.parse_args()
    base = dict(workload="gpt", world_size=4, batch_size=8, steps=a.steps, warmup_steps=2, model_size=a.model_size)
    out = [f"load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores"]
    with Cluster(world_size=4) as c:
        single = {b: run(ExperimentConfig(**{**base, "strategy": "single", "world_size": 1, "batch_size": b}),
                         cluster=c) for b in (base["batch_size"], 4 * base["batch_size"])}
        for kw in MESHES:
            # batch_size is each rank's outside GLOBAL_BATCH (HSDP): one process reads world_size times it
            batch = base["batch_size"] * (1 if kw["strategy"] in GLOBAL_BATCH else 4)
            out += _lines(run(ExperimentConfig(**{**base, **kw}), cluster=c), single[batch])
    out.append(f"load average {os.getloadavg()[0]:.1f} at the end")
    print("\n".join(out))
    if a.json:
        pathlib.Path(a.json).write_text(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
