"""`python -m kit demo`: start ranks, run one all_reduce, print what happened. No Jupyter needed."""
from __future__ import annotations

import argparse
import sys
import time


def demo(world_size: int, device: str) -> int:
    from kit.engine.cluster import Cluster
    from kit.config import LaunchConfig

    t0 = time.perf_counter()
    with Cluster(LaunchConfig(world_size=world_size, device=device)) as cluster:  # type: ignore[arg-type]
        started_s = time.perf_counter() - t0
        if cluster.banner:
            print(cluster.banner)
        print(f"started {world_size} rank(s) in {started_s:.2f} s: backend {cluster.backend} on {cluster.device_type}, "
              f"pids {list(cluster.pids.values())}")
        code = ("t = torch.ones(3, device=device) * (rank + 1)\n"
                "print('before all_reduce:', t.tolist())\n"
                "dist.all_reduce(t)\n"
                "print('after all_reduce: ', t.tolist())\n"
                "t.tolist()")
        print("each rank runs:\n    " + code.replace("\n", "\n    "))
        result = cluster.run(code)
        result.raise_for_error()
        expected = [float(sum(range(1, world_size + 1)))] * 3
        ok = all(v == expected for v in result.values.values())
        print(f"every rank now holds the sum {expected} ({'correct' if ok else 'WRONG'}); "
              f"the cell took {result.elapsed_s * 1e3:.1f} ms")
        t1 = time.perf_counter()
        for _ in range(20):
            cluster.run("None", on_output=lambda *a: None)
        print(f"a trivial cell round trip to all ranks: {(time.perf_counter() - t1) / 20 * 1e3:.2f} ms")
    print(NEXT)
    return 0 if ok else 1


NEXT = """
next:
  jupyter lab lessons/      then open 00_quickstart.ipynb (ranks, a first all_reduce, errors, the lab bench)
                            (as root: jupyter lab --allow-root lessons/)
  in any notebook:          %load_ext kit, then a cell that starts with %%distributed --cpus 2
  the lab bench:            from kit.widgets import lab_bench; lab_bench()     (knobs, Run, measured plots)
  the planner:              from kit.widgets import plan_panel; plan_panel()   (a model on N GPUs, predicted)"""


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m kit", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    d = sub.add_parser("demo", help="start ranks, all_reduce, print the result")
    d.add_argument("--ranks", type=int, default=2, help="number of ranks (default 2)")
    d.add_argument("--gpus", action="store_true", help="use GPUs with NCCL when there are enough")
    args = parser.parse_args(argv)
    return demo(args.ranks, "gpu" if args.gpus else "cpu")


if __name__ == "__main__":
    sys.exit(main())
