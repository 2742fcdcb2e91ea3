"""What a prediction is least sure of, in plain words, worst first (pure Python).

Why computed per prediction rather than a fixed disclaimer: the weakest assumption depends on
the case. On a fast link with a big model the link model hardly matters and the compute
rescaling decides; on Ethernet the link model decides everything.
"""
from __future__ import annotations

from typing import Any, Mapping

__all__ = ["weakest"]


def weakest(pred: Mapping[str, Any]) -> list[str]:
    """Sentences naming the inputs and assumptions the predicted numbers hang on most."""
    pts = pred["points"]
    last = pts[-1]
    comm_share = last["comm_exposed_ms"] / last["step_ms"] if last["step_ms"] else 0.0
    out: list[str] = []
    links = pred["link"]
    if comm_share > 0.2:
        flat = [d["name"] for d in links if d["chunk_half_bytes"] == 0 and d["name"] != "custom"]
        out.append(f"exposed communication is {100 * comm_share:.0f}% of the step at {last['ranks']} ranks, "
                   "so the link model decides the answer" + (
                       f"; {', '.join(flat)} has no measured message-size curve (c_half = 0), so mid-size "
                       "buckets are predicted too fast" if flat else ""))
    if any(d["source"].startswith("fit:") for d in links):
        out.append("the link is a fit of gloo loopback: the benchmark's alpha-beta line misses by 40-75% at some "
                   "sizes (docs/measuring.md), inside a training step gloo took 1.5-3.8x the benchmark's time, "
                   "and on loopback the predicted exposed comm came out 21-45% too low (docs/predicting.md); "
                   "beyond the fitted rank count the ring formula is an extrapolation")
    if max(r["ranks"] for r in pts) > 64:
        out.append("beyond one node a ring all-reduce is modelled as one flat ring over every rank; NCCL "
                   "switches to trees and hierarchical rings at scale, and network contention is ignored")
    acc = pred.get("accelerator")
    if acc:
        out.append(f"compute is rescaled, not measured: {acc['flops_per_sample']:.3g} FLOP per sample at "
                   f"{acc['utilisation']:.0%} of {acc['name']}'s {acc['peak_tflops']:g} TFLOP/s "
                   f"({acc['utilisation_source']}); a small model reaches far less, so compute is optimistic")
    elif pred["inputs"].get("device_type") == "cpu":
        out.append("compute is the measured CPU step, which wobbles by about 25% run to run on a shared "
                   "machine (docs/measuring.md); every predicted step inherits that")
    if pred.get("mesh"):
        out.append(f"a mesh is predicted from its own counts and formulas only, unvalidated against measured "
                   f"runs of other sizes: every collective counted exposed (on CPU the kit's mesh collectives "
                   f"block; on GPUs FSDP2 overlaps its own, so fsdp's time is pessimistic there), and the "
                   f"non-communication time kept at rank 0's measured one as {pred['grows']} grows")
    elif pred["strategy"] in ("zero1", "zero2", "zero3", "pipeline"):
        out.append(f"{pred['strategy']} is predicted from formulas only; the kit has not measured it, so this "
                   "curve is unvalidated (ddp is the validated path)")
    if pred["strategy"] == "pipeline" and not pred.get("mesh"):
        out.append("pipeline: equal stages assumed (measured imbalance adds to the bubble, see "
                   "docs/measuring.md) and point-to-point activation traffic is ignored")
    if pred.get("compression", 1.0) > 1.0:
        out.append("compression: fewer bytes on the wire, but the time to compress and decompress and any "
                   "effect on convergence are not modelled")
    if pred.get("host_cores"):
        out.append("CPU oversubscription is modelled as compute stretched by ranks x threads / cores; gloo's "
                   "own threads also compete for the cores during overlap, which is not modelled")
    out.append("overlap assumes communication takes no compute from backward; DDP's copies into and out of "
               "the bucket buffers count only as far as the measured run's 'other' time holds them")
    return out
