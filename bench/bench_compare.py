"""Does `kit.experiments.compare` give verdicts a lesson can stand on? Measured in one run:

    python bench/bench_compare.py            # 20 + 20 comparisons (about 15 min on 2 cores)
    python bench/bench_compare.py --quick    # 3 + 3 comparisons, a couple of minutes
    python bench/bench_compare.py --n 10 --json out.json

1. False alarms: `compare(A, A)` N times; target "same within noise" in >= 19 of 20.
2. Sensitivity: `compare(A, A_slow)` N times, A_slow = A plus a virtual link (`interconnect=
   "custom"`) sized from a calibration run so it adds 15% of A's median step; target "slower"
   in >= 19 of 20. (VirtualLink starts a bucket's emulated transfer when the real all-reduce
   has finished, so its time adds to the step: link = 15% of the step. The effect actually
   measured, the median ratio over all these comparisons, is printed: a check on the sizing.)
3. Time to a verdict: the median wall time of those compare() calls with the default repeats
   and steps (ranks already started, as in a lesson); target <= 30 s.
4. Instrumentation overhead: `compare(instrument=False, instrument=True)`, interleaved;
   target: ratio within 3%.
All on one set of 2 gloo ranks (the MLP, ddp, defaults otherwise). The raw per-run step times
are kept, so the same runs are also re-scored with other per-run statistics (mean, p25, min)
to show why the median is the default. Timings on a shared machine are noisy: take the numbers
that go into docs on a quiet machine.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from kit.experiments import ExperimentConfig, compare, run  # noqa: E402
from kit.experiments import cluster_for, shutdown  # noqa: E402
from kit.experiments import DEFAULT_REPEATS, paired_verdict  # noqa: E402
from kit.experiments import quantile  # noqa: E402

SLOWER_PCT = 15.0


def per_step_ms(record: dict) -> dict[int, list[float]]:
    """Per repeat, the step times (slowest rank per step)."""
    out: dict[tuple[int, int], float] = {}
    for row in record["steps"]:
        key = (row.get("repeat", 0), row["step"])
        out[key] = max(out.get(key, 0.0), row["step_ms"])
    reps: dict[int, list[float]] = {}
    for (rep, _), ms in sorted(out.items()):
        reps.setdefault(rep, []).append(ms)
    return reps


STATS = {"median": statistics.median, "mean": statistics.fmean,
         "p25": lambda xs: quantile(xs, 0.25), "min": min}


def rescore(results: list[dict], stat: str) -> list[str]:
    """Verdicts of the same runs with another per-run statistic."""
    out = []
    for res in results:
        a = [STATS[stat](v) for _, v in sorted(per_step_ms(res["a"]).items())]
        b = [STATS[stat](v) for _, v in sorted(per_step_ms(res["b"]).items())]
        out.append(paired_verdict(a, b)["verdict"])
    return out


def loadavg() -> float:
    return os.getloadavg()[0]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--n", type=int, default=20, help="comparisons per check (default 20)")
    ap.add_argument("--quick", action="store_true", help="3 comparisons per check")
    ap.add_argument("--json", help="write every comparison's result here")
    args = ap.parse_args()
    n = 3 if args.quick else args.n
    base = ExperimentConfig()  # ddp, MLP, 2 ranks, 20 steps: the defaults a lesson uses
    t_start = time.perf_counter()
    cluster = cluster_for(base.world_size)
    print(f"ranks started in {time.perf_counter() - t_start:.1f} s; loadavg {loadavg():.2f}", flush=True)

    cal = run(base, cluster=cluster, repeats=3)
    step = cal["repeat_spread"]["step_ms"]["median"]
    exposed = cal["repeat_spread"]["comm_exposed_ms"]["median"]
    link_ms = SLOWER_PCT / 100 * step
    grad_bytes = cal["comm"]["bytes_per_step"]
    slow = base.replace(interconnect="custom", link_alpha_us=0.0,
                        link_gbps=grad_bytes / (link_ms * 1e-3) / 1e9)  # 2 ranks: ring time = bytes / bw
    print(f"calibration: median step {step:.1f} ms, exposed comm {exposed:.1f} ms -> link of "
          f"{link_ms:.1f} ms for {grad_bytes / 2**20:.1f} MiB ({slow.link_gbps:.3f} GB/s) "
          f"to add {SLOWER_PCT:.0f}% of the step", flush=True)

    results: dict[str, list[dict]] = {"same": [], "slower": [], "overhead": []}
    for i in range(n):  # alternate the two checks so load drift hits both
        for kind, b in (("same", base), ("slower", slow)):
            res = compare(base, b, cluster=cluster, seed=i)
            results[kind].append(res)
            print(f"  {kind:6s} #{i + 1}: {res['verdict']:18s} ratio {res['ratio']:.3f} "
                  f"[{res['ci_low']:.3f}, {res['ci_high']:.3f}] {res['elapsed_s']:5.1f} s "
                  f"loadavg {loadavg():.2f}", flush=True)
    over = compare(base.replace(instrument=False), base, cluster=cluster, repeats=max(DEFAULT_REPEATS, n))
    results["overhead"].append(over)

    same = sum(r["verdict"] == "same within noise" for r in results["same"])
    slower = sum(r["verdict"] == "slower" for r in results["slower"])
    times = [r["elapsed_s"] for k in ("same", "slower") for r in results[k]]
    t_med = statistics.median(times)
    ok = lambda c: "PASS" if c else "FAIL"  # noqa: E731
    print(f"\nfalse alarms: compare(A, A) said 'same within noise' in {same}/{n} "
          f"(target >= 95%: 19/20) {ok(same >= 0.95 * n)}")
    effect = statistics.median(p["ratio"] for r in results["slower"] for p in r["pairs"])
    print(f"sensitivity: compare(A, A+{SLOWER_PCT:.0f}%) said 'slower' in {slower}/{n} "
          f"(target >= 95%: 19/20) {ok(slower >= 0.95 * n)}; effect measured over all its pairs: "
          f"{100 * (effect - 1):+.1f}%")
    print(f"time to a verdict (defaults: {DEFAULT_REPEATS} pairs x 20 steps, ranks warm): median {t_med:.1f} s "
          f"(min {min(times):.1f}, max {max(times):.1f}) (target <= 30 s) {ok(t_med <= 30)}")
    print(f"instrumentation on/off: {over['ratio']:.3f} (95% CI {over['ci_low']:.3f}-"
          f"{over['ci_high']:.3f}, {len(over['pairs'])} pairs): {over['verdict']} "
          f"(target within 3%) {ok(abs(over['ratio'] - 1) <= 0.03)}")
    print("\nthe same runs re-scored with other per-run statistics (same pairing, CI, 2% rule):")
    for stat in STATS:
        s = sum(v == "same within noise" for v in rescore(results["same"], stat))
        w = sum(v == "slower" for v in rescore(results["slower"], stat))
        print(f"  {stat:6s}: same {s}/{n}, slower {w}/{n}")
    print(f"total {time.perf_counter() - t_start:.0f} s; loadavg now {loadavg():.2f} "
          "(final numbers: take them on a quiet machine)")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f)
    shutdown()


if __name__ == "__main__":
    main()
