"""The planner against 48 published training runs: throughput, memory, fit and ranking.

    python bench/bench_plan_published.py            # every run, then the summary against the targets
    python bench/bench_plan_published.py sc21-t2    # only runs whose id starts with this

Per run: the throughput predicted for the published layout against the published one, in the source's
own convention (SC21 and MT-NLG: TFLOP/s per GPU counting the recompute, i.e. hardware FLOPs;
Korthikanti: MFU eq.(7); torchtitan: MFU or tokens/s per GPU); the predicted memory against the
measured peak (torchtitan); whether the published layout fits; its rank among every layout the
planner tries that the run's software could run (no context parallelism before 2023, no sharded optimizer in
SC21's Megatron-LM: PublishedRun.limits) and how far behind the planner's best it is predicted, with the gap
to the best of every layout tried today beside it where later features change it. The data and its sources:
kit/experiments/theory/data/published_runs.json, docs/published-runs.md. Every planner number is
predicted; every published one measured by its source. Targets (published_check.summarise): every published layout fits;
>= 80% of throughputs within 15%; torchtitan's peaks within 15% (median); SC21 Table 2's order at each
GPU count with ZeRO-3 falling; the published layout within 10% of the best in >= 80% of runs.
"""
from __future__ import annotations

import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from kit.experiments.theory.published import METRICS, published_runs  # noqa: E402
from kit.experiments.theory.published_check import compare_published, summarise  # noqa: E402

_UNIT = {"tflops_eq3": ("TFLOP/s", 1.0, ".0f"), "mfu_eq7": ("MFU %", 100.0, ".1f"), "mfu_6n": ("MFU %", 100.0, ".1f"),
         "tokens": ("tok/s", 1.0, ".0f")}


def _row(c) -> str:  # noqa: ANN001
    r = c.run
    if c.layout is None:
        return f"{r.id:44s} not expressible: {c.why_not}"
    unit, scale, fmt = _UNIT[r.metric]
    x = c.layout
    thr = (f"{c.predicted * scale:{fmt}} vs {r.published * scale:{fmt}} {unit} ({c.ratio:.2f})"
           + ("" if r.comparable else " [not compared: Float8]"))
    mem = f"{x.memory_gib:5.1f} vs {r.memory_gib:5.1f} GiB" if r.memory_gib else f"{x.memory_gib:5.1f} GiB      "
    today = f" (+{c.gap_today:.0%} today)" if c.gap_today > c.gap + 0.005 else ""
    rank = f"rank {c.rank:4d}, +{c.gap:5.1%}{today}" if c.rank else "rank    -"
    return (f"{r.id:44s} {thr:38s} {mem:22s} {'fits' if x.fits else 'DOES NOT FIT'} {rank}  MFU {x.mfu:4.0%} "
            f"HFU {x.time.hfu:4.0%}  [{x.name()}]")


def _summary(s: dict) -> list[str]:
    f, t, m, o, n = (s[k] for k in ("fits", "throughput_within_15pct", "memory_median_error", "sc21_table2_order",
                                    "within_10pct_of_best"))
    ok = lambda b: "MET" if b else "NOT MET"  # noqa: E731
    return [f"expressible: {s['expressible'][0]} of {s['expressible'][1]} runs",
            f"published layout fits:            {f[0]}/{f[1]} (target all) -> {ok(f[2])}",
            f"throughput within 15%:            {t[0]}/{t[1]} = {t[0] / max(t[1], 1):.0%} (target 80%) -> {ok(t[2])}; "
            f"median predicted/published {s['median_predicted_over_published']:.2f}",
            f"torchtitan peak memory, median |error|: {m[0]:.0%} over {m[1]} runs (target 15%) -> {ok(m[2])}",
            f"SC21 Table 2: PTD-P above ZeRO-3 at {o[0]}/{o[1]} GPU counts, ZeRO-3 falling: {o[2]} -> {ok(o[3])}",
            f"published layout within 10% of the best: {n[0]}/{n[1]} = {n[0] / max(n[1], 1):.0%} (target 80%) -> "
            f"{ok(n[2])}; first choice {s['first_choice'][0]}, top 5 {s['top5'][0]}",
            f"  (among the layouts each run's software could run; against every layout the planner tries today, "
            f"later features included: {s['within_10pct_of_best_today'][0]}/{n[1]})"]


def fit(rows: list) -> None:  # noqa: ANN001
    """Fit gemm_efficiency's E_MAX and W_HALF on every other comparable run; report the held-out half."""
    import math

    from kit.experiments.theory.gemm_efficiency import gemm_efficiency
    from kit.experiments.theory.layout_time import step_time
    from kit.experiments.theory.published_check import published_step_s

    usable = [c for c in rows if c.layout is not None and c.run.comparable and c.run.published]
    train, held = usable[0::2], usable[1::2]

    def err(cs: list, e: float) -> list[float]:
        out = []
        for c in cs:
            pc, r = c.layout.config, c.run
            eff = gemm_efficiency(r.model, pc.tp, pc.micro_batch * r.seq_len / pc.cp, e)
            out.append(math.log(published_step_s(r) / step_time(r.model, pc, r.cluster, r.seq_len, eff).step_s))
        return out
    best = min((e / 100 for e in range(30, 100)), key=lambda e: sum(x * x for x in err(train, e)))
    for name, cs in (("fitted on", train), ("held out", held)):
        within = sum(abs(math.exp(x) - 1) <= 0.15 for x in err(cs, best))
        print(f"{name}: {len(cs)} runs, {within} within 15% at E_MAX={best:.2f}")


def main() -> int:
    if "--fit" in sys.argv:
        fit([compare_published(r) for r in published_runs()])
        return 0
    prefix = sys.argv[1] if len(sys.argv) > 1 else ""
    t0 = time.perf_counter()
    rows = [compare_published(r) for r in published_runs() if r.id.startswith(prefix)]
    print("run | predicted vs published throughput (ratio) | predicted vs measured memory | fits | rank, gap to "
          "the best | the planner's MFU and HFU | the published layout as planned (all planner numbers predicted)")
    for c in rows:
        print(_row(c))
    print("\nconventions: " + "; ".join(f"{k}: {v}" for k, v in METRICS.items()))
    print(f"\nsummary ({len(rows)} runs, {time.perf_counter() - t0:.0f} s, loadavg {os.getloadavg()[0]:.1f}):")
    for line in _summary(summarise(rows)):
        print("  " + line)
    return 0


if __name__ == "__main__":
    sys.exit(main())
