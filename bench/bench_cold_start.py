"""Cold start: `%%distributed --cpus 2` to the first all_reduce result, against bare torchrun.

    python bench/bench_cold_start.py [--n 7] [--quick] [--json out.json]

One rep runs, in this order (paired, alternating):
  A  kit in a real kernel: fresh ipykernel (start not timed), `%load_ext kit` (timed apart),
     then the first cell `%%distributed --cpus 2` + all_reduce, submit -> idle   <- the figure
  B  `torchrun --nproc-per-node 2 bench/floor_torchrun.py` timed as a whole process
  C  reference: a fresh `python` doing Cluster.start() + the first run (whole process, and the
     start/run split measured inside it)
  D  reference: a fresh `python -c "import torch, torch.distributed"` (the per-rank import floor)
One unrecorded warm-up rep comes first (page cache). Ratio = median(A) / median(B); the
per-rep paired ratios A_i / B_i are printed too. Target: <= 1.10x.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _kernel import BENCH_DIR, Kernel, fmt, free_port, loadavg, summary, verdict  # noqa: E402

TARGET = 1.10
KIT_CELL = "%%distributed --cpus 2\nt = torch.ones(1)\ndist.all_reduce(t)\nt.item()"
PLAIN = """
import json, time
t0 = time.perf_counter()
from kit.engine.cluster import Cluster
from kit.config import LaunchConfig
c = Cluster(LaunchConfig(world_size=2, device="cpu"))
t1 = time.perf_counter(); c.start(); t2 = time.perf_counter()
r = c.run("t = torch.ones(1); dist.all_reduce(t); t.item()", on_output=lambda *a: None)
t3 = time.perf_counter()
assert r.values == {0: 2.0, 1: 2.0}, r.values
c.shutdown()
print("PLAIN " + json.dumps({"import_s": t1 - t0, "start_s": t2 - t1, "first_run_s": t3 - t2, "to_result_s": t3 - t0}))
"""


def torchrun_cmd() -> list[str]:
    exe = os.path.join(os.path.dirname(sys.executable), "torchrun")  # the real entry point, not a pyenv shim
    if not os.path.exists(exe):
        exe_list = [sys.executable, "-m", "torch.distributed.run"]
    else:
        exe_list = [exe]
    return exe_list + ["--nproc-per-node", "2", "--master-port", str(free_port()),
                       os.path.join(BENCH_DIR, "floor_torchrun.py")]


def env_for_children() -> dict[str, str]:
    env = dict(os.environ)
    env.pop("OMP_NUM_THREADS", None)  # torchrun sets 1 per rank itself; the kit sets cores / ranks
    return env


def run_kit_kernel() -> dict[str, float]:
    k = Kernel()
    try:
        time.sleep(0.3)
        load = k.must("%load_ext kit")
        r = k.must(KIT_CELL, timeout=180)
        if "2.0" not in r["text"]:
            raise RuntimeError(f"unexpected output: {r['text'][-500:]}")
        return {"load_ext_s": load["wall_s"], "cell_s": r["wall_s"], "kernel_start_s": k.startup_s}
    finally:
        k.shutdown()


def run_timed(cmd: list[str], expect: str) -> tuple[float, str]:
    time.sleep(0.3)
    t0 = time.perf_counter()
    p = subprocess.run(cmd, capture_output=True, text=True, env=env_for_children(), cwd="/tmp", timeout=300)
    wall = time.perf_counter() - t0
    if p.returncode != 0 or expect not in p.stdout:
        raise RuntimeError(f"{cmd} failed rc={p.returncode}:\n{p.stdout[-1000:]}\n{p.stderr[-2000:]}")
    return wall, p.stdout


def one_rep() -> dict[str, float]:
    rec: dict[str, float] = {}
    rec.update({"A_" + k: v for k, v in run_kit_kernel().items()})
    rec["B_torchrun_s"], _ = run_timed(torchrun_cmd(), "all_reduce -> 2")
    wall, out = run_timed([sys.executable, "-c", PLAIN], "PLAIN ")
    rec["C_plain_process_s"] = wall
    rec.update({"C_" + k: v for k, v in json.loads(out.split("PLAIN ", 1)[1]).items()})
    rec["D_import_torch_s"], _ = run_timed([sys.executable, "-c", "import torch, torch.distributed; print('ok')"], "ok")
    return rec


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--n", type=int, default=7, help="counted reps (>= 5 for the report)")
    ap.add_argument("--quick", action="store_true", help="smoke run: 2 reps, no warm-up")
    ap.add_argument("--json", help="write the raw reps here")
    a = ap.parse_args()
    n, warm = (2, 0) if a.quick else (a.n, 1)
    print(f"cold start bench: {n} paired reps (+{warm} warm-up), load {loadavg()}", flush=True)
    reps = []
    for i in range(warm + n):
        rec = one_rep()
        tag = "warm-up" if i < warm else f"rep {i - warm + 1}/{n}"
        print(f"  {tag}: kit cell {rec['A_cell_s']:.3f} s (load_ext {rec['A_load_ext_s']:.3f}), torchrun "
              f"{rec['B_torchrun_s']:.3f} s, plain-python start+run {rec['C_start_s'] + rec['C_first_run_s']:.3f} s, "
              f"import torch {rec['D_import_torch_s']:.3f} s  [load {loadavg()}]", flush=True)
        if i >= warm:
            reps.append(rec)
    col = {k: summary([r[k] for r in reps]) for k in reps[0]}
    A = col["A_cell_s"]
    A2 = summary([r["A_load_ext_s"] + r["A_cell_s"] for r in reps])
    B = col["B_torchrun_s"]
    paired = summary([r["A_cell_s"] / r["B_torchrun_s"] for r in reps])
    rows = [
        ("kit: first %%distributed --cpus 2 cell (submit->idle)", A),
        ("kit: %load_ext kit (submit->idle)", col["A_load_ext_s"]),
        ("kit: %load_ext + first cell", A2),
        ("torchrun --nproc-per-node 2 floor_torchrun.py (process)", B),
        ("plain python: Cluster.start()", col["C_start_s"]),
        ("plain python: first run (all_reduce)", col["C_first_run_s"]),
        ("plain python: whole process", col["C_plain_process_s"]),
        ("python -c 'import torch, torch.distributed' (process)", col["D_import_torch_s"]),
        ("(kernel start, not counted)", col["A_kernel_start_s"]),
    ]
    print(f"\n{'what':58} median s (min-max) n")
    for name, s in rows:
        print(f"{name:58} {fmt(s)}")
    ratio = A["median"] / B["median"]
    print(f"\npaired ratio kit/torchrun per rep: {fmt(paired, unit='x', digits=2)}")
    print(f"cold start: kit {A['median']:.2f} s vs torchrun {B['median']:.2f} s -> {ratio:.2f}x "
          f"(target <= {TARGET:.2f}x) {verdict(ratio <= TARGET)}")
    r2 = A2["median"] / B["median"]
    print(f"cold start incl. %load_ext: kit {A2['median']:.2f} s vs torchrun {B['median']:.2f} s -> {r2:.2f}x "
          f"(target <= {TARGET:.2f}x) {verdict(r2 <= TARGET)}")
    imp = col["D_import_torch_s"]["median"]
    print(f"reference: Cluster.start()+first run {col['C_start_s']['median'] + col['C_first_run_s']['median']:.2f} s "
          f"in plain Python; kit cell - import torch floor = {A['median'] - imp:.2f} s")
    if a.json:
        with open(a.json, "w") as f:
            json.dump({"reps": reps, "n": n}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
