"""Accelerator presets for predictions: peak FLOP/s, memory bandwidth and a sourced utilisation.

Pure Python (no torch). Every number's primary source is in docs/hardware.md ("Accelerators").
A prediction that rescales measured CPU compute to one of these is labelled predicted and keeps
the preset, the utilisation and its source in the prediction record.

Why a utilisation at all: peak FLOP/s is a datasheet ceiling that real training never reaches.
Large-model training reports 52-60% of peak on A100s (SC21's 52% counts the recompute: a hardware-FLOPs
utilisation, HFU; FSDP's 55-60% for GPT-175B); a small
model's small matmuls reach far less, so for the kit's tiny workloads the rescaled compute is a
lower bound on time (optimistic), and docs/predicting.md says so.
"""
from __future__ import annotations

from dataclasses import dataclass, field

__all__ = ["Accelerator", "ACCELERATORS", "DEFAULT_UTILISATION", "UTILISATION_SOURCE", "OVERLAP_SLOWDOWN"]

# Narayanan et al. 2021 (arXiv:2104.04473): 1T-parameter GPT on 3,072 A100s at 163 TFLOP/s per
# GPU = 52% of the 312 TFLOP/s bf16 peak, in hardware FLOPs (its eq. 3 counts the recompute: HFU). Zhao et al. 2023 (FSDP, arXiv:2304.11277) report 55-60%
# for GPT-175B on 512 A100s. We take the lower, 0.52, and apply it to every preset (an assumption
# for H100 and T4, which these papers did not measure).
DEFAULT_UTILISATION = 0.52
UTILISATION_SOURCE = ("Narayanan et al. 2021, arXiv:2104.04473: 163 of 312 TFLOP/s per A100 (52% of peak, hardware FLOPs: HFU); "
                      "applied to other accelerators as an assumption")

# Lee, Phanishayee & Mahajan 2025 (arXiv:2507.03114): compute overlapped with communication ran 18.9% slower on
# average (A100, H100, MI250, MI210; GPT and Llama training), 40% at worst. Not measured on a T4.
OVERLAP_SLOWDOWN = 0.189


@dataclass(frozen=True)
class Accelerator:
    name: str
    peak_tflops: dict[str, float] = field(default_factory=dict)  # dense, by compute precision
    hbm_gbps: float = 0.0        # memory bandwidth, GB/s (optimizer steps are memory bound)
    memory_gib: float = 0.0      # device memory, to say whether a prediction fits
    source: str = ""
    # compute slower by this share while a collective runs beside it (NCCL's kernels share the SMs and HBM):
    # 0.189 measured on A100 and H100 (Lee et al. 2025, arXiv:2507.03114; theory/overlap.py); 0: not measured
    overlap_slowdown: float = 0.0


ACCELERATORS: dict[str, Accelerator] = {
    # NVIDIA H100 SXM5 datasheet: bf16/fp16 1,979 TFLOPS "with sparsity" = 989 dense; TF32 495
    # dense; FP32 67; HBM3 3.35 TB/s; 80 GB.
    "h100": Accelerator("H100 SXM", {"bf16": 989.0, "fp16": 989.0, "tf32": 495.0, "fp32": 67.0},
                        hbm_gbps=3350.0, memory_gib=80.0, source="NVIDIA H100 Tensor Core GPU datasheet",
                        overlap_slowdown=OVERLAP_SLOWDOWN),
    # NVIDIA A100 datasheet (SXM 80GB): bf16/fp16 312, TF32 156, FP32 19.5 TFLOPS; HBM2e 2,039 GB/s.
    "a100": Accelerator("A100 SXM 80GB", {"bf16": 312.0, "fp16": 312.0, "tf32": 156.0, "fp32": 19.5},
                        hbm_gbps=2039.0, memory_gib=80.0, source="NVIDIA A100 Tensor Core GPU datasheet",
                        overlap_slowdown=OVERLAP_SLOWDOWN),
    # NVIDIA T4 datasheet: fp16 (tensor) 65 TFLOPS, FP32 8.1 TFLOPS, 320 GB/s, 16 GB (Colab's GPU).
    "t4": Accelerator("T4", {"fp16": 65.0, "fp32": 8.1}, hbm_gbps=320.0, memory_gib=16.0,
                      source="NVIDIA T4 datasheet"),
}
