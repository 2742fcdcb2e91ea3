"""Warm trivial-cell round trip with 2 ranks, kit against ipyparallel and nbdistributed, side by side.

    python bench/bench_warm_cell.py [--rounds 60] [--quick] [--only kit-inproc,kit-kernel,...] [--json out]

Everything is started first, then the cells are interleaved round-robin (one cell per tool
per round; the in-process engine gets --inproc-per-round runs per round), so machine noise
falls on every tool alike. Tools:
  kit-inproc   kit.Cluster.run("None") from this process (the engine's round trip)
  kit-kernel   a real kernel: `%%distributed` cell `x = 1`, execute_request -> idle
  kit-magic-inside  the same magic call timed inside that kernel with perf_counter (kit's own share,
               without Jupyter messaging; diagnostic)
  plain-kernel the same kernel, a plain local cell `x = 1` (the Jupyter floor)
  ipyparallel  `%px x = 1` in a kernel of the anchor venv, cluster of 2 engines
  nbd-magic    nbdistributed `%%distributed` cell `x = 1` in a kernel of the anchor venv
  nbd-auto     nbdistributed auto mode: a plain cell `x = 1` (sent to the workers)
Anchors need the throwaway venv (KIT_ANCHOR_VENV, default /tmp/anchor-venv):
    python -m venv --system-site-packages /tmp/anchor-venv
    echo "torch==2.13.0+cpu" > /tmp/c.txt && /tmp/anchor-venv/bin/pip install -c /tmp/c.txt ipyparallel nbdistributed
A missing anchor is skipped with the reason. Teardown is by pid only (nbdistributed's
%dist_shutdown / %dist_reset run `pkill -f` on broad patterns and are never called).
Target: engine round trip (kit-inproc) median < 3 ms.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time
from typing import Callable

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _kernel import ANCHOR_VENV, Kernel, anchor_python, descendants, end_pids, fmt, has_module, loadavg, summary, verdict  # noqa: E402

TARGET_S = 0.003
ALL = ["kit-inproc", "kit-kernel", "kit-magic-inside", "plain-kernel", "ipyparallel", "nbd-magic", "nbd-auto"]


class Tool:
    name = ""

    def __init__(self) -> None:
        self.times: list[float] = []
        self.cleanups: list[Callable[[], object]] = []

    def one(self) -> None:
        raise NotImplementedError

    def close(self) -> None:
        for fn in reversed(self.cleanups):
            try:
                fn()
            except Exception as e:  # keep tearing down the rest
                print(f"  teardown {self.name}: {e!r}", file=sys.stderr)


class KitInproc(Tool):
    name = "kit-inproc"

    def __init__(self) -> None:
        super().__init__()
        from kit.engine.cluster import Cluster
        from kit.config import LaunchConfig

        self.c = Cluster(LaunchConfig(world_size=2, device="cpu"))
        self.cleanups.append(self.c.shutdown)
        t0 = time.perf_counter()
        self.c.start()
        self.start_s = time.perf_counter() - t0
        self.noop = lambda *a: None
        self.c.run("t = torch.ones(1); dist.all_reduce(t)", on_output=self.noop).raise_for_error()

    def one(self) -> None:
        t0 = time.perf_counter()
        r = self.c.run("None", on_output=self.noop)
        dt = time.perf_counter() - t0
        if r.failures:
            raise RuntimeError(f"kit-inproc cell failed: {r.failures}")
        self.times.append(dt)


class KernelTool(Tool):
    code = ""

    def __init__(self, kernel: Kernel) -> None:
        super().__init__()
        self.k = kernel

    def one(self) -> None:
        r = self.k.run(self.code, timeout=60)
        if r["status"] != "ok" or "Timeout waiting" in r["text"] or "rror" in r["text"]:
            raise RuntimeError(f"{self.name}: {r['status']} {r['text'][-500:]}")
        self.times.append(r["wall_s"])


class InsideTimed(KernelTool):
    """Runs a cell that times something inside the kernel and prints `INSIDE <seconds>`."""

    def one(self) -> None:
        r = self.k.run(self.code, timeout=60)
        if r["status"] != "ok" or "INSIDE " not in r["text"]:
            raise RuntimeError(f"{self.name}: {r['status']} {r['text'][-500:]}")
        self.times.append(float(r["text"].split("INSIDE ", 1)[1].split()[0]))


def kit_kernel() -> tuple[Kernel, list[Tool]]:
    k = Kernel()
    k.must("%load_ext kit")
    k.must("%%distributed --cpus 2\nt = torch.ones(1)\ndist.all_reduce(t)", timeout=180)
    k.must("import time as _time")
    a, b, c = KernelTool(k), KernelTool(k), InsideTimed(k)
    a.name, a.code = "kit-kernel", "%%distributed\nx = 1"
    b.name, b.code = "plain-kernel", "x = 1"
    c.name, c.code = "kit-magic-inside", ("_t0 = _time.perf_counter(); get_ipython().run_cell_magic('distributed', '', "
                                          "'x = 1'); print('INSIDE', _time.perf_counter() - _t0)")
    a.cleanups.append(k.shutdown)
    return k, [a, c, b]


def ipyparallel_tools(py: str) -> list[Tool]:
    k = Kernel(python=py)
    t = KernelTool(k)
    t.name, t.code = "ipyparallel", "%px x = 1"
    t.cleanups.append(k.shutdown)
    try:
        k.must("import ipyparallel as ipp\ncluster = ipp.Cluster(n=2, log_level=40)\n"
               "rc = cluster.start_and_connect_sync()\n"
               "_ = rc.wait_for_engines(2, timeout=120)", timeout=180)
        k.must("%px import torch, torch.distributed as dist", timeout=120)
        pids = descendants(k.pid)
        # the cluster's own stop, then by pid whatever is left (Kernel.shutdown does the latter)
        t.cleanups.append(lambda: end_pids(pids))
        t.cleanups.append(lambda: k.run("cluster.stop_cluster_sync()", timeout=60))
    except BaseException:
        t.close()
        raise
    return [t]


def wait_nbd_connected(k: Kernel, world: int, limit_s: float = 30) -> float | None:
    """nbdistributed binds its ROUTER only after a fixed 2 s sleep; workers reconnect ~0.1 s later.
    A cell sent before they connect is silently dropped (30 s timeout), so wait for the sockets."""
    import psutil

    t0 = time.perf_counter()
    kp = psutil.Process(k.pid)
    while time.perf_counter() - t0 < limit_s:
        listen = {c.laddr.port for c in kp.net_connections("tcp") if c.status == "LISTEN"}
        n = 0
        for ch in kp.children(recursive=True):
            try:
                if any(c.status == "ESTABLISHED" and c.raddr and c.raddr.port in listen
                       for c in ch.net_connections("tcp")):
                    n += 1
            except psutil.Error:
                pass
        if n >= world:
            return time.perf_counter() - t0
        time.sleep(0.05)
    return None


def nbd_tools(py: str) -> list[Tool]:
    k = Kernel(python=py)
    a, b = KernelTool(k), KernelTool(k)
    a.name, a.code = "nbd-magic", "%%distributed\nx = 1"
    b.name, b.code = "nbd-auto", "x = 1"
    a.cleanups.append(k.shutdown)
    try:
        k.must("%load_ext nbdistributed")
        r = k.must("%dist_init -n 2", timeout=180)
        if "Successfully started" not in r["text"]:
            raise RuntimeError("nbdistributed %dist_init failed:\n" + r["text"][-1500:])
        pids = descendants(k.pid)
        a.cleanups.append(lambda: end_pids(pids))
        # never %dist_shutdown / %dist_reset (pkill -f); stop its own processes by pid
        # (cleanups run last-in first-out: auto mode off, then its ProcessManager stops the workers)
        a.cleanups.append(lambda: k.run(
            "_m = get_ipython().magics_manager.registry['DistributedMagic']\n"
            "_m._process_manager.shutdown() if _m._process_manager else None\n"
            "_m._comm_manager.shutdown() if _m._comm_manager else None", timeout=60))
        a.cleanups.append(lambda: k.run("%dist_mode --disable", timeout=30))
        if wait_nbd_connected(k, 2) is None:
            raise RuntimeError("nbdistributed workers did not connect within 30 s")
        time.sleep(0.2)
        for _ in range(3):
            r = k.run("x = 1", timeout=60)
            if r["status"] == "ok" and "Timeout waiting" not in r["text"]:
                break
        else:
            raise RuntimeError("nbdistributed first cell failed: " + r["text"][-500:])
    except BaseException:
        a.close()
        raise
    return [a, b]


def setup(only: list[str]) -> tuple[list[Tool], list[Tool], list[str]]:
    """Returns (tools to measure, every tool made (to close), skip reasons)."""
    made: list[Tool] = []
    skipped: list[str] = []

    def want(*names: str) -> bool:
        return any(n in only for n in names)

    try:
        if want("kit-inproc"):
            t = KitInproc()
            print(f"  kit-inproc: Cluster.start() {t.start_s:.2f} s", flush=True)
            made.append(t)
        if want("kit-kernel", "kit-magic-inside", "plain-kernel"):
            made += kit_kernel()[1]
        py = anchor_python()
        for label, names, make in (("ipyparallel", ("ipyparallel",), ipyparallel_tools),
                                   ("nbdistributed", ("nbd-magic", "nbd-auto"), nbd_tools)):
            if not want(*names):
                continue
            if py is None:
                skipped.append(f"{label}: skipped, no anchor venv at {ANCHOR_VENV} (see this script's docstring)")
                continue
            ok, why = has_module(py, label)
            if not ok:
                skipped.append(f"{label}: skipped, not installed in {ANCHOR_VENV} ({why})")
                continue
            try:
                made += make(py)
            except Exception as e:
                skipped.append(f"{label}: skipped, start-up failed: {str(e)[-300:]}")
    except BaseException:
        for t in made:
            t.close()
        raise
    return [t for t in made if t.name in only], made, skipped


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rounds", type=int, default=60, help="cells per tool (one per round)")
    ap.add_argument("--warmup", type=int, default=10, help="uncounted rounds first")
    ap.add_argument("--inproc-per-round", type=int, default=4)
    ap.add_argument("--only", default=",".join(ALL), help="comma list of " + ",".join(ALL))
    ap.add_argument("--quick", action="store_true", help="smoke run: 10 rounds, 3 warm-up")
    ap.add_argument("--json", help="write raw times here")
    a = ap.parse_args()
    only = [s.strip() for s in a.only.split(",") if s.strip()]
    bad = [s for s in only if s not in ALL]
    if bad:
        ap.error(f"unknown tool(s) {bad}; choose from {ALL}")
    rounds, warmup = (10, 3) if a.quick else (a.rounds, a.warmup)
    print(f"warm cell bench: {rounds} rounds (+{warmup} warm-up), tools {only}, load {loadavg()}", flush=True)
    tools, made, skipped = setup(only)
    for s in skipped:
        print("  " + s, flush=True)
    try:
        for i in range(warmup + rounds):
            for t in tools:
                for _ in range(a.inproc_per_round if t.name == "kit-inproc" else 1):
                    t.one()
            if i == warmup - 1:
                for t in tools:
                    t.times.clear()
    finally:
        for t in made:
            t.close()
    print(f"  done, load {loadavg()}")
    stats = {t.name: summary(t.times) for t in tools}
    print(f"\n{'tool (2 ranks, warm)':58} median ms (min-max) n      p90 ms")
    for t in tools:
        s = stats[t.name]
        print(f"{t.name + ': ' + describe(t.name):58} {fmt(s, 1e3, 'ms', 2):34} {s['p90'] * 1e3:.2f}")
    if "kit-inproc" in stats:
        m = stats["kit-inproc"]["median"]
        print(f"\nwarm cell (engine): kit Cluster.run('None') {m * 1e3:.2f} ms (target < {TARGET_S * 1e3:.0f} ms) "
              f"{verdict(m < TARGET_S)}")
    if "kit-kernel" in stats:
        m = stats["kit-kernel"]["median"]
        if "plain-kernel" in stats:
            p = stats["plain-kernel"]["median"]
            print(f"warm cell (kernel): kit %%distributed {m * 1e3:.2f} ms vs plain kernel cell {p * 1e3:.2f} ms -> "
                  f"kit adds {(m - p) * 1e3:.2f} ms (target < {TARGET_S * 1e3:.0f} ms) {verdict(m - p < TARGET_S)}")
        if "kit-magic-inside" in stats:
            print(f"  of which the magic itself (timed inside the kernel): {stats['kit-magic-inside']['median'] * 1e3:.2f} ms")
        for other in ("ipyparallel", "nbd-magic", "nbd-auto"):
            if other in stats:
                o = stats[other]["median"]
                print(f"warm cell: kit {m * 1e3:.2f} ms vs {other} {o * 1e3:.2f} ms -> {m / o:.2f}x")
    if a.json:
        with open(a.json, "w") as f:
            json.dump({t.name: t.times for t in tools} | {"skipped": skipped}, f)
    return 0


def describe(name: str) -> str:
    return {"kit-inproc": "Cluster.run('None')", "kit-kernel": "%%distributed x = 1",
            "plain-kernel": "x = 1 (no magic)", "kit-magic-inside": "magic timed inside the kernel", "ipyparallel": "%px x = 1",
            "nbd-magic": "%%distributed x = 1", "nbd-auto": "x = 1 (auto mode)"}[name]


if __name__ == "__main__":
    sys.exit(main())
