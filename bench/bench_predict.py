"""Is the predictor right where it can be checked? 1-4 CPU ranks, with and without a virtual link.

    python bench/bench_predict.py              # ranks 1-4, 20 measured steps per run (a few minutes)
    python bench/bench_predict.py --quick      # ranks 1-2, 8 steps
    python bench/bench_predict.py --json out.json --plot out.png

Protocol (kit/experiments/benchmarks/predict_check.py): the prediction sees only a 1-rank `single` run
(compute per phase) and, per world size, the collective benchmark's loopback all_reduce fit
(the link) or the all-reduce time of one calibration DDP run with a single bucket (the
in-situ link, main table); DDP runs on 2, 3, 4 ranks with and without the virtual interconnect are what it
predicts. Each rank gets one thread: 1-2 ranks fit the 2 cores, 3-4 ranks oversubscribe them
(marked *, modelled as compute stretched by ranks x threads / cores). Prints the residual table,
the median absolute error of the step time (target < 15%) and the machine's load average, which
on a shared 2-core box moves every measured number.
"""
from __future__ import annotations

import argparse
import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from kit.experiments import predict_check  # noqa: E402


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="ranks 1-2, 8 steps")
    ap.add_argument("--ranks", default=None, help="world sizes to measure, e.g. 2,3,4")
    ap.add_argument("--link", default="10gbe", help="virtual interconnect preset for the 'with link' points")
    ap.add_argument("--steps", type=int, default=None)
    ap.add_argument("--repeats", type=int, default=3, help="runs per point (medians pooled)")
    ap.add_argument("--json", default=None, help="write the measurements and residuals here")
    ap.add_argument("--from-json", default=None, help="re-score measurements saved by --json (no runs)")
    ap.add_argument("--plot", default=None, help="write the predicted-vs-measured figure (PNG) here")
    a = ap.parse_args()
    ranks = [int(x) for x in a.ranks.split(",")] if a.ranks else ([2] if a.quick else [2, 3, 4])
    steps = a.steps or (8 if a.quick else 20)
    if a.from_json:
        with open(a.from_json) as f:
            meas = json.load(f)["measurements"]
        print(f"re-scoring the measurements in {a.from_json} (no new runs)")
    else:
        print(f"load average before: {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores")
        meas = predict_check.measure(ranks, link=a.link, steps=steps, warmup=2 if a.quick else 3, fit_iters=3 if a.quick else 5,
                       repeats=1 if a.quick else a.repeats)
    tables = {}
    for mode, what in (("same_p", "base: each world size's calibration DDP run (one bucket, no link) and its "
                                  "in-situ loopback link; checks the comm model (buckets, overlap, virtual link)"),
                       ("ddp2", "base: the 2-rank calibration run; 3-4 ranks extrapolated (fair share of cores)"),
                       ("single", "base: the 1-rank single run; link: the collective benchmark's fit per world size")):
        rows = tables[mode] = predict_check.residuals(meas, base_from=mode)
        print(f"\n{what}:")
        print(predict_check.residual_table(rows))
        med = predict_check.median_abs_error_pct(rows)
        fits = predict_check.median_abs_error_pct(rows, only=lambda r: not r["oversubscribed"])
        exp = sorted(abs(r["exposed_err_ms"]) for r in rows if r["ranks"] > 1)
        multi = predict_check.median_abs_error_pct(rows, only=lambda r: r["ranks"] > 1)
        print(f"median |error| of step time: {med:.1f}% over {len(rows)} points ({fits:.1f}% where ranks fit "
              f"the cores, {multi:.1f}% at 2+ ranks); exposed comm median |error| {exp[len(exp) // 2] if exp else 0:.1f} ms, "
              f"{predict_check.median_abs_error_pct(rows, 'exposed_err_pct') or 0:.0f}% where measured > 0.5 ms")
    print(f"\ntarget: median |error| of step time < 15% (main table: {predict_check.median_abs_error_pct(tables['same_p']):.1f}%). "
          "The 1-rank row is two runs of one config: its error is this machine's run-to-run noise.")
    print(f"load average before {meas['load_before'][0]:.1f}, after {meas['load_after'][0]:.1f} on "
          f"{meas['cores']} cores; measured points on a loaded machine wobble by ~25% run to run (docs/measuring.md)")
    if a.json:
        with open(a.json, "w") as f:
            json.dump({"measurements": meas, "residuals": tables}, f, default=str)
    if a.plot:
        from kit.plots.predicted import residuals_plot
        from kit.widgets.render import render_png
        with open(a.plot, "wb") as f:
            f.write(render_png(residuals_plot(tables["same_p"])))
    return 0


if __name__ == "__main__":
    sys.exit(main())
