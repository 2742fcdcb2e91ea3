"""The floor for a fresh 2-rank gloo group: import torch, init gloo from env://, one all_reduce, exit.

    torchrun --nproc-per-node 2 --master-port PORT bench/floor_torchrun.py

Rank 0 prints the all_reduce result. With FLOOR_MEM_REPORT=1 each rank also prints one
`FLOORMEM {json}` line with its own VmRSS and Pss (MiB) after the all_reduce, before
tearing down (bench_memory.py uses it as the "bare process" reference).
"""
import json
import os

import torch
import torch.distributed as dist


def _proc_mib(path: str, key: str) -> float:
    with open(path) as f:
        for line in f:
            if line.startswith(key):
                return int(line.split()[1]) / 1024
    return float("nan")


dist.init_process_group("gloo")
t = torch.ones(1)
dist.all_reduce(t)
if dist.get_rank() == 0:
    print(f"all_reduce -> {t.item():.0f} (world {dist.get_world_size()})", flush=True)
if os.environ.get("FLOOR_MEM_REPORT") == "1":
    dist.barrier()  # both ranks fully up before measuring
    print("FLOORMEM " + json.dumps({"rank": dist.get_rank(), "pid": os.getpid(),
                                    "threads": torch.get_num_threads(),
                                    "rss_mib": _proc_mib("/proc/self/status", "VmRSS:"),
                                    "pss_mib": _proc_mib("/proc/self/smaps_rollup", "Pss:")}), flush=True)
    dist.barrier()
dist.destroy_process_group()
