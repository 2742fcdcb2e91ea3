"""Ranks forked from the warm rank template against today's fresh interpreters, side by side in one run.

    python bench/bench_template.py [--reps 2] [--no-kernel] [--json out.json]

Each rep runs one plain-Python "kernel" per mode, alternating (fresh, template, fresh, template, ...),
so both modes see the same machine load. In each:
  start 2 ranks        Cluster(LaunchConfig(world_size=2)).start(); the template is pre-warmed first
                       (its own cold start is reported apart, as `template_warm_s`)
  cell round trip      median of 100 trivial `Cluster.run("1")` on those 2 ranks, ms; and, better, both
                       modes' clusters up at once in one process, 300 cells on each, alternating
  restart 2 ranks      median of 3 `Cluster.restart()`
  start 8 ranks        a fresh 8-rank cluster, to the first cell's result
  PSS 8 idle ranks     the kernel process and all its descendants (template, ranks, watchdogs), summed
                       Pss from /proc/PID/smaps_rollup, after a trivial cell on the 8 ranks
Then, in a real Jupyter kernel (unless --no-kernel), the first `%%distributed --cpus 2` cell after
`%load_ext kit`, submit -> idle: after a 2 s pause (as a reader would; the template imports torch
meanwhile), after the template is warm (waited for, untimed), with no pause (Run All), and today's
behaviour (`--no-template`, and the prewarm on load switched off in that kernel so that it does not
compete for the cores). In the today and warm kernels, then `%dist restart --cpus 8`, a cell, and the PSS of the
kernel and everything under it.
Targets: restart of 2 < 0.3 s; 8-rank start < 1 s; PSS < 800 MiB; first cell after a warm
template < 0.3 s; Run All no slower than today; the warm round trip unchanged.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _kernel import REPO_DIR, Kernel, loadavg, pss_mib  # noqa: E402

ONE_KERNEL = r"""
import json, os, statistics, sys, time
sys.path.insert(0, sys.argv[2])
from _kernel import descendants, pss_mib
from kit.config import LaunchConfig
from kit.engine.cluster import Cluster
from kit.engine import launcher, template
use = sys.argv[1] == "template"
quiet = lambda *a: None
out = {}
cfg2 = LaunchConfig(world_size=2, template=use)
if use:
    t0 = time.perf_counter()
    got = template.template_for(launcher.inherited_env(cfg2), 120)
    assert not isinstance(got, str), got
    out["template_warm_s"] = time.perf_counter() - t0
t0 = time.perf_counter()
c = Cluster(cfg2).start()
out["start2_s"] = time.perf_counter() - t0
c.run("1", on_output=quiet)
rtt = []
for _ in range(100):
    t0 = time.perf_counter(); c.run("1", on_output=quiet); rtt.append(time.perf_counter() - t0)
out["cell_rtt_ms"] = statistics.median(rtt) * 1000
rs = []
for _ in range(3):
    t0 = time.perf_counter(); c.restart(); rs.append(time.perf_counter() - t0)
assert c.run("rank", on_output=quiet).values == {0: 0, 1: 1}
out["restart2_s"] = statistics.median(rs)
c.shutdown()
t0 = time.perf_counter()
c8 = Cluster(LaunchConfig(world_size=8, template=use))
import io, contextlib
with contextlib.redirect_stderr(io.StringIO()):  # the "8 ranks on 2 cores" note
    c8.start()
r = c8.run("t = torch.ones(1); dist.all_reduce(t); t.item()", on_output=quiet)
out["start8_s"] = time.perf_counter() - t0
assert r.values == {i: 8.0 for i in range(8)}, r.values
time.sleep(1.0)
pids = [os.getpid()] + descendants(os.getpid())
out["pss8_mib"] = sum(pss_mib(p) or 0.0 for p in pids)
out["processes8"] = len(pids)
c8.shutdown()
print("RESULT " + json.dumps(out), flush=True)
"""


RTT = r"""
import json, statistics, time
from kit.config import LaunchConfig
from kit.engine.cluster import Cluster
quiet = lambda *a: None
cs = {"fresh": Cluster(LaunchConfig(world_size=2, template=False)).start(),
      "template": Cluster(LaunchConfig(world_size=2)).start()}
