"""Sharding and compression against DDP on the same workload: step time and bytes per step.

    python bench/bench_beyond.py [--reps 3] [--steps 8] [--size small]
    python bench/bench_beyond.py --ps        # parameter server at 2, 3, 4 ranks

One spawn of 2 gloo ranks; configs interleaved round-robin (ddp, zero1, fsdp, ..., ddp, ...)
so machine noise falls on all of them alike. Per config: step time as a ratio to the DDP run
of the same round, median (min-max) over rounds; payload bytes per step and predicted wire
bytes per rank (record.comm.report, labelled predicted); measured memory per rank beside the
ZeRO formula. On a shared 2-core box, differences under ~15 % are noise.
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

CASES = {
    "ddp": dict(strategy="ddp"),
    "zero1": dict(strategy="zero1"),
    "fsdp zero3": dict(strategy="fsdp"),
    "fsdp zero2-like": dict(strategy="fsdp", reshard_after_forward=False),
    "ddp fp16": dict(strategy="ddp", compression="fp16"),
    "ddp powersgd r4": dict(strategy="ddp", compression="powersgd", powersgd_rank=4, start_powerSGD_iter=2),
}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--steps", type=int, default=8)
    ap.add_argument("--size", default="small")
    a = ap.parse_args()
    from kit.experiments import ExperimentConfig
    from kit.experiments.harness.local import run_each
    from kit.experiments import merge
    base = dict(workload="mlp", model_size=a.size, batch_size=32, steps=a.steps, warmup_steps=3)
    names = list(CASES)
    cfgs = [ExperimentConfig(**base, **CASES[n]) for _ in range(a.reps) for n in names]
    res = run_each("kit.experiments.runner:run_rank", 2, [(c.to_dict(),) for c in cfgs])
    recs = [merge({r: res[r][i] for r in res}, c) for i, c in enumerate(cfgs)]
    mib = 2**20
    print(f"mlp {a.size}, bs32/rank, 2 gloo ranks, {a.steps} steps x {a.reps} rounds, loadavg "
          f"{os.getloadavg()[0]:.1f}")
    print(f"{'config':<17} {'step ms':>20} {'vs ddp':>20} {'payload MiB':>11} {'x ddp':>6} "
          f"{'wire/rank MiB (pred)':>20} {'p/g/o MiB measured':>20} {'ZeRO formula':>16} loss")
    for j, n in enumerate(names):
        rows = [recs[k * len(names) + j] for k in range(a.reps)]
        ddp = [recs[k * len(names)] for k in range(a.reps)]
        ms = [r["summary"]["step_ms"] for r in rows]
        ratio = [r["summary"]["step_ms"] / d["summary"]["step_ms"] for r, d in zip(rows, ddp)]
        r0, m = rows[0], rows[0]["memory"][0]
        nbytes = r0["summary"]["bytes_per_step"]
        rep = r0["comm"].get("report")
        wire = rep["wire_bytes_per_rank"] if rep else nbytes  # ddp: 2(N-1)/N*S = S at N=2
        pred = m.get("predicted", {})
        print(f"{n:<17} {statistics.median(ms):7.1f} ({min(ms):.0f}-{max(ms):.0f}) n={len(ms)}"
              f" {statistics.median(ratio):6.2f}x ({min(ratio):.2f}-{max(ratio):.2f})"
              f" {nbytes / mib:11.2f} {nbytes / ddp[0]['summary']['bytes_per_step']:6.3f}"
              f" {wire / mib:20.2f} {m['params_mib']:6.1f}/{m['grads_mib']:.1f}/{m['optimizer_mib']:.1f}"
              f"      {pred.get('params_mib', 0):5.1f}/{pred.get('grads_mib', 0):.1f}/{pred.get('optimizer_mib', 0):.1f}"
              f" {r0['summary']['loss_final']:.4f}")
    losses = {n: [round(r["loss"], 4) for r in recs[len(names) * (a.reps - 1) + j]["steps"] if r["rank"] == 0]
              for j, n in enumerate(names)}
    print("loss per timed step (last round, rank 0):")
    for n in ("ddp", "ddp fp16", "ddp powersgd r4"):
        print(f"  {n:<17} {losses[n]}")
    print("grads measured include DDP's bucket copy (gradient_as_bucket_view=False); zero1's "
          "optimizer shard is uneven (whole tensors per rank); fsdp's gathered params between fwd "
          "and bwd are in memory[i]['gathered_params_after_forward_mib'], not in these bars")


def param_server(steps: int, sizes: tuple[int, ...] = (2, 3, 4)) -> None:
    """Server ingress as workers are added, beside a ring's per-rank bytes; sync vs async."""
    from kit.experiments import ExperimentConfig
    from kit.experiments.harness.local import run_each
    from kit.experiments import merge
    from kit.experiments import ring_factor
    mib = 2**20
    print(f"\nparam_server, mlp small, bs32/worker, {steps} steps, loadavg {os.getloadavg()[0]:.1f}")
    print(f"{'ranks':>5} {'config':<50} {'step ms':>8} {'updates/s':>9} {'ingress MiB/step':>16} "
          f"{'ring MiB/rank':>13} {'staleness':<24} loss")
    for n in sizes:
        base = dict(workload="mlp", model_size="small", batch_size=32, steps=steps, warmup_steps=2, world_size=n)
        cfgs = [ExperimentConfig(**base, strategy="ddp")] + [
            ExperimentConfig(**base, strategy="param_server", **kw)
            for kw in (dict(ps_mode="sync"), dict(ps_mode="async"),
                       dict(ps_mode="sync", straggler_ms=100.0), dict(ps_mode="async", straggler_ms=100.0))]
        res = run_each("kit.experiments.runner:run_rank", n, [(c.to_dict(),) for c in cfgs], threads_per_rank=1)
        for i, c in enumerate(cfgs):
            rec = merge({r: res[r][i] for r in res}, c)
            s, rep = rec["summary"], rec["comm"].get("report") or {}
            ring = ring_factor("all_reduce", n) * s["bytes_per_step"] if c.strategy == "ddp" else \
                rep["predicted"]["ring_all_reduce_bytes_per_rank"]
            print(f"{n:>5} {c.label():<50} {s['step_ms']:8.1f} {rep.get('updates_per_s', 0):9.1f} "
                  f"{rep.get('server_ingress_bytes_per_step', 0) / mib:16.1f} {ring / mib:13.1f} "
                  f"{str(rep.get('staleness_histogram', '-')):<24} {s['loss_final']:.4f}")


if __name__ == "__main__":
    if "--ps" in sys.argv:
        param_server(int(os.environ.get("PS_STEPS", "6")))
    else:
        main()
