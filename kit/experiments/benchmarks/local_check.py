"""The planner's time model on the learner's own ranks: measure this machine, predict a kit run, run it
(kernel side; the ranks measure). Lesson 13's "On this machine" section and bench/bench_predict_local.py.

Each repeat first measures the machine (calibrate_rank on every rank at once: the matmul rate, one op's
fixed cost, a copy's bandwidth; the collective benchmark's gloo all_reduce alpha-beta fit), then runs the
strategies in a rotated order (interleaved repeats: a busy spell of a shared machine lands on a different
strategy each time) and predicts each run from that repeat's numbers (theory/local_time.predict_local).
Every number returned is labelled measured or predicted.
"""
from __future__ import annotations

import statistics
import threading
from typing import Any, Callable, Sequence

from kit.experiments.theory.links import ring_steps
from kit.experiments.theory.local_time import LOCAL_STRATEGIES, LocalMachine, predict_local

__all__ = ["FIT_SIZES", "measure_machine", "measured_parts", "blocking_calls", "check_local"]

FIT_SIZES = [2**k for k in range(10, 23, 3)]   # 1 KiB .. 4 MiB: a pipeline hand-off to a DDP bucket


def measure_machine(cluster: Any, sizes: Sequence[int] = FIT_SIZES, iters: int = 5, copy_mib: int = 64) -> LocalMachine:
    """This machine's LocalMachine, measured on the cluster's ranks (medians over the ranks; the blocking
    call's mean over them, as each rank's step pays its own waits). `copy_mib`: each rank copies that many
    MiB into a second buffer at once (2 x copy_mib per rank, all ranks together)."""
    from kit.experiments.benchmarks.collectives import collective_benchmark
    from kit.experiments.theory.local_time import PROBE_BYTES
    p = cluster.world_size
    cal = cluster.call("kit.experiments.measure.calibrate:calibrate_rank", copy_mib=copy_mib)
    calls = cluster.call("kit.experiments.measure.calibrate:blocked_call_rank", PROBE_BYTES)
    ring = cluster.call("kit.experiments.measure.calibrate:blocked_call_rank", PROBE_BYTES, op="ring")
    handoff_ms = cluster.call("kit.experiments.measure.calibrate:handoff_rank", [PROBE_BYTES])[0][PROBE_BYTES]
    rec = collective_benchmark(cluster, ops=["all_reduce"], sizes=list(sizes), iters=iters, world_size=p)[0]
    fit = dict(rec["fit"])
    if not fit["beta_gbps"] > 0:  # noise made the slope negative: the largest size's bus bandwidth, the smallest's time
        big, small = rec["points"][-1], rec["points"][0]
        fit.update(beta_gbps=big["busbw_gbps"], alpha_per_step_us=small["time_ms"] * 1e3 / ring_steps("all_reduce", p))
    ranks = list(cal.values())
    return LocalMachine(statistics.median(r["matmul_gflops"] for r in ranks),
                        statistics.median(r["op_us"] for r in ranks), max(fit["alpha_per_step_us"], 0.0),
                        fit["beta_gbps"], statistics.median(r["mem_gbps"] for r in ranks),
                        call_us=1e3 * statistics.mean(r["after_compute_ms"] for r in calls.values()),
                        exchange_us=1e3 * statistics.mean(r["after_compute_ms"] for r in ring.values()),
                        handoff_us=1e3 * handoff_ms, source=f"measured on {p} ranks")


def measured_parts(rec: dict[str, Any]) -> dict[str, float]:
    """A run record's step in ms, by part (medians over steps). comm: all time in collectives (tp's, cp's and
    FSDP's run inside forward and backward and block them); compute: forward + backward less the collectives
    inside them; other: the rest (a pipeline's idle stages, data loading, bookkeeping)."""
    s = {k: float(v["median"]) for k, v in rec["spread"].items() if isinstance(v, dict) and "median" in v}
    comm, inside = s.get("comm_ms", 0.0), s.get("comm_overlap_ms", 0.0)
    compute = s["fwd_ms"] + s["bwd_ms"] - inside
    return {"step": s["step_ms"], "compute": compute, "comm": comm, "opt": s["opt_ms"],
            "other": s["step_ms"] - compute - comm - s["opt_ms"]}


COLLECTIVES = ("all_reduce", "all_gather", "reduce_scatter")   # blocking on CPU ranks; point-to-point sends are not


