"""Kit DDP step time vs a plain torchrun script of the same model and batch (target <= 1.03x).

    python bench/bench_ddp_vs_torchrun.py

Runs, alternating to share the machine's noise: (a) this file under `torchrun --standalone
--nproc-per-node 2` (a nanoGPT-style loop: DDP, Adam, DataLoader, perf_counter per step), and
(b) `kit.experiments.run` with instrument=False and instrument=True on the kit's ranks.
Both report the mean step time over the same number of post-warm-up steps.
"""
from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import time

STEPS, WARMUP, BATCH, REPEATS = 30, 5, 32, 3


def worker() -> None:
    import torch
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel as DDP

    from kit.experiments import build_workload, make_loader
    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    wl = build_workload("mlp", "small", 0, n_samples=max(512, 4 * BATCH * world))
    model = DDP(wl.model)
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    loader = make_loader(wl.dataset, BATCH, rank, world, 0)
    times, it, epoch = [], iter(loader), 0
    for step in range(WARMUP + STEPS):
        try:
            x, y = next(it)
        except StopIteration:
            epoch += 1
            loader.sampler.set_epoch(epoch)
            it = iter(loader)
            x, y = next(it)
        t0 = time.perf_counter()
        loss = wl.loss(model(x), y)
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        loss.item()
        if step >= WARMUP:
            times.append((time.perf_counter() - t0) * 1e3)
    t = torch.tensor(times)
    dist.all_reduce(t, op=dist.ReduceOp.MAX)  # a step is as slow as its slowest rank (as the kit reports)
    if rank == 0:
        print("RESULT", json.dumps(t.mean().item()))
    dist.destroy_process_group()


def torchrun_ms() -> float:
    env = {**os.environ, "GLOO_SOCKET_IFNAME": "lo", "OMP_NUM_THREADS": "1",
           "PYTHONPATH": os.path.dirname(os.path.dirname(os.path.abspath(__file__)))}
    out = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2",
                          os.path.abspath(__file__), "--worker"], env=env, capture_output=True, text=True, check=True)
    line = [ln for ln in out.stdout.splitlines() if ln.startswith("RESULT")][0]
    return float(line.split()[1])


def main() -> None:
    from kit.experiments import ExperimentConfig, run
    from kit.experiments import shutdown
    base = ExperimentConfig(strategy="ddp", workload="mlp", batch_size=BATCH, steps=STEPS, warmup_steps=WARMUP)
    plain, kit_off, kit_on = [], [], []
    run(base.replace(steps=2))  # start the ranks once (persistent, like a notebook session)
    for _ in range(REPEATS):
        plain.append(torchrun_ms())
        kit_off.append(run(base.replace(instrument=False))["summary"]["step_ms"])
        kit_on.append(run(base)["summary"]["step_ms"])
    shutdown()
    med = statistics.median
    print(f"torchrun plain DDP  step ms (median of {REPEATS}): {med(plain):7.2f}   runs {[round(x, 1) for x in plain]}")
    print(f"kit DDP, instrument=False                      : {med(kit_off):7.2f}   runs {[round(x, 1) for x in kit_off]}")
    print(f"kit DDP, instrument=True                       : {med(kit_on):7.2f}   runs {[round(x, 1) for x in kit_on]}")
    print(f"ratio kit(off)/torchrun = {med(kit_off) / med(plain):.3f}  (target <= 1.03)")
    print(f"ratio kit(on)/torchrun  = {med(kit_on) / med(plain):.3f}")


if __name__ == "__main__":
    worker() if "--worker" in sys.argv else main()
