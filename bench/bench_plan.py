"""How fast is planning, and what does it say? plan() over every layout of a 1024-GPU cluster.

    python bench/bench_plan.py          # 7 reps of each case; prints the top 3 of each and the timings

Target: planning every layout of a 1024-GPU cluster takes well under a second (< 0.5 s median),
without importing torch (checked: `torch` not in sys.modules at the end). The CPU time of each plan
(time.process_time) is printed beside the wall time: on a shared machine the wall time is mostly the
load, the CPU time what the plan itself costs. Everything printed besides the timings is predicted.
"""
from __future__ import annotations

import os
import statistics
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from kit.experiments import plan  # noqa: E402

CASES = (("llama3-8b", 1), ("llama3-70b", 8), ("llama3-70b", 128), ("llama3-405b", 128), ("mixtral-8x7b", 4))


def main() -> int:
    times: dict[str, list[float]] = {}
    cpu: dict[str, list[float]] = {}
    for name, nodes in CASES:
        key = f"{name} on {nodes * 8} H100"
        for _ in range(7):
            t0, c0 = time.perf_counter(), time.process_time()
            p = plan(name, nodes=nodes, gpus_per_node=8, accelerator="h100", seq_len=4096)
            times.setdefault(key, []).append(time.perf_counter() - t0)
            cpu.setdefault(key, []).append(time.process_time() - c0)
        print(f"\n== {key}: {p.considered} layouts, {len(p)} fit\n{p.table(3)}")
    print(f"\nloadavg {os.getloadavg()[0]:.1f}; planning time median (min-max) of 7, wall and CPU:")
    for key, ts in times.items():
        cs = cpu[key]
        print(f"  {key:28s} {statistics.median(ts) * 1e3:7.0f} ms ({min(ts) * 1e3:.0f}-{max(ts) * 1e3:.0f}); "
              f"CPU {statistics.median(cs) * 1e3:.0f} ms ({min(cs) * 1e3:.0f}-{max(cs) * 1e3:.0f})")
    worst = statistics.median(times["llama3-70b on 1024 H100"])
    ok = worst < 0.5 and "torch" not in sys.modules
    print(f"1024 GPUs: {worst * 1e3:.0f} ms (target < 500 ms), torch imported: {'torch' in sys.modules} -> "
          f"{'PASS' if ok else 'FAIL'}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