def blocking_calls(rec: dict[str, Any]) -> dict[str, float]:
    """The collectives of a run record's timeline step (its last), measured: how many per rank, and per rank
    the ms spent waiting for the last rank to arrive and the ms from the last arrival to the return (the
    ranks share one clock: `clock`). The i-th collective of every rank is the same call (the ranks issue them
    in one order); point-to-point sends are left out (they do not wait for every rank)."""
    by: dict[int, list[dict[str, Any]]] = {}
    for e in rec["timeline"]:
        if e["kind"] == "comm" and any(k in e["name"] for k in COLLECTIVES):
            by.setdefault(e["rank"], []).append(e)
    if not by:
        return {"calls": 0, "wait_ms": 0.0, "after_arrival_ms": 0.0}
    events = [sorted(v, key=lambda e: e["start_ms"]) for v in by.values()]
    n = min(len(v) for v in events)
    wait = after = 0.0
    for i in range(n):
        last = max(v[i]["start_ms"] for v in events)
        wait += sum(last - v[i]["start_ms"] for v in events) / len(events)
        after += sum(v[i]["end_ms"] - last for v in events) / len(events)
    return {"calls": n, "wait_ms": wait, "after_arrival_ms": after}


def check_local(cluster: Any = None, strategies: Sequence[str] = ("ddp", "tp"), repeats: int = 3, steps: int = 4,
                batch_size: int = 32, copy_mib: int = 16, world_size: int = 2,
                progress: Callable[[int, int, str], None] | None = None,
                stop: threading.Event | None = None) -> list[dict[str, Any]]:
    """Per strategy, the kit's gpt workload on the cluster's ranks: the measured step (median and min-max
    over the repeats) beside the predicted one (median of each repeat's prediction), with the machine's
    numbers of every repeat. copy_mib 16, not the bench's 64: 4 ranks copying 2 x 64 MiB at once took a
    lesson's ranks past Binder's 1 GiB (OOM-killed in lesson 13's test).

    `cluster`: None takes `world_size` ranks as `run` does (cluster_for: %%distributed's when they fit, else
    ranks started once and kept). `progress(k, n, what)`: k of n pieces done (each repeat's measurement and
    each run), `what` the piece starting next. `stop`: setting the event ends the check after the current
    piece; the rows then hold only the repeats every strategy finished (none: [])."""
    from kit.experiments import ExperimentConfig, run
    from kit.experiments.api import cluster_for
    bad = [s for s in strategies if s not in LOCAL_STRATEGIES]
    if bad or not strategies:
        raise ValueError(f"strategies {list(strategies)}: the local model predicts {', '.join(LOCAL_STRATEGIES)}")
    cluster = cluster_for(world_size, cluster)
    p = cluster.world_size
    got: dict[str, list[tuple[float, float]]] = {s: [] for s in strategies}
    machines = []
    total, done = repeats * (1 + len(strategies)), 0

    def step(what: str) -> bool:
        """Report the piece starting next; False if the learner asked to stop."""
        if progress:
            progress(done, total, what)
        return not (stop is not None and stop.is_set())

    for rep in range(repeats):
        if not step(f"repeat {rep + 1}/{repeats}: measuring this machine"):
            break
        m = measure_machine(cluster, copy_mib=copy_mib)
        done += 1
        finished = True
        for s in list(strategies)[rep % len(strategies):] + list(strategies)[:rep % len(strategies)]:
            finished = step(f"repeat {rep + 1}/{repeats}: running {s} on {p} ranks")
            if finished:
                cfg = ExperimentConfig(strategy=s, workload="gpt", world_size=p, batch_size=batch_size,
                                       micro_batches=4, steps=steps, warmup_steps=1)
                rec = run(cfg, cluster=cluster, stop=stop)
                finished = rec.get("complete", True) is not False  # a stopped run is not a measurement
            if not finished:
                break
            got[s].append((measured_parts(rec)["step"], predict_local(m, s, p, batch_size, 4)["step_ms"]))
            done += 1
        if not finished:
            break
        machines.append(m)
    if progress:
        progress(done, total, "done")
    n = min(len(v) for v in got.values())
    return [{"strategy": s, "ranks": p, "measured_step_ms": statistics.median(a for a, _ in pairs[:n]),
             "measured_spread_ms": (min(a for a, _ in pairs[:n]), max(a for a, _ in pairs[:n])),
             "predicted_step_ms": statistics.median(b for _, b in pairs[:n]),
             "predicted_spread_ms": (min(b for _, b in pairs[:n]), max(b for _, b in pairs[:n])),
             "repeats": n, "machines": machines[:n]} for s, pairs in got.items()] if n else []
