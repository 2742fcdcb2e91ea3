"""Check the predictor against what this machine can measure: 1..4 CPU ranks, with and without
the virtual interconnect (kernel side; no torch here, the ranks run the measurements).

The protocol (bench/bench_predict.py runs it; tests/test_predict.py runs it on 1-2 ranks):
1. `single` on one rank, twice: a base and the 1-rank point to predict.
2. For each world size p >= 2, on fresh ranks with `threads_per_rank` threads each: the
   collective benchmark's all_reduce fit; a calibration DDP run with one bucket and no link;
   DDP (4 MiB buckets) with no virtual link and with one (e.g. 10gbe).
3. Predict each point from a base record and a link (a fit, or [fit, preset]: the virtual link
   charges its time after the real all-reduce, so the costs add), with `host_cores`/`host_load`
   set, since threads beyond the free cores stretch compute. Two bases (see `residuals`): the
   2-rank calibration run with its in-situ link (main), or the 1-rank run with the benchmark fit.
4. Residuals: predicted - measured, in ms and % of measured, for step time and exposed comm.
"""
from __future__ import annotations

import os
from statistics import median
from typing import Any, Callable, Mapping, Sequence

from kit.experiments.config import ExperimentConfig
from kit.experiments.theory.links import LinkPreset, ring_factor
from kit.experiments.theory.prediction import predict
from kit.units import MIB

__all__ = ["measure", "residuals", "in_situ_link", "residual_table", "median_abs_error_pct", "FIT_SIZES"]

FIT_SIZES = tuple(2**k for k in range(16, 25, 2))  # 64 KiB .. 16 MiB: the buckets' range
CALIB_CAP_MB = 100.0  # one bucket holding every gradient, launched after backward: no overlap to untangle


def _cluster(world_size: int, threads: int) -> Any:
    from kit.config import LaunchConfig
    from kit.engine.cluster import Cluster
    return Cluster(LaunchConfig(world_size=world_size, threads_per_rank=threads, check_collectives=False)).start()


def measure(world_sizes: Sequence[int] = (2, 3, 4), link: str = "10gbe", base: ExperimentConfig | None = None,
            steps: int = 12, warmup: int = 3, threads_per_rank: int = 1, fit_iters: int = 5, repeats: int = 1,
            log: Callable[[str], None] = print) -> dict[str, Any]:
    """Run the protocol's measurements: 1-rank `single` twice (base, check); per p >= 2 the
    benchmark fit, the calibration run (one bucket, no link) and DDP with and without `link`."""
    from kit.experiments.api import run
    from kit.experiments.benchmarks.collectives import collective_benchmark
    cfg = (base or ExperimentConfig(strategy="ddp", bucket_cap_mb=4.0)).replace(steps=steps, warmup_steps=warmup)
    out: dict[str, Any] = {"config": cfg.to_dict(), "link": link, "threads_per_rank": threads_per_rank,
                           "cores": os.cpu_count() or 1, "load_before": os.getloadavg(), "points": {}}
    c = _cluster(1, threads_per_rank)
    try:
        single = cfg.replace(strategy="single", world_size=1, interconnect=None)
        one = _interleaved(run, {"base": single, "single": single}, c, repeats)
        out["base"], out["points"][1] = one["base"], {"single": one["single"]}  # the check: the 1-rank point
        log(f"1 rank: base {_m(out['base'], 'step_ms'):.1f} ms, check {_m(out['points'][1]['single'], 'step_ms'):.1f} ms")
    finally:
        c.shutdown()
    for p in world_sizes:
        c = _cluster(p, threads_per_rank)
        try:
            fit = collective_benchmark(c, ops=["all_reduce"], sizes=FIT_SIZES, iters=fit_iters, world_size=p)[0]
            ddp = cfg.replace(world_size=p, interconnect=None)
            recs = _interleaved(run, {"calib": ddp.replace(bucket_cap_mb=CALIB_CAP_MB), "none": ddp,
                                      link: ddp.replace(interconnect=link)}, c, repeats)
            out["points"][p] = {**recs, "fit": fit}
            log(f"{p} ranks: benchmark fit alpha/step {fit['fit']['alpha_per_step_us']:.0f} us, beta "
                f"{fit['fit']['beta_gbps']:.2f} GB/s; " + ", ".join(f"{k} {_m(r, 'step_ms'):.1f} ms"
                                                                    for k, r in recs.items()))
        finally:
            c.shutdown()
    out["load_after"] = os.getloadavg()
    return out


def _interleaved(run: Callable[..., dict[str, Any]], cfgs: Mapping[str, ExperimentConfig], cluster: Any,
                 repeats: int) -> dict[str, dict[str, Any]]:
    """Each config `repeats` times, round-robin (1 2 3, 2 3 1, ...), so a busy spell on the shared
    machine hits every config rather than posing as a difference between them (docs/measuring.md)."""
    from kit.experiments.records import combine_repeats
    from kit.experiments.stats import interleave
    names = list(cfgs)
    got: dict[str, list[dict[str, Any]]] = {n: [] for n in names}
    for i in interleave(len(names), repeats):
        got[names[i]].append(run(cfgs[names[i]], cluster=cluster))
    return {n: combine_repeats(v) for n, v in got.items()}


def _m(rec: Mapping[str, Any], key: str) -> float:
    return float(rec["spread"][key]["median"])


