"""What a collective costs when it runs beside the compute it is meant to hide behind. Pure Python; predicted.

Overlapping communication with computation is not free on a GPU: NCCL's kernels run on the same SMs and
read and write the same HBM as the matmuls, so the matmuls run slower while a collective is in flight.
- Measured: Lee, Phanishayee and Mahajan, "Characterizing Compute-Communication Overlap in GPU-Accelerated
  Distributed Deep Learning: Performance and Power Implications" (arXiv:2507.03114, 2025), training GPT and
  Llama models on 4 A100s, H100s, MI250s and MI210s: compute overlapped with communication ran 18.9% slower
  than alone on average, 40% at worst (the abstract's figures).
- The same contention seen from the other side: Agrawal et al. (AMD, arXiv:2412.14335, 2024): concurrent GEMMs
  and collectives realised 21% of the ideal overlap speedup on average.
- Calculon (Isaev et al., SC23) prices it the same way: a share of the processor a network's collectives
  take while they overlap ("processor_usage" in its system files).
- Over InfiniBand too: NCCL holds one CUDA block per channel for as long as the collective lasts, waiting on
  the network or not (NCCL's documentation of NCCL_MIN_NCHANNELS / NCCL_MAX_NCHANNELS: more channels, more
  CUDA blocks, more of the GPU's compute resources). The kit applies the one measured figure to every link;
  the HBM share is smaller across nodes (Calculon charges InfiniBand less than NVLink): not modelled.

The model: while a collective of `comm_s` runs beside `compute_s` of work, the work runs at 1/(1 + slowdown)
of its speed; the collective keeps its own. If the collective outlasts the slowed work, the window is the
collective's (communication bound: the slowdown costs nothing more); otherwise the work finishes
comm_s x slowdown / (1 + slowdown) late. So a 'hidden' collective still costs about 16% of its length at
the measured 18.9%, and a layout whose compute and communication are equal (SC21's ZeRO-3 on 384 A100s) pays
most, where the perfect-overlap model (the max of the two) is most wrong.
The slowdown is the accelerator's (`Accelerator.overlap_slowdown`): the measured figure for A100 and H100;
0 where nothing was measured; infinite for the kit's CPU ranks (local_time.py), whose gloo collectives block
the rank's thread, so the work waits for the whole collective.
"""
from __future__ import annotations

import math

__all__ = ["overlapped_s", "exposed_s"]


def overlapped_s(compute_s: float, comm_s: float, slowdown: float) -> float:
    """Wall time of `compute_s` of work with a `comm_s` collective running beside it."""
    if comm_s <= 0.0:
        return compute_s
    if math.isinf(slowdown):   # the collective blocks the compute (a CPU rank's gloo call): nothing hides
        return compute_s + comm_s
    if comm_s >= compute_s * (1.0 + slowdown):
        return comm_s
    return compute_s + comm_s * slowdown / (1.0 + slowdown)


def exposed_s(compute_s: float, comm_s: float, slowdown: float) -> float:
    """What the collective adds to the work's own time (0 for perfect overlap, comm_s - compute_s at most
    beyond it when communication bound)."""
    return overlapped_s(compute_s, comm_s, slowdown) - compute_s
