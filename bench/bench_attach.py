"""Attached ranks (torchrun, over TCP) against local ranks (socketpair and pipes), 2 gloo CPU ranks:
start-up (attach) time, warm trivial cell round trip, output throughput over the control connection.

    python bench/bench_attach.py [--cells 200] [--mib 32]
"""
from __future__ import annotations

import argparse
import statistics
import tempfile
import time

from kit import Cluster, LaunchConfig

QUIET = lambda *a: None  # noqa: E731


def measure(config: LaunchConfig, cells: int, mib: int) -> dict[str, float]:
    t0 = time.perf_counter()
    c = Cluster(config).start()
    start_s = time.perf_counter() - t0
    try:
        for _ in range(20):
            c.run("pass", on_output=QUIET, check=False)
        rtts = []
        for _ in range(cells):
            t = time.perf_counter()
            c.run("pass", on_output=QUIET, check=False)
            rtts.append(time.perf_counter() - t)
        code = (f"import os\nchunk = b'x' * 1023 + b'\\n'\nblock = chunk * 1024\n"
                f"for _ in range({mib}):\n    os.write(1, block)")
        t = time.perf_counter()
        r = c.run(code, on_output=QUIET, check=False)
        out_s = time.perf_counter() - t
        assert r.ok, r.failures
    finally:
        c.shutdown()
    # both ranks write `mib` MiB each; the kernel receives (and counts) all of it
    return {"start_s": start_s, "rtt_ms": statistics.median(rtts) * 1e3, "throughput_mib_s": 2 * mib / out_s}


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--cells", type=int, default=200)
    p.add_argument("--mib", type=int, default=32)
    args = p.parse_args()
    key_file = tempfile.mkdtemp() + "/kit.key"
    local = measure(LaunchConfig(world_size=2), args.cells, args.mib)
    attached = measure(LaunchConfig(world_size=2, launcher="torchrun", key_file=key_file), args.cells, args.mib)
    for name, res in (("local", local), ("attached (torchrun)", attached)):
        print(f"{name:20s} start {res['start_s']:.2f} s, warm trivial cell {res['rtt_ms']:.2f} ms (median of "
              f"{args.cells}), output {res['throughput_mib_s']:.0f} MiB/s")
    print(f"attached / local: cell {attached['rtt_ms'] / local['rtt_ms']:.2f}x, output "
          f"{attached['throughput_mib_s'] / local['throughput_mib_s']:.2f}x")


if __name__ == "__main__":
    main()
