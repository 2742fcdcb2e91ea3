"""How fast is planning, and what does it say? plan() over every layout of a 1024-GPU cluster.

    python bench/bench_plan.py          # 7 reps of each case; prints the top 3 of each and the timings

Target: planning every layout of a 1024-GPU cluster takes well under a second (< 0.5 s median),
without importing torch (checked: `torch` not in sys.modules at the end). Everything printed
besides the timings is predicted, not measured.
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
    for name, nodes in CASES:
        key = f"{name} on {nodes * 8} H100"
        for _ in range(7):
            t0 = time.perf_counter()
            p = plan(name, nodes=nodes, gpus_per_node=8, accelerator="h100", seq_len=4096)
            times.setdefault(key, []).append(time.perf_counter() - t0)
        print(f"\n== {key}: {p.considered} layouts, {len(p)} fit\n{p.table(3)}")
    print(f"\nloadavg {os.getloadavg()[0]:.1f}; planning time median (min-max) of 7:")
    for key, ts in times.items():
        print(f"  {key:28s} {statistics.median(ts) * 1e3:7.0f} ms ({min(ts) * 1e3:.0f}-{max(ts) * 1e3:.0f})")
    worst = statistics.median(times["llama3-70b on 1024 H100"])
    ok = worst < 0.5 and "torch" not in sys.modules
    print(f"1024 GPUs: {worst * 1e3:.0f} ms (target < 500 ms), torch imported: {'torch' in sys.modules} -> "
          f"{'PASS' if ok else 'FAIL'}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