def in_situ_link(calib: Mapping[str, Any]) -> LinkPreset:
    """The loopback link as a training step sees it: one bucket of all the gradients, its
    measured all-reduce time T (median), as a pure-bandwidth ring: gbps = 2(p-1)/p n / T.

    Why not the benchmark's fit alone: inside a step, gloo's threads compete with compute for
    the cores and the ranks arrive skewed (one was descheduled), so on this 2-core machine the
    same bytes took 1.5-3.8x the benchmark's time. The calibration run (bucket_cap_mb=100, no link)
    is not one of the predicted points."""
    p = int(calib["config"]["world_size"])
    n = float(calib["comm"]["bytes_per_step"])
    t_s = float(calib["spread"]["comm_ms"]["median"]) * 1e-3
    return LinkPreset(hop_us=0.0, gbps=ring_factor("all_reduce", p) * n / t_s / 1e9,
                      source=f"fit: in-situ, one {n / MIB:.1f} MiB DDP bucket on {p} gloo ranks took "
                             f"{t_s * 1e3:.1f} ms (run {calib['run_id']})")


def residuals(meas: Mapping[str, Any], base_from: str = "same_p") -> list[dict[str, Any]]:
    """One row per measured point: predicted vs measured step and exposed comm.

    base_from="same_p": each world size's own calibration run (one bucket, no link) is the base
    and its in-situ link the loopback: this checks the communication model (4 MiB buckets
    overlapping backward, the virtual link's time) with compute measured at the same p; the
    1-rank point is the base `single` run against the second one (run-to-run noise).
    base_from="ddp2": the base is the 2-rank calibration run (one bucket, no link): compute per
    phase as DDP on 2 ranks sees it, and the in-situ loopback link from its all-reduce; 3 and 4
    ranks are extrapolated (ring formula, fair share of the cores). That run is not a row.
    base_from="single": the base is the 1-rank `single` run and the link the collective
    benchmark's fit on each world size: the stricter extrapolation, from one rank."""
    pts = {int(k): v for k, v in meas["points"].items()}
    load = float(meas["load_before"][0])
    rows = []
    for p, recs in sorted(pts.items()):
        if base_from == "same_p":
            base = recs.get("calib", meas["base"])
            base_link = in_situ_link(base) if "calib" in recs else None
        elif base_from == "ddp2":
            base, base_link = pts[2]["calib"], in_situ_link(pts[2]["calib"])
        else:
            base, base_link = meas["base"], None
        for name, rec in recs.items():
            if name == "fit" or rec is base:
                continue
            fit = base_link or recs.get("fit")
            chain: list[Any] = [fit] if fit else [(0.0, 1e9)]
            if name not in ("none", "calib", "single"):
                chain.append(name)
            buckets = [b["bytes"] for b in rec["comm"]["buckets"]] or None  # structure only: sizes, not times
            pred = predict(base, ranks=[p], link=chain, buckets=buckets, host_cores=meas["cores"], host_load=load)
            pt = pred["points"][-1]
            ms, me = _m(rec, "step_ms"), _m(rec, "comm_exposed_ms")
            label = {"none": "loopback", "calib": "loopback 1 bucket", "single": "none (single)"}.get(name,
                                                                                                  f"loopback+{name}")
            rows.append({"ranks": p, "link": label, "oversubscribed": p * meas["threads_per_rank"] > meas["cores"],
                         "measured_step_ms": ms, "predicted_step_ms": pt["step_ms"],
                         "step_err_pct": 100 * (pt["step_ms"] - ms) / ms,
                         "measured_exposed_ms": me, "predicted_exposed_ms": pt["comm_exposed_ms"],
                         "exposed_err_ms": pt["comm_exposed_ms"] - me,
                         "exposed_err_pct": 100 * (pt["comm_exposed_ms"] - me) / me if me > 0.5 else None,
                         "step_iqr_ms": rec["spread"]["step_ms"]["iqr"], "run_id": rec["run_id"]})
    return rows


def median_abs_error_pct(rows: Sequence[Mapping[str, Any]], key: str = "step_err_pct",
                         only: Callable[[Mapping[str, Any]], bool] = lambda r: True) -> float | None:
    vals = [abs(r[key]) for r in rows if r.get(key) is not None and only(r)]
    return median(vals) if vals else None


def residual_table(rows: Sequence[Mapping[str, Any]]) -> str:
    head = f"{'ranks':>5} {'link':<16} {'step meas':>9} {'pred':>7} {'err%':>6} {'IQR':>6} " \
           f"{'exposed meas':>12} {'pred':>7} {'err ms':>7} {'err%':>6}"
    lines = [head, "-" * len(head)]
    for r in rows:
        ep = "-" if r["exposed_err_pct"] is None else f"{r['exposed_err_pct']:+.0f}"
        lines.append(f"{r['ranks']:>4}{'*' if r['oversubscribed'] else ' '} {r['link']:<16} "
                     f"{r['measured_step_ms']:>9.1f} {r['predicted_step_ms']:>7.1f} {r['step_err_pct']:>+6.0f} "
                     f"{r['step_iqr_ms']:>6.1f} {r['measured_exposed_ms']:>12.1f} {r['predicted_exposed_ms']:>7.1f} "
                     f"{r['exposed_err_ms']:>+7.1f} {ep:>6}")
    lines.append("* ranks x threads > cores: oversubscribed (modelled as compute stretched by the ratio)")
    return "\n".join(lines)
