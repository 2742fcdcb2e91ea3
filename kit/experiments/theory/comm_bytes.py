"""Bytes each parallelism moves per step, by formula: what the hand-written building blocks
(kit/experiments/parallel/) should count at their collectives (parallel/wire.py counts them).

Every function returns {"<dimension>/<kind>": {"calls", "payload_bytes", "wire_bytes"}, ...,
"formula": "..."}, the same keys as `Wire.report()`, so a record shows measured and predicted side
by side. `payload_bytes` is what a collective is about; `wire_bytes` what one rank sends under the
bandwidth-optimal ring algorithm (`ring_factor`; Patarasuk & Yuan 2009). Pure Python, no torch.
"""
from __future__ import annotations

from typing import Any

from kit.experiments.theory.links import ring_factor

__all__ = ["predict_tp_bytes", "predict_sp_bytes", "predict_cp_bytes", "predict_ep_bytes", "predict_dp_bytes",
           "predict_fsdp_bytes", "predict_pp_bytes", "over_steps"]


def _row(calls: int, payload: float, wire: float) -> dict[str, Any]:
    return {"calls": calls, "payload_bytes": payload, "wire_bytes": wire}


def predict_tp_bytes(batch: int, seq: int, hidden: int, layers: int, tp: int, elem_bytes: int = 4) -> dict[str, Any]:
    """Megatron: 4 all-reduces per layer and step (2 forward, 2 backward) of b*s*h elements."""
    n = batch * seq * hidden * elem_bytes
    calls = 4 * layers
    return {"tp/all_reduce": _row(calls, calls * n, calls * ring_factor("all_reduce", tp) * n),
            "formula": "4 L all-reduces of b*s*h*bytes; ring: 2(t-1)/t of that per rank"}


def predict_sp_bytes(batch: int, seq: int, hidden: int, layers: int, tp: int, elem_bytes: int = 4) -> dict[str, Any]:
    """Per step: per layer 2 all-gathers and 2 reduce-scatters forward, 2 + 2 backward and 2 re-gathers;
    1 all-gather at each end of the blocks (forward at the head, backward at the embedding); one
    all-reduce of 6h per layer of LayerNorm and bias gradients. Payload b*s*h each; ring wire
    bytes (t-1)/t of it, so forward+backward without the re-gathers = tensor parallel's 4 all-reduces."""
    n, f = batch * seq * hidden * elem_bytes, ring_factor("all_gather", tp)
    ag, rs = 6 * layers + 2, 4 * layers
    p = 6 * hidden * layers * elem_bytes
    return {"tp/all_gather": _row(ag, ag * n, ag * f * n),
            "tp/reduce_scatter": _row(rs, rs * n, rs * f * n),
            "sp_params/all_reduce": _row(1, p, ring_factor("all_reduce", tp) * p),
            "formula": "per layer 6 all-gathers + 4 reduce-scatters of b*s*h (+2 all-gathers at the ends), "
                       "ring (t-1)/t each; without the 2 re-gathers 8(t-1)/t b*s*h = tensor parallel's"}


def predict_cp_bytes(batch: int, seq: int, hidden: int, cp: int, elem_bytes: int = 4,
                     backward: bool = True) -> dict[str, Any]:
    """Per rank and attention, blocks of b*(s/t)*h elements: forward K and V make t-1 hops;
    backward K and V t-1 hops again and their gradients t hops (home): (6t-4) blocks in all."""
    hop = batch * (seq // cp) * hidden * elem_bytes
    calls = 2 * (cp - 1) + ((2 * (cp - 1) + 2 * cp) if backward and cp > 1 else 0)  # one rank: nothing travels
    return {"cp/send": _row(calls, calls * hop, calls * hop),
            "formula": "b*(s/t)*h*bytes x [2(t-1) forward + 2(t-1) + 2t backward]"}


def predict_ep_bytes(send_rows: list[list[int]], rank: int, hidden: int, experts: int,
                     elem_bytes: int = 4) -> dict[str, Any]:
    """From the routing counts: send_rows[i][j] rows go from rank i to rank j in dispatch; this rank
    sends its off-rank rows in dispatch and returns its received ones in combine, forward and
    backward. Plus one all-to-all of per-expert counts (int64) per forward."""
    n = len(send_rows)
    out_rows = sum(send_rows[rank][j] for j in range(n) if j != rank)
    in_rows = sum(send_rows[i][rank] for i in range(n) if i != rank)
    b = 2 * (out_rows + in_rows) * hidden * elem_bytes
    c = (n - 1) * (experts // n) * 8
    return {"ep/all_to_all": _row(4, b, b), "ep_counts/all_to_all": _row(1, c, c),
            "formula": "2 x (rows sent + rows received, off-rank) x h x bytes; uniform routing 4 T k (n-1)/n h"}


def predict_dp_bytes(grad_bytes: int, dp: int, dim: str = "dp") -> dict[str, Any]:
    """Data parallel over a mesh dimension: one all-reduce of the replica's gradients per step."""
    return {f"{dim}/all_reduce": _row(1, grad_bytes, ring_factor("all_reduce", dp) * grad_bytes)}


def predict_fsdp_bytes(padded_bytes: list[int], fsdp: int, dim: str = "fsdp") -> dict[str, Any]:
    """FSDP2 (ZeRO-3) per step: each sharded module's parameters S_i all-gathered in forward and again
    in backward, their gradients reduce-scattered; `padded_bytes` are the S_i with dim 0 padded to
    a multiple of d, as FSDP2 pads them."""
    s, k = sum(padded_bytes), len(padded_bytes)
    f = ring_factor("all_gather", fsdp)
    return {f"{dim}/all_gather": _row(2 * k, 2 * s, 2 * f * s),
            f"{dim}/reduce_scatter": _row(k, s, ring_factor("reduce_scatter", fsdp) * s),
            f"{dim}_formula": "per block: all-gather S_i forward, again backward, reduce-scatter S_i "
                              "(S_i its parameters with dim 0 padded to a multiple of d); ring: (d-1)/d of each"}


def predict_hsdp_bytes(padded_bytes: list[int], shard: int, replicate: int) -> dict[str, Any]:
    """HSDP (FSDP2 on a 2-D mesh {"dp": r, "fsdp": s}): FSDP's collectives on fsdp, as `predict_fsdp_bytes`,
    then each block's reduce-scattered gradient shard (S_i / s) all-reduced across the r replicas on dp."""
    shard_bytes = sum(padded_bytes) / shard
    return {**predict_fsdp_bytes(padded_bytes, shard),
            "dp/all_reduce": _row(len(padded_bytes), shard_bytes, ring_factor("all_reduce", replicate) * shard_bytes),
            "dp_formula": "per block: its gradient shard S_i/s all-reduced over the r replicas; ring: 2(r-1)/r of it"}


def predict_pp_bytes(activation_bytes: int, micro_batches: int, sends: int) -> dict[str, Any]:
    """A pipeline stage per step: its activations (forward) and their gradients (backward), one
    message per micro-batch each way it has a neighbour; `sends` counts those neighbours' directions
    (0 for a single stage, 1 for the first and last, 2 in between), `activation_bytes` the step's."""
    if not sends:
        return {}
    return {"pp/send": _row(sends * micro_batches, sends * activation_bytes, sends * activation_bytes)}


def over_steps(pred: dict[str, Any], steps: int) -> dict[str, Any]:
    """A per-step prediction summed over `steps` steps (the formula texts unchanged)."""
    return {k: ({key: x * steps for key, x in v.items()} if isinstance(v, dict) else v) for k, v in pred.items()}
