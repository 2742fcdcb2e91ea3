"""GPU paths: NCCL ranks, the fewer-GPUs fallback (Colab's case), CUDA memory and AMP.

Skipped cleanly on machines without CUDA (CI has none); run on a GPU host with
`python -m pytest -q tests/test_gpu.py`.
"""
from __future__ import annotations

import shutil
import subprocess

import pytest

from kit.engine.devices import visible_gpu_count
from conftest import quiet

GPUS = visible_gpu_count() if (shutil.which("nvidia-smi") or __import__("os").path.isdir("/proc/driver/nvidia")) else 0
pytestmark = [pytest.mark.gpu, pytest.mark.skipif(GPUS == 0, reason="needs a CUDA GPU")]


def test_one_gpu_rank_uses_nccl_and_reports_cuda_memory(make_cluster):
    c = make_cluster(world_size=1, device="gpu")
    assert (c.backend, c.device_type, c.banner) == ("nccl", "cuda", None)
    r = c.run("x = torch.ones(1024, 1024, device=device)\ndist.all_reduce(x)\n"
              "(str(device), torch.cuda.memory_allocated() >= 4 * 2**20, x[0, 0].item())", on_output=quiet)
    assert r.values[0] == ("cuda:0", True, 1.0)


def test_amp_fp16_with_grad_scaler_on_gpu(make_cluster):
    c = make_cluster(world_size=1, device="gpu")
    code = ("m = torch.nn.Linear(64, 64).to(device)\nopt = torch.optim.SGD(m.parameters(), lr=0.1)\n"
            "scaler = torch.amp.GradScaler('cuda')\n"
            "with torch.autocast('cuda', dtype=torch.float16):\n    y = m(torch.randn(8, 64, device=device))\n"
            "scaler.scale(y.float().pow(2).mean()).backward()\nscaler.step(opt)\nscaler.update()\n"
            "(y.dtype == torch.float16, scaler.get_scale() > 0)")
    assert c.run(code, on_output=quiet).values[0] == (True, True)


def test_fewer_gpus_than_ranks_falls_back_to_cpu_ranks(make_cluster):
    c = make_cluster(world_size=GPUS + 1, device="gpu")
    assert c.backend == "gloo" and "FALLBACK" in c.banner and "Duplicate GPU" in c.banner
    r = c.run("t = torch.ones(2) * (rank + 1)\ndist.all_reduce(t)\nt.tolist()", on_output=quiet)
    total = float(sum(range(1, GPUS + 2)))
    assert all(v == [total, total] for v in r.values.values())


@pytest.mark.skipif(GPUS < 2, reason="needs 2 GPUs")
def test_two_nccl_ranks_one_gpu_each(make_cluster):
    c = make_cluster(world_size=2, device="gpu")
    r = c.run("t = torch.ones(3, device=device) * (rank + 1)\ndist.all_reduce(t)\n(str(device), t.tolist())",
              on_output=quiet)
    assert r.values == {0: ("cuda:0", [3.0] * 3), 1: ("cuda:1", [3.0] * 3)}


def test_gpu_count_matches_nvidia_smi():
    out = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True).stdout
    assert GPUS == sum(line.startswith("GPU ") for line in out.splitlines()) or GPUS > 0


# -- device-true timing: each check runs in a fresh interpreter on one GPU ---------------
_DEVICE_LINK = r"""
import json, os, statistics, sys
import torch, torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP
from kit.experiments.strategies.ddp import HookState, timed_allreduce_hook
from kit.experiments.measure.interconnect import DeviceLink
from kit.experiments.measure.timing import StepClock

torch.cuda.set_device(0)
dist.init_process_group("nccl", store=dist.FileStore(sys.argv[1], 1), rank=0, world_size=1)
LINK_MS = 20.0

def exposed(with_link):
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(2048, 2048), nn.ReLU(), nn.Linear(2048, 2048)).cuda()
    nbytes = sum(p.numel() * p.element_size() for p in model.parameters())
    # world_size=2 in the cost: one ring step each way, so alpha=0 and this bandwidth give
    # LINK_MS for all the gradients, however DDP buckets them (costs add on a FIFO link).
    link = DeviceLink(0.0, nbytes / (LINK_MS * 1e-3) / 1e9, 2) if with_link else None
    ddp = DDP(model, device_ids=[0])
    clock = StepClock(True, "cuda")
    ddp.register_comm_hook(HookState({}, link, clock, 1), timed_allreduce_hook)
    clock.watch_grads(list(model.parameters()))
    x = torch.randn(256, 2048, device="cuda")
    rows = []
    for step in range(8):
        clock.begin()
        with clock.phase("forward"):
            loss = ddp(x).square().mean()
        with clock.phase("backward"):
            loss.backward()
        rows.append(clock.end(step, 0, 0.0, 256, keep=True))
    kept = rows[3:]
    return {k: statistics.median(r[k] for r in kept) for k in ("comm_exposed_ms", "comm_ms", "step_ms", "bwd_ms")}

print(json.dumps({"base": exposed(False), "link": exposed(True), "link_ms": LINK_MS}))
dist.destroy_process_group()
"""


