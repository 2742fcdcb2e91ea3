"""What `--profile` costs: the same work with and without torch.profiler, interleaved.

1. Cell: `Cluster.run(CELL)` (a small MLP's forward/backward + all_reduce, STEPS times) on 2 CPU
   ranks, alternating plain / profiled (start + cell + stop + merge + write), n rounds. Reported:
   the cell's own time under the profiler, and the whole profiled round trip, against plain.
2. Experiment: `run(ddp, profile=...)` vs `run(ddp)` alternating; median step_ms of each.
Profiling off is not measured: with it off no profiler object exists (tests/test_trace.py).

    python bench/bench_profile.py --n 5
"""
from __future__ import annotations

import argparse
import os
import shutil
import statistics
import sys
import tempfile
import time

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))

CELL = """
m = torch.nn.Sequential(*[torch.nn.Linear(256, 256) for _ in range(4)])
for _ in range({steps}):
    m(torch.randn(32, 256)).sum().backward()
    for p in m.parameters():
        dist.all_reduce(p.grad)
"""


def _med(xs: list[float]) -> str:
    return f"{statistics.median(xs):.1f} ({min(xs):.1f}-{max(xs):.1f}) n={len(xs)}"


def bench_cell(n: int, steps: int) -> None:
    from kit.config import LaunchConfig
    from kit.engine.cluster import Cluster
    from kit.engine.trace import write_profiles

    code = CELL.format(steps=steps)
    out = tempfile.mkdtemp(prefix="kit-bench-profile-")
    c = Cluster(LaunchConfig(world_size=2, check_collectives=False)).start()
    plain, cell_on, total_on, events = [], [], [], 0
    try:
        c.run(code).raise_for_error()  # warm-up
        for i in range(n):
            t = time.perf_counter()
            c.run(code).raise_for_error()
            plain.append((time.perf_counter() - t) * 1e3)
            t0 = time.perf_counter()
            c.call("kit.rank.profile:start")
            t1 = time.perf_counter()
            c.run(code).raise_for_error()
            t2 = time.perf_counter()
            trace = write_profiles(c.call("kit.rank.profile:stop"), os.path.join(out, "cell"), "bench")
            total_on.append((time.perf_counter() - t0) * 1e3)
            cell_on.append((t2 - t1) * 1e3)
            events = sum(e["ph"] == "X" for e in trace["traceEvents"])
            print(f"round {i}: plain {plain[-1]:.0f} ms, profiled cell {cell_on[-1]:.0f} ms, with start/stop/merge/"
                  f"write {total_on[-1]:.0f} ms, loadavg {os.getloadavg()[0]:.1f}", flush=True)
    finally:
        c.shutdown()
        shutil.rmtree(out, ignore_errors=True)
    p = statistics.median(plain)
    print(f"cell ({steps} steps, {events:,} spans): plain {_med(plain)} ms; profiled cell {_med(cell_on)} ms "
          f"-> {statistics.median(cell_on) / p:.2f}x; whole profiled round trip {_med(total_on)} ms "
          f"-> {statistics.median(total_on) / p:.2f}x")


def bench_experiment(n: int) -> None:
    from kit.experiments.api import run, shutdown
    from kit.experiments.config import ExperimentConfig

    cfg = ExperimentConfig(strategy="ddp", steps=10, warmup_steps=2)
    path = os.path.join(tempfile.mkdtemp(prefix="kit-bench-profile-"), "exp")
    plain, on = [], []
    try:
        run(cfg)
        for i in range(n):
            plain.append(run(cfg)["summary"]["step_ms"])
            on.append(run(cfg, profile=path)["summary"]["step_ms"])
            print(f"round {i}: step_ms plain {plain[-1]:.1f}, profiled {on[-1]:.1f}, loadavg "
                  f"{os.getloadavg()[0]:.1f}", flush=True)
    finally:
        shutdown()
        shutil.rmtree(os.path.dirname(path), ignore_errors=True)
    print(f"experiment {cfg.label()}: step_ms plain {_med(plain)}; profiled {_med(on)} -> "
          f"{statistics.median(on) / statistics.median(plain):.2f}x")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--n", type=int, default=5)
    ap.add_argument("--steps", type=int, default=20)
    args = ap.parse_args()
    bench_cell(args.n, args.steps)
    bench_experiment(args.n)


if __name__ == "__main__":
    main()