times = {k: [] for k in cs}
for name, c in cs.items():
    for _ in range(20):
        c.run("1", on_output=quiet)
for _ in range(300):  # interleaved: the machine's noise falls on both alike
    for name, c in cs.items():
        t0 = time.perf_counter(); c.run("1", on_output=quiet); times[name].append(time.perf_counter() - t0)
for c in cs.values():
    c.shutdown()
print("RESULT " + json.dumps({k: statistics.median(v) * 1000 for k, v in times.items()}))
"""


def interleaved_rtt() -> dict[str, float]:
    """Both clusters up at once, 300 trivial cells on each, alternating: median ms per mode."""
    p = subprocess.run([sys.executable, "-c", RTT], capture_output=True, text=True, timeout=600, cwd=REPO_DIR)
    lines = [ln for ln in p.stdout.splitlines() if ln.startswith("RESULT ")]
    if p.returncode != 0 or not lines:
        raise RuntimeError(f"round-trip run failed (rc {p.returncode}):\n{p.stderr[-3000:]}")
    return json.loads(lines[-1][len("RESULT "):])


def one_kernel(mode: str) -> dict[str, float]:
    p = subprocess.run([sys.executable, "-c", ONE_KERNEL, mode, os.path.dirname(os.path.abspath(__file__))],
                       capture_output=True, text=True, timeout=600, cwd=REPO_DIR)
    lines = [ln for ln in p.stdout.splitlines() if ln.startswith("RESULT ")]
    if p.returncode != 0 or not lines:
        raise RuntimeError(f"{mode} run failed (rc {p.returncode}):\n{p.stdout[-1500:]}\n{p.stderr[-3000:]}")
    return json.loads(lines[-1][len("RESULT "):])


CELL = "%%distributed --cpus 2{flag}\nt = torch.ones(1)\ndist.all_reduce(t)\nt.item()"


WAIT_WARM = "from kit.engine import template as _t\nassert all(t.wait_ready(300) is None for t in _t.live_templates())"
PSS8 = "%%distributed\nt = torch.ones(1)\ndist.all_reduce(t)\nt.item()"  # after `%dist restart --cpus 8`


def first_cell(mode: str) -> tuple[float, float | None]:
    """(first cell's submit -> idle, PSS of the kernel and all its descendants with 8 idle ranks or None)."""
    k = Kernel()
    flag = " --no-template" if mode == "today" else ""
    try:
        if mode == "today":  # no template process competing for the cores while fresh ranks import torch
            k.must("import kit.notebook.magics as _m\n_m.prewarm = lambda *a: None")
        k.must("%load_ext kit")
        if mode == "paused-2s":
            time.sleep(2.0)
        elif mode == "warm":
            k.must(WAIT_WARM, timeout=300)  # untimed: the template finished importing torch
        r = k.must(CELL.format(flag=flag), timeout=180)
        if "2.0" not in r["text"]:
            raise RuntimeError(f"unexpected output: {r['text'][-500:]}")
        pss = None
        if mode in ("today", "warm"):
            k.must("%dist restart --cpus 8", timeout=300)  # keeps the running config's template setting
            if "8.0" not in k.must(PSS8, timeout=300)["text"]:
                raise RuntimeError("the 8-rank cell did not print 8.0")
            time.sleep(1.0)
            pss = sum(pss_mib(p) or 0.0 for p in [k.pid] + k.children())
        return float(r["wall_s"]), pss
    finally:
        left = k.shutdown()
        if left:
            print(f"  (ended {len(left)} leftover process(es) of the {mode} kernel by pid)")


def med(xs: list[float]) -> float:
    return statistics.median(xs)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--reps", type=int, default=2)
    ap.add_argument("--no-kernel", action="store_true", help="skip the real-kernel first-cell measurements")
    ap.add_argument("--json")
    args = ap.parse_args()
    print(f"load before: {loadavg()}  (cores: {os.cpu_count()})")
    runs: dict[str, list[dict[str, float]]] = {"fresh": [], "template": []}
    for rep in range(args.reps):
        for mode in ("fresh", "template"):
            runs[mode].append(one_kernel(mode))
            print(f"  rep {rep + 1} {mode:8s} {json.dumps({k: round(v, 4) for k, v in runs[mode][-1].items()})}")
    rows = [("start 2 ranks (s)", "start2_s", None), ("restart 2 ranks (s)", "restart2_s", 0.3),
            ("start 8 ranks to a result (s)", "start8_s", 1.0), ("PSS kernel+template+8 ranks (MiB)", "pss8_mib", 800),
            ("warm cell round trip (ms)", "cell_rtt_ms", None)]
    result: dict[str, object] = {"runs": runs, "load_before": loadavg()}
    print(f"\n{'median of ' + str(args.reps):38s} {'fresh':>9s} {'template':>9s} {'ratio':>7s}  target")
    for label, key, target in rows:
        f, t = med([r[key] for r in runs["fresh"]]), med([r[key] for r in runs["template"]])
        ok = "" if target is None else f"< {target:g}: {'PASS' if t < target else 'FAIL'}"
        print(f"{label:38s} {f:9.3f} {t:9.3f} {t / f:7.2f}x  {ok}")
        result[key] = {"fresh": f, "template": t, "ratio": t / f}
    rtt = interleaved_rtt()
    print(f"{'warm round trip, interleaved (ms)':38s} {rtt['fresh']:9.3f} {rtt['template']:9.3f} "
          f"{rtt['template'] / rtt['fresh']:7.2f}x  unchanged (1 run: a difference under ~15% is noise)")
    result["cell_rtt_interleaved_ms"] = rtt
    print(f"{'template cold start (import torch once)':38s} {'':9s} {med([r['template_warm_s'] for r in runs['template']]):9.3f}")
    if not args.no_kernel:
        cells: dict[str, list[float]] = {"today": [], "run-all": [], "paused-2s": [], "warm": []}
        pss: dict[str, list[float]] = {"today": [], "warm": []}
        for _ in range(args.reps):
            for mode in cells:
                wall, p = first_cell(mode)
                cells[mode].append(wall)
                if p is not None:
                    pss[mode].append(p)
        print("\nfirst %%distributed --cpus 2 cell after %load_ext, submit -> idle (real kernel; today = --no-template "
              "and no prewarm; warm = after the template finished importing torch):")
        for mode, xs in cells.items():
            print(f"  {mode:10s} {med(xs):7.3f} s  {[round(x, 3) for x in xs]}  ratio to today "
                  f"{med(xs) / med(cells['today']):.2f}x")
        print(f"  paused-2s < 0.3 s: {'PASS' if med(cells['paused-2s']) < 0.3 else 'FAIL'}; warm < 0.3 s: "
              f"{'PASS' if med(cells['warm']) < 0.3 else 'FAIL'}; Run All no slower than today: "
              f"{'yes' if med(cells['run-all']) <= med(cells['today']) else 'no'}")
        print(f"  PSS of the real kernel + everything under it with 8 idle ranks: today {med(pss['today']):.0f} MiB, "
              f"template {med(pss['warm']):.0f} MiB ({med(pss['warm']) / med(pss['today']):.2f}x)")
        result["first_cell_s"], result["kernel_pss8_mib"] = cells, pss
    print(f"load after: {loadavg()}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(result, f, indent=1)


if __name__ == "__main__":
    main()
