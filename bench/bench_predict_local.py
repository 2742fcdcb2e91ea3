"""The planner's time model (theory/layout_time.step_time) on this machine: predicted beside measured.

    python bench/bench_predict_local.py [--ranks 2,4] [--repeats 3] [--steps 8] [--micro 1,2,4,8,16]
                                        [--json out.json] [--plot bubble.png]

Per world size: the kit's ddp, fsdp, tp, pipeline (GPipe, m = 4) and cp runs of the gpt workload (batch
32), one thread per rank. Every repeat first measures this machine (kit/experiments/measure/calibrate.py:
the matmul rate and per-op cost with every rank computing, a copy's bandwidth; the collective benchmark's
gloo all_reduce alpha-beta fit), then runs the five strategies in a rotated order (interleaved repeats:
a busy spell lands on different strategies each time) and predicts each from that repeat's numbers. Prints
the medians, the spread over repeats (min-max), the error, and per strategy the part whose prediction is
furthest off (compute, exposed comm, optimizer, other), with what the model leaves out there.

Then lesson 05's bubble (p = 2, the mlp workload, batch 64, GPipe): measured at each m beside the formula
(p-1)/(m+p-1) and the same model with each message's measured cost (theory/local_time.modelled_bubble:
matmul rate and per-op cost for the stages; per hand-off three measurements of a message's cost: a blocked
rank's hand-off, gloo's benchmark alpha-beta, and the 1F1B schedule run with zero compute, its span over its
2 (m + p - 1) hand-offs: emulated compute, real messages and the Python between them). Every number is
labelled measured or predicted; the load average is printed before and after (a shared machine).
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
from dataclasses import replace
from typing import Any

from kit.experiments.theory.local_time import (
    LOCAL_STRATEGIES, LocalMachine, mlp_stage_ms, modelled_bubble, predict_local,
)
from kit.experiments.benchmarks.local_check import FIT_SIZES, measure_machine, measured_parts
from kit.experiments.theory.bubble import predicted_bubble, split_min_max

GOAL_PCT = 25.0
HANDOFF_BYTES = 4096   # a small message: the hand-off's latency, its bytes negligible
LEFT_OUT = {
    "compute": "predicted: FLOPs at the calibrated matmul rate plus memory-bound elementwise bytes; the "
               "model does not see work a strategy adds beyond them (cp's ring attention runs its K/V chunks "
               "one by one in Python) nor each op's fixed cost",
    "comm": "predicted: every collective at gloo's benchmark alpha-beta; measured: the time in collectives, "
            "which ends when the last rank arrives: inside a step on shared cores the ranks arrive skewed (one "
            "was descheduled) and the model has no term for that wait",
    "opt": "memory bound at the copy bandwidth; the optimizer's per-tensor loop is not counted",
    "other": "the pipeline's idle stages (predicted: its bubble), data loading and the step's bookkeeping "
             "(not in the model)",
}


def _cluster(world_size: int) -> Any:
    """Fresh ranks, one thread each, no collective pre-flight (a round trip per collective)."""
    from kit.config import LaunchConfig
    from kit.engine.cluster import Cluster
    return Cluster(LaunchConfig(world_size=world_size, threads_per_rank=1, check_collectives=False)).start()


def _load() -> str:
    one, five, _ = os.getloadavg()
    return f"load average {one:.1f} (5 min {five:.1f}) on {os.cpu_count()} cores"


def _machine(c: Any, p: int) -> tuple[LocalMachine, dict[str, Any]]:
    m = measure_machine(c, FIT_SIZES)
    handoff_ms = c.call("kit.experiments.measure.calibrate:handoff_rank", [HANDOFF_BYTES])[0][HANDOFF_BYTES]
    return m, {"matmul_gflops": m.matmul_gflops, "op_us": m.op_us, "alpha_us": m.alpha_us, "gbps": m.gbps,
               "mem_gbps": m.mem_gbps, "handoff_ms": handoff_ms}


def strategies(p: int, repeats: int, steps: int) -> list[dict[str, Any]]:
    from kit.experiments import ExperimentConfig, run
    got: dict[str, list[tuple[dict, dict]]] = {s: [] for s in LOCAL_STRATEGIES}
    handoff_step: dict[str, list[float]] = {s: [] for s in LOCAL_STRATEGIES}
    machines = []
    c = _cluster(p)
    try:
        for rep in range(repeats):
            m, mrow = _machine(c, p)
            machines.append(mrow)
            order = LOCAL_STRATEGIES[rep % 5:] + LOCAL_STRATEGIES[:rep % 5]
            for s in order:
                cfg = ExperimentConfig(strategy=s, workload="gpt", world_size=p, batch_size=32, micro_batches=4,
                                       steps=steps, warmup_steps=2)
                rec = run(cfg, cluster=c)
                pred = predict_local(m, s, p, 32, 4)
                # the same model, the latency per ring step being a blocked rank's hand-off instead of the benchmark's
                woken = replace(m, alpha_us=max(m.alpha_us, 1e3 * mrow["handoff_ms"]))
                handoff_step[s].append(predict_local(woken, s, p, 32, 4)["step_ms"])
                comm = pred["tp_ms"] + pred["cp_exposed_ms"] + pred["pp_send_ms"] + pred["dp_ms"]
                got[s].append((measured_parts(rec), {"step": pred["step_ms"], "compute": pred["compute_ms"], "comm": comm,
                                             "opt": pred["opt_ms"], "other": pred["bubble_ms"]}))
    finally:
        c.shutdown()
    rows = []
    for s, pairs in got.items():
        med = lambda xs: statistics.median(xs)  # noqa: E731
        meas = {k: med([a[k] for a, _ in pairs]) for k in pairs[0][0]}
        pred = {k: med([b[k] for _, b in pairs]) for k in pairs[0][1]}
        spread = (min(a["step"] for a, _ in pairs), max(a["step"] for a, _ in pairs))
        err = 100 * (pred["step"] - meas["step"]) / meas["step"]
        worst = max(("compute", "comm", "opt", "other"), key=lambda k: abs(pred[k] - meas[k]))
        rows.append({"ranks": p, "strategy": s, "measured_step_ms": meas["step"], "measured_spread_ms": spread,
                     "predicted_step_ms": pred["step"], "error_pct": err, "measured": meas, "predicted": pred,
                     "furthest_off": worst, "machine": machines,
                     "predicted_handoff_step_ms": med(handoff_step[s]),
                     "error_handoff_pct": 100 * (med(handoff_step[s]) - meas["step"]) / meas["step"]})
    return rows


def bubbles(ms: list[int], repeats: int, steps: int) -> list[dict[str, Any]]:
    """Lesson 05's sweep: pipeline, mlp, batch 64, GPipe, p = 2; measured, the formula and the model."""
    from kit.experiments import ExperimentConfig, run
    from kit.experiments.choices import WORKLOAD_SIZES
    from kit.experiments.models import CLASSES, MLP_IN
    width, depth = WORKLOAD_SIZES["mlp"]["small"]
    dims = [MLP_IN] + [width] * depth
    shapes = list(zip(dims, dims[1:])) + [(width, CLASSES)]
    meas: dict[int, list[float]] = {m: [] for m in ms}
    preds: dict[int, list[tuple[float, float]]] = {m: [] for m in ms}
    hand: dict[int, list[tuple[float, float]]] = {m: [] for m in ms}
    hand_sched: dict[int, list[float]] = {m: [] for m in ms}
    sched: dict[int, list[float]] = {m: [] for m in ms}
    c = _cluster(2)
    try:
        for rep in range(repeats):
            mach, _ = _machine(c, 2)
            sizes = [64 // m * width * 4 for m in ms]
            cold = c.call("kit.experiments.measure.calibrate:handoff_rank", sizes)[0]
            for m in (ms[rep % len(ms):] + ms[:rep % len(ms)]):
                rec = run(ExperimentConfig(strategy="pipeline", workload="mlp", batch_size=64, micro_batches=m,
                                           steps=steps, warmup_steps=1), cluster=c)
                meas[m].append(float(rec["pipeline"]["measured"]))
                rows = 64 // m
                # the kit's stage split: min-max over the blocks' cost at the micro-batch (split_stages)
                block_ms = [sum(mlp_stage_ms([sh], rows, mach)) for sh in shapes]
                stage = [sum(block_ms[i] for i in blocks) for blocks in split_min_max(block_ms, 2)]
                fitted = mach.alpha_us * 1e-3 + rows * width * 4 / (mach.gbps * 1e6)
                msg_ms = cold[rows * width * 4]
                # the schedule's own hand-off: the same 1F1B loop with zero compute (every stage sleeps 0 ms;
                # emulated compute, real messages): its span is 2 (m + p - 1) hand-offs and the Python between them
                empty = c.call("kit.experiments.parallel.pipeline_bubble:pipeline_bubble", m, 1, 3, rows, width, 2, 1,
                               0.0)[0]
                sched_ms = statistics.median(empty["span_ms_per_step"]) / (2 * (m + 1))
                hand_sched[m].append(sched_ms)
                sched[m].append(modelled_bubble(stage, m, sched_ms))
                hand[m].append((fitted, msg_ms))
                preds[m].append((modelled_bubble(stage, m, msg_ms), modelled_bubble(stage, m, fitted)))
    finally:
        c.shutdown()
    return [{"micro_batches": m, "formula": predicted_bubble(2, m), "measured": statistics.median(meas[m]),
             "measured_spread": (min(meas[m]), max(meas[m])),
             "predicted": statistics.median(a for a, _ in preds[m]),
             "predicted_fitted_messages": statistics.median(b for _, b in preds[m]),
             "message_ms_fit": statistics.median(a for a, _ in hand[m]),
             "message_ms_handoff": statistics.median(b for _, b in hand[m]),
             "predicted_schedule_messages": statistics.median(sched[m]),
             "message_ms_schedule": statistics.median(hand_sched[m])} for m in ms]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--ranks", default="2,4")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--steps", type=int, default=8)
    ap.add_argument("--micro", default="1,2,4,8,16")
    ap.add_argument("--skip-strategies", action="store_true")
    ap.add_argument("--skip-bubble", action="store_true")
    ap.add_argument("--json")
    ap.add_argument("--plot", help="draw the bubble (formula, predicted, measured) to this png")
    a = ap.parse_args()
    out: dict[str, Any] = {"load_before": _load()}
    print(out["load_before"], flush=True)
    rows: list[dict[str, Any]] = []
    if not a.skip_strategies:
        for p in (int(x) for x in a.ranks.split(",")):
            rows += strategies(p, a.repeats, a.steps)
            print(f"{p} ranks done; {_load()}", flush=True)
        print(f"\nStep time, gpt batch 32, medians of {a.repeats} interleaved repeats ({a.steps} steps each); "
              f"ms; * = more ranks than cores")
        print("ranks strategy  measured [min-max]      predicted  error         furthest off (predicted vs measured "
              "ms)  | predicted, hand-off latency: step, error")
        for r in rows:
            k = r["furthest_off"]
            star = "*" if r["ranks"] > (os.cpu_count() or 1) else " "
            ok = "within" if abs(r["error_pct"]) <= GOAL_PCT else "OFF"
            lo, hi = r["measured_spread_ms"]
            print(f"{r['ranks']}{star}    {r['strategy']:9s} {r['measured_step_ms']:7.1f} [{lo:6.1f}-{hi:6.1f}]"
                  f"  {r['predicted_step_ms']:8.1f}  {r['error_pct']:+5.0f}% {ok:6s} {k}: "
                  f"{r['predicted'][k]:.1f} vs {r['measured'][k]:.1f}  | {r['predicted_handoff_step_ms']:.1f}, "
                  f"{r['error_handoff_pct']:+.0f}%")
            if ok == "OFF":
                print(f"{'':20s}{k}: {LEFT_OUT[k]}")
        for p in sorted({r["ranks"] for r in rows}):
            mach = next(r["machine"] for r in rows if r["ranks"] == p)
            print(f"machine, {p} ranks (measured, per repeat): " + "; ".join(
                f"{x['matmul_gflops']:.1f} GFLOP/s, op {x['op_us']:.0f} us, gloo {x['alpha_us']:.0f} us/step "
                f"{x['gbps']:.2f} GB/s, hand-off {x['handoff_ms']:.2f} ms, copy {x['mem_gbps']:.1f} GB/s" for x in mach))
    ms = [int(x) for x in a.micro.split(",")] if not a.skip_bubble else []
    bub = bubbles(ms, a.repeats, max(3, a.steps // 2)) if ms else []
    print(f"\nLesson 05's bubble, p = 2, mlp batch 64, GPipe (medians of {a.repeats} interleaved repeats)")
    print(" m  formula  predicted with each message's measured cost (ms): hand-off | benchmark fit | schedule "
          "without compute (emulated)   measured [min-max]")
    for b in bub:
        lo, hi = b["measured_spread"]
        print(f"{b['micro_batches']:2d}  {b['formula']:6.0%}   {b['predicted']:6.0%} ({b['message_ms_handoff']:5.2f})"
              f"   {b['predicted_fitted_messages']:6.0%} ({b['message_ms_fit']:5.2f})"
              f"   {b['predicted_schedule_messages']:6.0%} ({b['message_ms_schedule']:5.2f})"
              f"            {b['measured']:5.0%} [{lo:.0%}-{hi:.0%}]")
    out.update(load_after=_load(), strategies=rows, bubble=bub)
    print(out["load_after"])
    if a.plot:
        from kit.plots import bubble_model
        bubble_model(bub).savefig(a.plot, dpi=110, bbox_inches="tight")
    if a.json:
        with open(a.json, "w") as f:
            json.dump(out, f, indent=1, default=str)


if __name__ == "__main__":
    sys.exit(main())
