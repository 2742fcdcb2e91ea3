"""The data-parallel collectives of a sharded layout (ZeRO-1/2/3, FSDP) and the compute they hide behind.
Pure Python, never imports torch; every number predicted.

Why a module of its own: at scale these decide the step. ZeRO-3 / FSDP gathers every layer's parameters
before its forward and again before its backward, and reduce-scatters its gradients after it (Rajbhandari
et al. 2020, arXiv:1910.02054, Sec. 7: 3 x the parameter bytes, 1.5 x DDP's traffic), one layer at a time,
for every micro-batch (FSDP2 reshards after forward by default; DeepSpeed releases a partition after use).
- Each collective is a ring over the dp x cp group (NCCL runs all-gather and reduce-scatter as rings only;
  its tree serves all-reduce): n-1 steps, each paying the hop latency (Thakur, Rabenseifner & Gropp 2005).
  Inside a node it moves at NVLink's rate; across nodes NCCL runs a ring per NIC, so each byte enters a node
  once and the node's GPUs share its egress.
- DeepSpeed's ZeRO-3, as SC21 measured it (Narayanan et al. 2021, Table 2): the step stayed at the same
  length from 768 to 1536 GPUs at a fixed batch, as if every GPU moved the whole model through its own NIC
  (about 16-22 GB/s per GPU of HDR's 25), and a layer is gathered again for the recompute's forward. The
  planner prices `framework="deepspeed"` that way (`own_copy`): a hypothesis of this kit, stated, that
  reproduces that table; held-out DeepSpeed runs are to test it.
- Prefetch one layer ahead (FSDP2's and DeepSpeed's default): the gather of layer i+1 runs during the
  forward of layer i; in backward the gather of layer i-1 and the reduce-scatter of layer i+1 share the
  link during the backward of layer i. Only what a layer's compute cannot cover is exposed, plus the first
  gather of each pass, which nothing precedes. So a small per-GPU batch (fewer tokens per layer to compute)
  cannot hide the gathers, and the step stops shrinking as GPUs are added at a fixed global batch: the
  collapse Narayanan et al. 2021 (SC21) Table 2 measured for ZeRO-3, which the planner now predicts.
- DeepSpeed with full recompute: its backward gather of a layer is issued only when the layer's recompute
  starts (it prefetches the next modules of its trace when one is fetched, none while a prefetch is in
  flight), behind the reduce-scatter of the layer before: `_deepspeed_recompute_backward`.
- Every overlapped collective slows the compute beside it (overlap.py, measured 18.9% on A100 and H100).
- ZeRO-1/2: the gradients reduce-scattered and the updated parameters all-gathered once per step (ZeRO-2:
  gradients reduce-scattered after every micro-batch, as DeepSpeed stage 2 and FSDP2's SHARD_GRAD_OP do,
  so that only a shard is kept), the reduce-scatter behind the last backward, the gather behind the next
  forward.
"""
from __future__ import annotations

from dataclasses import dataclass

from kit.experiments.theory.cluster import ClusterSpec
from kit.experiments.theory.links import link_collective_s, ring_factor, ring_steps
from kit.experiments.theory.overlap import exposed_s, overlapped_s

__all__ = ["ring_collective_s", "ShardedTraffic", "zero_traffic"]


