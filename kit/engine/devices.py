"""Device placement: which backend and device each rank gets, and the banner when we fall back.

The kernel never imports torch just to count GPUs (that costs ~1.5 s and 250 MB): it asks
torch only if torch is already imported, otherwise the NVIDIA driver's /proc entries or
`nvidia-smi -L`. The workers confirm the count when they start.
"""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
from dataclasses import dataclass

from kit.config import LaunchConfig
from kit.errors import ConfigError

__all__ = ["Placement", "place", "visible_gpu_count"]


@dataclass(frozen=True)
class Placement:
    """The resolved placement: backend, device type, one GPU index per rank (or None), and why."""

    backend: str  # "nccl" or "gloo"
    device_type: str  # "cuda" or "cpu"
    gpu_ids: tuple[int | None, ...]
    banner: str | None = None  # set when what runs differs from what was asked


def _count_from_env(n: int) -> int:
    cvd = os.environ.get("CUDA_VISIBLE_DEVICES")
    if cvd is None:
        return n
    ids = [s for s in cvd.split(",") if s.strip() and s.strip() != "-1"]
    return min(n, len(ids))


def visible_gpu_count() -> int:
    """How many CUDA devices a fresh worker would see, without importing torch."""
    override = os.environ.get("KIT_FAKE_GPU_COUNT")  # tests exercise the policy on CPU machines
    if override is not None:
        return int(override)
    torch = sys.modules.get("torch")
    if torch is not None:
        try:
            return int(torch.cuda.device_count())
        except Exception:
            return 0
    gpus_dir = "/proc/driver/nvidia/gpus"
    if os.path.isdir(gpus_dir):
        return _count_from_env(len(os.listdir(gpus_dir)))
    if shutil.which("nvidia-smi"):
        try:
            out = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True, timeout=10).stdout
            return _count_from_env(sum(line.startswith("GPU ") for line in out.splitlines()))
        except (OSError, subprocess.SubprocessError):
            return 0
    return 0


def _gpus(n: int) -> str:
    return f"{n} GPU" if n == 1 else f"{n} GPUs"


def place(config: LaunchConfig, gpu_count: int | None = None) -> Placement:
    """Resolve the placement; raises ConfigError only when --strict forbids the fallback."""
    n = config.world_size
    if config.device == "cpu":
        return Placement("gloo", "cpu", (None,) * n)
    gpus = visible_gpu_count() if gpu_count is None else gpu_count
    if gpus >= n:
        return Placement("nccl", "cuda", tuple(range(n)))
    if config.strict:
        fix = f"Use --gpus {gpus} or --cpus {n}" if gpus else f"Use --cpus {n} (this machine has no GPU)"
        raise ConfigError(
            f"--gpus {n} asked for {_gpus(n)} but {gpus} {'is' if gpus == 1 else 'are'} visible, and --strict "
            f"forbids the CPU fallback. {fix}, or drop --strict."
        )
    why = (
        "NCCL needs one GPU per rank (two ranks on one GPU fail with 'Duplicate GPU detected')"
        if gpus
        else "no CUDA device is visible on this machine"
    )
    hint = " Use --gpus 1 for real GPU memory and mixed-precision numbers on one rank." if gpus else ""
    banner = (
        f"FALLBACK (expected here): --gpus {n} asked for {_gpus(n)} and {gpus} {'is' if gpus == 1 else 'are'} visible, "
        f"so the kit runs {n} CPU ranks with the gloo backend, because {why}. "
        f"Collectives, DDP and the lessons work the same; timings are CPU timings.{hint} "
        f"--strict turns this into an error."
    )
    return Placement("gloo", "cpu", (None,) * n, banner)