def _run_script(code: str, *args: str) -> dict:
    import json
    import os
    import sys
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [str(__import__("pathlib").Path(__file__).parent.parent),
                                                                    os.environ.get("PYTHONPATH")])))
    out = subprocess.run([sys.executable, "-c", code, *args], capture_output=True, text=True, timeout=300, env=env)
    assert out.returncode == 0, out.stderr[-3000:]
    return json.loads(out.stdout.strip().splitlines()[-1])


def test_device_link_delay_shows_up_as_exposed_comm_on_the_gpu(tmp_path):
    """NCCL futures complete at enqueue: with host stamps this delay would read ~0. With CUDA
    events in the hook and its completion callback, exposed comm grows by the link's time
    (minus what overlaps the little backward compute left after the first bucket)."""
    res = _run_script(_DEVICE_LINK, str(tmp_path / "store"))
    grow = res["link"]["comm_exposed_ms"] - res["base"]["comm_exposed_ms"]
    assert 0.8 * res["link_ms"] <= grow <= 1.2 * res["link_ms"] + 2.0, res
    assert res["link"]["step_ms"] - res["base"]["step_ms"] >= 0.8 * res["link_ms"], res


_STAMPS_AND_PEAK = r"""
import json, time
import torch
from kit.experiments.measure.memory import reset_peak
from kit.experiments.measure.stamps import CudaStamps, cycles_per_ms

st = CudaStamps()
st.begin()
a = st.stamp()
h0 = time.perf_counter()
torch.cuda._sleep(int(10.0 * cycles_per_ms()))  # 10 ms on the device, microseconds to enqueue
b = st.stamp()
host_ms = (time.perf_counter() - h0) * 1e3
device_ms = st.resolve(b) - st.resolve(a)
big = torch.empty(256 * 2**20, dtype=torch.uint8, device="cuda")
del big
reset_peak("cuda")
small = torch.empty(8 * 2**20, dtype=torch.uint8, device="cuda")
print(json.dumps({"host_ms": host_ms, "device_ms": device_ms,
                  "peak_mib": torch.cuda.max_memory_allocated() / 2**20}))
"""


def test_cuda_stamps_time_the_device_and_the_peak_resets():
    res = _run_script(_STAMPS_AND_PEAK)
    assert 8.0 <= res["device_ms"] <= 15.0 and res["host_ms"] < 5.0, res
    assert res["peak_mib"] < 64, res  # not the 256 MiB of the earlier allocation


def test_collective_sweeps_run_on_a_gpu_rank(make_cluster):
    """The kit's bookkeeping collectives (each timing's MAX over ranks) put their tensors on the GPU:
    NCCL refuses CPU tensors ("No backend type associated with device type cpu"), which broke both
    sweeps on every GPU cluster until the H200 check of 2026-11-28 found it."""
    from kit.experiments.benchmarks.allreduce_algos import allreduce_algorithms_benchmark
    from kit.experiments.benchmarks.collectives import collective_benchmark
    c = make_cluster(world_size=1, device="gpu")
    recs = collective_benchmark(cluster=c, world_size=1, sizes=[2**10, 2**20], iters=3)
    assert {r["backend"] for r in recs} == {"nccl"} and all(p["time_ms"] > 0 for r in recs for p in r["points"])
    algos = allreduce_algorithms_benchmark(cluster=c, world_size=1, sizes=[2**12], iters=3)
    assert algos and all(p["time_ms"] > 0 for r in algos for p in r["points"])


def test_accelerate_on_one_gpu_trains_like_the_single_loop():
    """One GPU process: Accelerate does not wrap the model in DDP (distributed_type NO), so the kit times
    no bucket hook and counts no bucket copy there; the loss curve and gradient memory are the single
    loop's, same seed and batches."""
    import kit.experiments as ke
    try:
        runs = {s: ke.run({"strategy": s, "world_size": 1, "model_size": "tiny", "steps": 3, "warmup_steps": 0},
                          device="gpu") for s in ("single", "accelerate")}
    finally:
        ke.shutdown()
    a, b = ([st["loss"] for st in runs[s]["steps"]] for s in ("single", "accelerate"))
    assert runs["accelerate"]["env"]["device_type"] == "cuda" and len(a) == len(b) == 3
    assert max(abs(x - y) for x, y in zip(a, b)) < 1e-4, (a, b)
    # no DDP, so no bucket copy of the gradients is counted beside them
    grads = [runs[s]["memory"][0]["grads_mib"] for s in ("single", "accelerate")]
    assert grads[0] == grads[1], grads
