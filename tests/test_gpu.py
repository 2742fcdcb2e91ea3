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
