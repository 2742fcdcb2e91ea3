"""The planner's time model (theory/layout_time.step_time) on this machine: predicted beside measured.

    python bench/bench_predict_local.py [--ranks 2,4] [--repeats 3] [--steps 8] [--micro 1,2,4,8,16]
                                        [--json out.json] [--plot bubble.png]

Per world size: the kit's ddp, fsdp, tp, pipeline (GPipe, m = 4) and cp runs of the gpt workload (batch
32), one thread per rank. Every repeat first measures this machine (kit/experiments/measure/calibrate.py:
the matmul rate and per-op cost with every rank computing, a copy's bandwidth, a blocking collective after
compute, a blocked rank's hand-off; the collective benchmark's gloo all_reduce alpha-beta fit), then runs
the five strategies in a rotated order (interleaved repeats: a busy spell lands on different strategies
each time) and predicts each from that repeat's numbers twice: "before", as the GPU planner assumes
(collectives overlap compute, alpha-beta only), and "after", with local_time's two CPU mechanisms (each
collective blocks the rank; each costs the measured blocking call). Prints the medians, the spread over
repeats (min-max), both errors, the part furthest off, then the pieces: compute per rank (and as a multiple
of ddp's in the same repeat, measured and predicted), the collectives' count, the time waiting for the last
rank to arrive and the rest, per call against the model's per call; for a strategy off by more than 25%,
which mechanism the model lacks there.

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
from typing import Any

from kit.experiments.theory.local_time import (
    LOCAL_STRATEGIES, LocalMachine, kit_gpt_spec, mlp_stage_ms, modelled_bubble, predict_local,
)
from kit.experiments.benchmarks.local_check import FIT_SIZES, blocking_calls, measure_machine, measured_parts
from kit.experiments.theory.bubble import predicted_bubble, split_min_max

GOAL_PCT = 25.0
COMPUTE_LEFT_OUT = {   # per strategy: what the compute's FLOPs at the measured rate do not see
    "fsdp": "FSDP2's own work around each of its 15 collectives (copy-in and copy-out of the flat buffers, "
            "its hooks), measured here as compute beyond ddp's for the same FLOPs",
    "cp": "cp's ring attention runs its K/V chunks op by op in Python (see the line below) and its recv "
          "waits fall inside compute",
    "tp": "each op's fixed cost: tp halves the FLOPs per rank, not the ops",
}
LEFT_OUT = {
    "compute": "predicted: FLOPs at the calibrated matmul rate plus memory-bound elementwise bytes; not each "
               "op's fixed cost, nor a rate that moved between the calibration and the run",
    "comm": "predicted: each collective at gloo's alpha-beta plus the measured blocking call; a count the model "
            "gets wrong (FSDP2 wraps the embedding and head as units of their own: the model prices one call "
            "per layer) or a busy spell between the probe and the run",
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


def _machine(c: Any) -> tuple[LocalMachine, dict[str, Any]]:
    m = measure_machine(c, FIT_SIZES)
    return m, {"matmul_gflops": m.matmul_gflops, "op_us": m.op_us, "alpha_us": m.alpha_us, "gbps": m.gbps,
               "mem_gbps": m.mem_gbps, "handoff_ms": m.handoff_us / 1e3, "call_ms": m.call_us / 1e3,
               "exchange_ms": m.exchange_us / 1e3,
               "load": os.getloadavg()[0]}


def _pred_parts(pred: dict[str, Any]) -> dict[str, float]:
    comm = pred["tp_ms"] + pred["cp_exposed_ms"] + pred["pp_send_ms"] + pred["dp_exposed_ms"]
    return {"step": pred["step_ms"], "compute": pred["compute_ms"], "comm": comm, "opt": pred["opt_ms"],
            "other": pred["bubble_ms"], "per_call": pred["per_call_ms"]}


def _ring_attention(rec: dict[str, Any], m: LocalMachine) -> tuple[float, float] | None:
    """cp only: its ring attention's forward chunk work per rank, measured (the strategy times the blocks,
    hops excluded), beside the same work's FLOPs at the measured matmul rate (Q K^T and P V: 4 head_dim
    FLOPs per kept score entry, per sequence and head), in ms."""
    work = ((rec.get("comm") or {}).get("report") or {}).get("attention_work")
    if not work:
        return None
    spec = kit_gpt_spec()
    flops = [e * 32 * spec.heads * 4 * spec.head_dim for e in work["score_entries_per_rank"]]
    return (statistics.mean(work["compute_ms_per_rank"]), statistics.mean(flops) / (m.matmul_gflops * 1e6))


def strategies(p: int, repeats: int, steps: int) -> list[dict[str, Any]]:
    """Per strategy: measured parts, the collectives' waits, and two predictions from the same measured inputs:
    `before` (collectives overlap compute, alpha-beta only: local_time without its two CPU mechanisms, blocking=False)
    and `after` (local_time's blocking collectives, each at the measured blocking call)."""
    from kit.experiments import ExperimentConfig, run
    got: dict[str, list[dict[str, Any]]] = {s: [] for s in LOCAL_STRATEGIES}
    machines = []
    c = _cluster(p)
    try:
        for rep in range(repeats):
            m, mrow = _machine(c)
            machines.append(mrow)
            for s in LOCAL_STRATEGIES[rep % 5:] + LOCAL_STRATEGIES[:rep % 5]:
                cfg = ExperimentConfig(strategy=s, workload="gpt", world_size=p, batch_size=32, micro_batches=4,
                                       steps=steps, warmup_steps=2)
                rec = run(cfg, cluster=c)
                got[s].append({"measured": measured_parts(rec), "calls": blocking_calls(rec),
                               "before": _pred_parts(predict_local(m, s, p, 32, 4, blocking=False)),
                               "after": _pred_parts(predict_local(m, s, p, 32, 4)),
                               "ring": _ring_attention(rec, m)})
    finally:
        c.shutdown()
    med = statistics.median
    ddp_compute = [g["measured"]["compute"] for g in got["ddp"]]
    rows = []
    for s, reps in got.items():
        row: dict[str, Any] = {"ranks": p, "strategy": s, "machine": machines}
        for k in ("measured", "before", "after"):
            row[k] = {part: med([g[k][part] for g in reps]) for part in reps[0][k]}
        row["measured_spread_ms"] = (min(g["measured"]["step"] for g in reps), max(g["measured"]["step"] for g in reps))
        rings = [g["ring"] for g in reps if g["ring"]]
        if rings:
            row["ring_attention_ms"] = {"measured": med([a for a, _ in rings]),
                                        "flops_at_rate": med([b for _, b in rings])}
        calls = [g["calls"] for g in reps]
        row["calls"] = {k: med([x[k] for x in calls]) for k in calls[0]}
        # per repeat, so the ratio compares runs that met the same load
        row["compute_vs_ddp"] = med([g["measured"]["compute"] / d for g, d in zip(reps, ddp_compute)])
        row["predicted_compute_vs_ddp"] = med([g["after"]["compute"] / d["after"]["compute"]
                                               for g, d in zip(reps, got["ddp"])])
        for k in ("before", "after"):
            row[f"error_{k}_pct"] = 100 * (row[k]["step"] / row["measured"]["step"] - 1)
        row["furthest_off"] = max(("compute", "comm", "opt", "other"),
                                  key=lambda k: abs(row["after"][k] - row["measured"][k]))
        rows.append(row)
    return rows


def _print_strategies(rows: list[dict[str, Any]], repeats: int, steps: int) -> None:
    print(f"\nStep time, gpt batch 32, medians of {repeats} interleaved repeats ({steps} steps each); ms; "
          "* = more ranks than cores; before: collectives overlap compute at gloo's alpha-beta (the GPU "
          "planner's assumptions); after: each blocks the rank and costs the measured blocking call")
    print("ranks strategy  measured [min-max]      before (error)    after (error)         furthest off after "
          "(predicted vs measured ms)")
    for r in rows:
        k = r["furthest_off"]
        star = "*" if r["ranks"] > (os.cpu_count() or 1) else " "
        ok = "within" if abs(r["error_after_pct"]) <= GOAL_PCT else "OFF"
        lo, hi = r["measured_spread_ms"]
        print(f"{r['ranks']}{star}    {r['strategy']:9s} {r['measured']['step']:7.1f} [{lo:6.1f}-{hi:6.1f}]"
              f"  {r['before']['step']:7.1f} ({r['error_before_pct']:+4.0f}%)  {r['after']['step']:7.1f} "
              f"({r['error_after_pct']:+4.0f}%) {ok:6s} {k}: {r['after'][k]:.1f} vs {r['measured'][k]:.1f}")
    print("\nThe pieces (medians over repeats; per rank, ms per step). Collectives: the timeline's blocking "
          "calls, each split into waiting for the last rank and the rest; predicted per call: the blocking "
          "all-reduce measured after compute (cp: the ring exchange; pipeline: the hand-off)")
    print("ranks strategy  compute meas/pred (x ddp's: meas, pred)  comm meas/pred  calls  wait  after-arrival"
          "  per call meas/pred")
    for r in rows:
        c, m, a = r["calls"], r["measured"], r["after"]
        per = (c["wait_ms"] + c["after_arrival_ms"]) / c["calls"] if c["calls"] else float("nan")
        print(f"{r['ranks']}     {r['strategy']:9s} {m['compute']:6.1f} / {a['compute']:6.1f}  "
              f"({r['compute_vs_ddp']:.2f}, {r['predicted_compute_vs_ddp']:.2f})       {m['comm']:6.1f} / "
              f"{a['comm']:6.1f}  {c['calls']:5.0f}  {c['wait_ms']:5.1f}  {c['after_arrival_ms']:6.1f}        "
              f"{per:5.2f} / {a['per_call']:5.2f}")
        if abs(r["error_after_pct"]) > GOAL_PCT:
            k = r["furthest_off"]
            why = COMPUTE_LEFT_OUT.get(r["strategy"], LEFT_OUT[k]) if k == "compute" else LEFT_OUT[k]
            print(f"{'':16s}off: {k}: {why}")
        if "ring_attention_ms" in r:
            ra = r["ring_attention_ms"]
            print(f"{'':16s}cp's ring attention, forward chunks per rank: {ra['measured']:.1f} ms measured, "
                  f"{ra['flops_at_rate']:.2f} ms its FLOPs at the measured rate (the model's view): the chunks run "
                  "op by op in Python (parallel/context.py), each op at its fixed cost")
    for p in sorted({r["ranks"] for r in rows}):
        mach = next(r["machine"] for r in rows if r["ranks"] == p)
        print(f"machine, {p} ranks (measured, per repeat): " + "; ".join(
            f"{x['matmul_gflops']:.1f} GFLOP/s, op {x['op_us']:.0f} us, gloo {x['alpha_us']:.0f} us/step "
            f"{x['gbps']:.2f} GB/s, after compute: all-reduce {x['call_ms']:.2f} ms, ring exchange "
            f"{x['exchange_ms']:.2f} ms; hand-off {x['handoff_ms']:.2f} ms, copy {x['mem_gbps']:.1f} GB/s "
            f"(load {x['load']:.1f})" for x in mach))


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
            mach, _ = _machine(c)
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
        _print_strategies(rows, a.repeats, a.steps)
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
