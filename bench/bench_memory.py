"""Memory: the kernel with the extension loaded, and each rank against a bare torch+gloo process.

    python bench/bench_memory.py [--n 3] [--quick] [--json out.json]

Per rep, a fresh kernel:
  kernel VmRSS before `%load_ext kit`, after it, after the first `%%distributed --cpus 2` cell
  (an all_reduce whose tensor value is shown), and after 10 more cells (plain and repr-showing);
  then whether `torch` is in the kernel's sys.modules (it must not be: reprs come back as text).
  Each rank (`python -m kit.rank.worker`) after those cells.
Then, with the kit processes gone, the bare reference: 2 fresh `python bench/floor_torchrun.py`
ranks started directly (env://, same OMP_NUM_THREADS as the kit's ranks), each reporting its own
memory after init + one all_reduce.
Criterion is VmRSS (/proc/PID/status): it does not depend on who else maps the same libraries.
Pss (/proc/PID/smaps_rollup) is shown for reference only: it splits shared pages among every
process mapping them, including other users' torch processes on a shared machine.
Targets: kernel growth <= 50 MB (10^6 bytes) at load and after the first cell; each rank <= 1.10x
the bare process.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _kernel import BENCH_DIR, Kernel, descendants, fmt, free_port, loadavg, pss_mib, rss_mib, summary, verdict  # noqa: E402

KERNEL_LIMIT_MIB = 50e6 / 2**20  # 50 MB
RANK_LIMIT = 1.10
FIRST = "%%distributed --cpus 2\nt = torch.ones(1)\ndist.all_reduce(t)\nt"
MORE = ["%%distributed\nx = 1", "%%distributed\nt * 2", "%%distributed\nlist(range(5))", "x = 1"]


def settle() -> None:
    time.sleep(0.5)  # let the kernel finish post-execute work before reading /proc


def kit_workers(kernel_pid: int) -> list[int]:
    out = []
    for pid in descendants(kernel_pid):
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                if b"kit.rank.worker" in f.read():
                    out.append(pid)
        except OSError:
            pass
    return out


def kit_rep() -> dict:
    k = Kernel()
    try:
        settle()
        rec = {"kernel_before": rss_mib(k.pid)}
        k.must("%load_ext kit")
        settle()
        rec["kernel_after_load"] = rss_mib(k.pid)
        r = k.must(FIRST, timeout=180)
        if "2." not in r["text"]:
            raise RuntimeError("unexpected first-cell output: " + r["text"][-300:])
        settle()
        rec["kernel_after_first"] = rss_mib(k.pid)
        for i in range(10):
            k.must(MORE[i % len(MORE)])
        settle()
        rec["kernel_after_11"] = rss_mib(k.pid)
        rec["kernel_pss_after_11"] = pss_mib(k.pid)
        r = k.must("import sys as _s; print('TORCH_IN_KERNEL', 'torch' in _s.modules)")
        rec["torch_in_kernel"] = "TORCH_IN_KERNEL True" in r["text"]
        pids = kit_workers(k.pid)
        if len(pids) != 2:
            raise RuntimeError(f"expected 2 kit.rank.worker processes under the kernel, found {pids}")
        rec["worker_rss"] = [rss_mib(p) for p in pids]
        rec["worker_pss"] = [pss_mib(p) for p in pids]
        r = k.must("%%distributed\nimport torch as _t; _t.get_num_threads()")
        rec["worker_threads"] = r["text"].strip()
        return rec
    finally:
        k.shutdown()


def bare_rep(threads: int) -> list[dict]:
    port = free_port()
    env = dict(os.environ, MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), WORLD_SIZE="2", LOCAL_WORLD_SIZE="2",
               OMP_NUM_THREADS=str(threads), FLOOR_MEM_REPORT="1")
    procs = [subprocess.Popen([sys.executable, os.path.join(BENCH_DIR, "floor_torchrun.py")],
                              env=dict(env, RANK=str(r), LOCAL_RANK=str(r)), stdout=subprocess.PIPE, text=True,
                              cwd="/tmp") for r in range(2)]
    try:
        outs = [p.communicate(timeout=180)[0] for p in procs]
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
    if any(p.returncode for p in procs):
        raise RuntimeError(f"bare ranks failed: {[p.returncode for p in procs]} {outs}")
    return [json.loads(line[9:]) for o in outs for line in o.splitlines() if line.startswith("FLOORMEM ")]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--n", type=int, default=3)
    ap.add_argument("--quick", action="store_true", help="smoke run: 1 rep")
    ap.add_argument("--json", help="write the raw reps here")
    a = ap.parse_args()
    n = 1 if a.quick else a.n
    from kit.config import LaunchConfig

    threads = LaunchConfig(world_size=2).threads
    print(f"memory bench: {n} reps (kit kernel, then bare ranks with OMP_NUM_THREADS={threads}), load {loadavg()}",
          flush=True)
    kits, bares = [], []
    for i in range(n):
        kits.append(kit_rep())
        bares.extend(bare_rep(threads))
        print(f"  rep {i + 1}/{n}: kernel {kits[-1]['kernel_before']:.0f} -> {kits[-1]['kernel_after_load']:.0f} -> "
              f"{kits[-1]['kernel_after_first']:.0f} -> {kits[-1]['kernel_after_11']:.0f} MiB, ranks "
              f"{[round(x) for x in kits[-1]['worker_rss']]} MiB, bare "
              f"{[round(b['rss_mib']) for b in bares[-2:]]} MiB  [load {loadavg()}]", flush=True)

    def col(key: str) -> dict:
        return summary([r[key] for r in kits])

    grow_load = summary([r["kernel_after_load"] - r["kernel_before"] for r in kits])
    grow_first = summary([r["kernel_after_first"] - r["kernel_before"] for r in kits])
    grow_11 = summary([r["kernel_after_11"] - r["kernel_before"] for r in kits])
    w_rss = summary([x for r in kits for x in r["worker_rss"]])
    w_pss = summary([x for r in kits for x in r["worker_pss"]])
    b_rss = summary([b["rss_mib"] for b in bares])
    b_pss = summary([b["pss_mib"] for b in bares])
    rows = [
        ("kernel VmRSS before %load_ext kit", col("kernel_before")),
        ("kernel VmRSS after %load_ext kit", col("kernel_after_load")),
        ("kernel VmRSS after first %%distributed cell", col("kernel_after_first")),
        ("kernel VmRSS after 11 cells", col("kernel_after_11")),
        ("  growth at %load_ext", grow_load),
        ("  growth after first cell (vs before load)", grow_first),
        ("  growth after 11 cells (vs before load)", grow_11),
        ("kit rank VmRSS (each)", w_rss),
        ("bare torch+gloo rank VmRSS (each)", b_rss),
        ("kit rank Pss (reference)", w_pss),
        ("bare rank Pss (reference)", b_pss),
    ]
    print(f"\n{'what':48} median MiB (min-max) n")
    for name, s in rows:
        print(f"{name:48} {fmt(s, 1, 'MiB', 1)}")
    torch_in = any(r["torch_in_kernel"] for r in kits)
    print(f"\nthreads per rank: kit {kits[-1]['worker_threads'].replace(chr(10), ' ')} ; bare "
          f"{sorted({b['threads'] for b in bares})}")
    print(f"kernel memory at load: +{grow_load['max']:.1f} MiB worst of {grow_load['n']} "
          f"(target <= {KERNEL_LIMIT_MIB:.1f} MiB = 50 MB) {verdict(grow_load['max'] <= KERNEL_LIMIT_MIB)}")
    print(f"kernel memory after first cell: +{grow_first['max']:.1f} MiB worst; torch imported into the kernel: "
          f"{'YES' if torch_in else 'no'} {verdict(grow_first['max'] <= KERNEL_LIMIT_MIB and not torch_in)}")
    ratio = w_rss["max"] / b_rss["median"]
    print(f"rank memory: kit worst rank {w_rss['max']:.0f} MiB vs bare {b_rss['median']:.0f} MiB VmRSS -> "
          f"{ratio:.3f}x (target <= {RANK_LIMIT:.2f}x) {verdict(ratio <= RANK_LIMIT)}")
    print(f"rank memory (median/median): {w_rss['median'] / b_rss['median']:.3f}x RSS, "
          f"{w_pss['median'] / b_pss['median']:.3f}x Pss (reference)")
    if a.json:
        with open(a.json, "w") as f:
            json.dump({"kit": kits, "bare": bares}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