def ring_collective_s(nbytes: float, n: int, stride: int, c: ClusterSpec, own_copy: bool = False) -> float:
    """One ring all-gather or reduce-scatter of an `nbytes` array over n ranks `stride` apart.

    Inside a node: NVLink. Across nodes, NCCL runs one ring per NIC (channel), so every byte enters a node
    once and the node's members share its egress: S (nodes-1)/nodes / (members in the node) through each
    GPU's NIC. `own_copy`: every GPU instead moves (n-1)/n of the array through its own NIC (DeepSpeed's
    ZeRO-3 as SC21 measured it; see zero_traffic)."""
    if n <= 1 or nbytes <= 0:
        return 0.0
    per_node = max(1, min(n, c.gpus_per_node // stride)) if stride < c.gpus_per_node else 1
    if per_node >= n:   # a ring inside one node: links.py's formula on NVLink
        return link_collective_s("all_gather", c.intra, nbytes, n)
    # Across nodes the ring still takes n-1 steps, but its bytes are the nodes' ring's (each byte enters a node
    # once; a reduce-scatter sends what an all-gather does), shared by the node's GPUs through the NICs, at each
    # GPU's share of their egress x efficiency (no size-dependent term): on purpose not links.py's per-GPU ring.
    nodes = -(-n // per_node)
    if own_copy:
        through_nic = ring_factor("all_gather", n) * nbytes
    else:
        through_nic = ring_factor("all_gather", nodes) * nbytes / per_node
    gbps = c.egress_gbps_per_gpu * c.nic.efficiency
    return (c.nic.base_us + ring_steps("all_gather", n) * c.nic.hop_us) * 1e-6 + through_nic / (gbps * 1e9)


@dataclass(frozen=True)
class ShardedTraffic:
    traffic_s: float             # every data-parallel collective of the step, end to end
    exposed_per_micro_s: float   # ZeRO-3: per micro-batch, on the critical path (lengthens each stage slot)
    exposed_step_s: float        # ZeRO-0/1/2: once per step, after the pipeline drains
    calls_per_step: int


def zero_traffic(zero: int, n: int, stride: int, c: ClusterSpec, layers: int, param_bytes: float, grad_bytes: float,
                 micro_batches: int, t_f: float, t_b: float, allreduce: float, framework: str = "torch",
                 recompute: str = "none") -> ShardedTraffic:
    """The step's data-parallel traffic for ZeRO stage `zero` over n ranks.

    `param_bytes`, `grad_bytes`: this GPU's stage, unsharded, in the dtype gathered (compute) and reduced;
    `t_f`, `t_b`: one micro-batch's forward and backward (with recompute) on the stage; `allreduce`: ZeRO-0's
    gradient all-reduce, priced by the caller (layout_time.planned_allreduce_s). `framework` "deepspeed": each GPU
    gathers its own copy through its NIC, and with full recompute a layer is gathered again for the
    recompute's forward (DeepSpeed releases a partition after every forward, the recompute's included).
    What a collective costs beside the compute it hides behind, the compute's slowdown included: overlap.py."""
    if n <= 1:
        return ShardedTraffic(0.0, 0.0, 0.0, 0)
    slow = c.accelerator.overlap_slowdown
    if zero == 0:
        return ShardedTraffic(allreduce, 0.0, exposed_s(t_b, allreduce, slow), 1)
    if zero in (1, 2):
        gather = ring_collective_s(param_bytes, n, stride, c)
        scatter = ring_collective_s(grad_bytes, n, stride, c)
        scatters = micro_batches if zero == 2 else 1
        exposed = exposed_s(t_b, scatter, slow) * scatters + exposed_s(t_f, gather, slow)
        return ShardedTraffic(scatters * scatter + gather, 0.0, exposed, scatters + 1)
    k = max(layers, 1)   # one call per layer (FSDP2 groups a block's parameters; the embedding and head ride along)
    own = framework == "deepspeed"
    ag, rs = ring_collective_s(param_bytes / k, n, stride, c, own), ring_collective_s(grad_bytes / k, n, stride, c, own)
    gathers_b = 2 if own and recompute == "full" else 1
    c_f, c_b = t_f / k, t_b / k
    forward = ag + (k - 1) * exposed_s(c_f, ag, slow)
    if gathers_b == 2:
        backward = ag + _deepspeed_recompute_backward(k, c_f, c_b, ag, rs, slow) + rs
    else:
        backward = gathers_b * ag + (k - 1) * exposed_s(c_b, gathers_b * ag + rs, slow) + rs
    return ShardedTraffic(micro_batches * k * ((1 + gathers_b) * ag + rs), forward + backward, 0.0,
                          micro_batches * (2 + gathers_b) * k)


def _deepspeed_recompute_backward(k: int, c_r: float, c_b: float, ag: float, rs: float, slow: float) -> float:
    """What DeepSpeed's ZeRO-3 backward with full recompute exposes beyond its k layers' compute (`c_b` each,
    the recompute's forward `c_r` included), after the first gather.

    DeepSpeed (stage3.py, PartitionedParameterCoordinator.prefetch_next_sub_modules, the 2021 releases SC21
    ran) prefetches the parameters of the modules that come next in its recorded trace when a module is
    fetched, and only if no prefetch is in flight. With the recompute, layer i's trace is: its forward again
    (parameters gathered, released after it), then its backward (gathered again). So the backward's gather
    of layer i is issued when the recompute of layer i starts, and it shares the link with the reduce-scatter
    of layer i+1, issued when that layer's backward ended: the backward waits for both (window 1). The
    recompute gather of layer i-1 is prefetched at the start of layer i's backward and hides behind it
    (window 2). Perfect overlap would give max(3 compute, 3 collectives) per layer; this gives
    max(c_r, rs + ag) + max(c_b - c_r, ag): a third more when the two are equal (SC21's 384 and 640 GPUs),
    the same when the collectives dominate (768 GPUs and more). Each window's compute is slowed by the
    collective beside it (overlap.py)."""
    c_bb = c_b - c_r
    first = overlapped_s(c_r, ag, slow) + overlapped_s(c_bb, ag, slow)   # no reduce-scatter before the last layer
    rest = overlapped_s(c_r, rs + ag, slow) + overlapped_s(c_bb, ag, slow)
    return first + (k - 1) * rest - k * c_b
