"""Step time of a layout on a two-level cluster. Pure Python, never imports torch; predicted.

Compute: model FLOPs per token 6N + 12 L h s (N the parameters a token's matmuls use; the second
term the attention scores and their weighted sum, forward and backward: Chowdhery et al. 2022,
PaLM, arXiv:2204.02311 App. B), run at `utilisation` x the accelerator's dense peak. Recomputation
adds hardware FLOPs (full: one more forward of the layers; selective: the attention core again,
Korthikanti et al. 2022) but not model FLOPs, so it lowers MFU = model FLOPs / (GPUs x peak x step).

Communication, each on the link it crosses (ranks ordered tp, cp, dp, pp, tp fastest: Megatron-LM's
default order), with the kit's ring model (kit/experiments/theory/links.py) on each level:
- inside a node NVLink; a group spanning nodes does a hierarchical all-reduce (reduce-scatter in
  the node, all-reduce of 1/k of the bytes across nodes on each GPU's share of the node's egress,
  all-gather in the node); across nodes the cheaper of ring (2(n-1) hops) and tree (2 log2 n hops,
  2S bytes per rank; NVIDIA nccl tuning.cc) is used, so small messages take the tree.
- TP: 4 all-reduces of b s h per layer and micro-batch (2 forward, 2 backward; 6 with full
  recompute; sequence parallel replaces each with an all-gather + reduce-scatter of the same volume):
  Shoeybi et al. 2019 (Megatron-LM) Sec. 3, Korthikanti et al. 2022 Sec. 4.2. On the critical path,
  unless the layout overlaps it (`tp_overlap`, async TP: then only what the matmuls cannot cover).
  Sequence parallel also re-gathers two inputs per layer in backward; Megatron overlaps those with
  the weight-gradient matmuls, so they are counted in bytes, not in time.
- CP: ring attention (Liu et al. 2023, arXiv:2310.01889) passes K and V chunks around the cp ranks
  (t-1 hops forward, t-1 again backward, and the dK, dV accumulators t hops back to their owner),
  overlapped with the attention computation; only the excess is exposed.
- EP: 4 all-to-alls of the routed tokens per MoE layer and micro-batch; on the critical path.
- PP: one activation forward and one gradient backward per micro-batch between stages; the bubble is
  (pp - 1) micro-batch times for both GPipe and 1F1B (Narayanan et al. 2021). Interleaved 1F1B with v
  chunks per GPU: each fill/drain slot is one chunk, 1/v of a micro-batch time, so the bubble is
  (pp - 1)/v of them, (pp-1)/(v m + pp-1) of the pipeline time (bubble.predicted_bubble, what the kit
  measures; Narayanan et al. Sec. 2.2.2 write (pp-1)/(v m), the same bubble over the compute time);
  and every chunk boundary is a send, so 2v sends per micro-batch (their "v times the communication"),
  all on the critical path (no overlap of sends with compute is assumed, as for v = 1).
- DP: ZeRO-0 all-reduces gradients, ZeRO-1/2 reduce-scatter them and all-gather the updated bf16 params,
  over dp x cp ranks. The gradient reduce overlaps only the last micro-batch's backward (gradients are
  final only then); the param all-gather overlaps the next step's first forward. ZeRO-3 (FSDP)
  all-gathers params every micro-batch's forward (overlapping it) and again in backward, with the
  gradient reduce-scatter (overlapping backward): the ZeRO paper's 1.5x traffic.
- Overlap is not free: while a collective runs beside compute, the compute runs slower by the accelerator's
  `overlap_slowdown` (NCCL's kernels share the SMs and HBM; 18.9% measured, theory/overlap.py), so a hidden
  collective still costs a share of its length (ZeRO's reduces and gathers, ring attention, async TP).
- Optimizer: memory bound, every state byte read and written once at the accelerator's HBM bandwidth.
Critical batch: tokens per GPU at which one micro-batch-free backward pass would take as long as the
data-parallel gradient reduce (backward FLOPs only: 4N per token, How to Scale Your Model, training.md).
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from functools import lru_cache

from kit.experiments.theory.links import link_allreduce_s
from kit.experiments.theory.cluster import ClusterSpec
from kit.experiments.theory.layout_memory import (
    PLAN_PRECISIONS, ParallelConfig, activation_bytes_per_layer, op_sac_split, stage_layers, stage_params,
)
from kit.experiments.theory.gemm_efficiency import gemm_efficiency
from kit.experiments.theory.layout_zero import zero_traffic
from kit.experiments.theory.overlap import exposed_s
from kit.experiments.theory.models import ModelSpec
from kit import _renamed

__all__ = ["TimeBreakdown", "step_time", "planned_allreduce_s", "model_flops_per_token", "span", "collective_bytes"]
__getattr__ = _renamed.renamed_getattr(__name__)  # this release's old names, for one release


@dataclass(frozen=True)
class TimeBreakdown:
    compute_s: float         # forward + backward (+ recompute) of every micro-batch on the slowest stage
    tp_s: float
    cp_exposed_s: float
    ep_s: float
    pp_p2p_s: float
    bubble_s: float
    dp_s: float              # gradient reduce + param gather, total
    dp_exposed_s: float      # what the overlap rules leave on the critical path
    optimizer_s: float
    step_s: float
    mfu: float               # model FLOPs (6N + 12 L h s per token, no recompute) / (GPUs x peak x step)
    critical_tokens_per_gpu: float
    tokens_per_gpu: float
    links: tuple[tuple[str, str], ...]   # (dimension, link it crosses)
    hfu: float = 0.0         # hardware FLOPs (the recompute counted too) / (GPUs x peak x step)
    matmul_efficiency: float = 0.0   # the share of the peak the matmuls were priced at (gemm_efficiency.py)


@lru_cache(maxsize=4096)  # a plan asks tens of thousands of times for a few hundred (n, stride) pairs
def span(n: int, stride: int, gpus_per_node: int) -> tuple[int, int]:
    """(members per node, nodes) of a group of n ranks, `stride` apart in rank order."""
    per_node = max(1, min(n, gpus_per_node // stride)) if stride < gpus_per_node else 1
    return per_node, math.ceil(n / per_node)


def _link_name(n: int, stride: int, c: ClusterSpec) -> str:
    return _link_of(n, stride, c.gpus_per_node)


@lru_cache(maxsize=4096)  # five per layout priced, a few hundred distinct (n, stride)
def _link_of(n: int, stride: int, gpus_per_node: int) -> str:
    per_node, nodes = span(n, stride, gpus_per_node)
    if n == 1:
        return "none"
    return "NVLink" if nodes == 1 else ("InfiniBand" if per_node == 1 else "NVLink + InfiniBand")


def planned_allreduce_s(nbytes: float, n: int, stride: int, c: ClusterSpec) -> float:
    """The planner's seconds for one all-reduce of n-byte buffers on a group of n GPUs `stride` apart on the
    cluster: hierarchical when it spans nodes (a ring on NVLink, then the faster of ring and tree across)."""
    if n <= 1 or nbytes <= 0:
        return 0.0
    per_node, nodes = span(n, stride, c.gpus_per_node)
    t = link_allreduce_s(c.intra, nbytes, per_node) if per_node > 1 else 0.0
    if nodes > 1:
        b, nic, bw = nbytes / per_node, c.nic, c.egress_gbps_per_gpu
        ring = link_allreduce_s(nic, b, nodes, bw)
        tree = (nic.base_us + 2 * math.log2(nodes) * nic.hop_us) * 1e-6 + 2 * b / (bw * nic.efficiency * 1e9)
        t += min(ring, tree)
    return t


def _all_to_all_s(nbytes: float, n: int, stride: int, c: ClusterSpec) -> float:
    """Each GPU sends (n-1)/n of its bytes: peers in the node over NVLink, the rest over its NIC share."""
    if n <= 1:
        return 0.0
    per_node, _ = span(n, stride, c.gpus_per_node)
    intra = nbytes * (per_node - 1) / n / (c.intra.gbps * c.intra.efficiency * 1e9)
    inter = nbytes * (n - per_node) / n / (c.egress_gbps_per_gpu * c.nic.efficiency * 1e9)
    return (c.intra.base_us + (n - 1) * c.intra.hop_us) * 1e-6 + intra + inter


def _send_s(nbytes: float, n: int, stride: int, c: ClusterSpec) -> float:
    """One point-to-point send to the next member of a ring of n ranks `stride` apart: over NVLink
    when the neighbour shares the node, else over this GPU's share of the node's egress."""
    if n <= 1:
        return 0.0
    per_node, _ = span(n, stride, c.gpus_per_node)
    link, gbps = (c.intra, c.intra.gbps) if per_node == n else (c.nic, c.egress_gbps_per_gpu)
    return (link.base_us + link.hop_us) * 1e-6 + nbytes / (gbps * link.efficiency * 1e9)


def model_flops_per_token(m: ModelSpec, seq_len: int) -> float:
    """6N + 12 L h s (PaLM App. B): the numerator of MFU."""
    return 6 * m.active_params() + 12 * m.layers * m.hidden * seq_len


def _compute(m: ModelSpec, pc: ParallelConfig, seq_len: int, rate: float, hbm: float
             ) -> tuple[float, float, float, float]:
    """(forward, backward incl. recompute, attention core fwd+bwd) seconds of one micro-batch on the last
    stage, and the hardware FLOPs over 3 x the forward's (HFU / MFU).

    Matmuls at `rate` FLOP/s; the elementwise kernels between them (norms, activations, dropout, residual
    adds, an unfused softmax) are memory bound: each activation byte Korthikanti et al. count
    (layout_memory.activation_bytes_per_layer, recompute none) is written by one kernel and read by the
    next in forward, and twice that in backward (read, gradient written and read), at HBM bandwidth `hbm`."""
    return _compute_of(m, seq_len, rate, hbm, pc.tp, pc.pp, pc.cp, pc.micro_batch, pc.virtual_stages, pc.recompute,
                       pc.sp, pc.precision)


@lru_cache(maxsize=8192)  # a plan prices thousands of layouts sharing a few hundred of these; the spec is frozen
def _compute_of(m: ModelSpec, seq_len: int, rate: float, hbm: float, tp: int, pp: int, cp: int, micro_batch: int,
                v: int, recompute: str, sp: bool, precision: str) -> tuple[float, float, float, float]:
    # what _compute reads of the layout, and no more (dp, zero, micro_batches... do not change one micro-batch)
    pc = ParallelConfig(tp=tp, pp=pp, cp=cp, micro_batch=micro_batch, virtual_stages=v, recompute=recompute, sp=sp,
                        precision=precision, schedule="interleaved_1f1b" if v > 1 else "1f1b")
    tokens = pc.micro_batch * seq_len / pc.cp
    layers = stage_layers(m, pc)
    dense, _ = m.layer_params()
    layer = 2 * (dense + m.experts_per_token * m.expert_params())
    attn = 4 * m.hidden * seq_len
    fwd = tokens * (layers * (layer + attn) + 2 * m.vocab * m.hidden) / pc.tp
    attn_fwd = tokens * layers * attn / pc.tp
    op = tokens * layers * sum(op_sac_split(m)[0]) * m.hidden ** 2 / pc.tp  # every second matmul again
    extra = {"none": 0.0, "selective": attn_fwd, "op": op,
             "full": fwd - tokens * 2 * m.vocab * m.hidden / pc.tp}[pc.recompute]
    written = layers * activation_bytes_per_layer(m, pc, seq_len, "none")
    scores = written - layers * activation_bytes_per_layer(m, pc, seq_len, "selective")
    mem_f = 2 * written / hbm
    mem_extra = {"none": 0.0, "selective": 2 * scores / hbm, "op": mem_f, "full": mem_f}[pc.recompute]
    return (fwd / rate + mem_f, (2 * fwd + extra) / rate + 2 * mem_f + mem_extra, 3 * attn_fwd / rate,
            (3 * fwd + extra) / (3 * fwd))


def collective_bytes(m: ModelSpec, pc: ParallelConfig, seq_len: int) -> dict[str, tuple[int, float]]:
    """(calls, payload bytes of each) one GPU issues per micro-batch ("tp", "cp", "ep", "pp": sends)
    and per step ("dp_reduce": gradients, "dp_gather": parameters). The payload is the full array an
    all-reduce / all-gather / reduce-scatter works on (nccl-tests' convention), an all-to-all's input."""
    pb, gb, _, act, _ = PLAN_PRECISIONS[pc.precision]
    layers = stage_layers(m, pc)
    act_bytes = pc.micro_batch * seq_len / pc.cp * m.hidden * act
    dense, expert = stage_params(m, pc, "last" if pc.pp > 1 else "only")
    moe = m.experts > 1
    sp = pc.sp and pc.tp > 1
    return {"tp": (layers * (6 if pc.recompute == "full" else 4) if pc.tp > 1 else 0, act_bytes),
            # sequence parallel gathers each layer's two sharded inputs again in backward (Korthikanti
            # et al. 2022 Sec. 4.2.2): all-gathers, overlapped with the weight-gradient matmuls
            "sp_regather": (layers * 2 if sp else 0, act_bytes),
            # ring attention, per layer: K and V chunks pass t-1 hops forward and again backward, the dK, dV
            # accumulators t hops (back to their owner): 4(t-1) + 2t sends of one chunk
            "cp": (layers * (4 * (pc.cp - 1) + 2 * pc.cp) if pc.cp > 1 else 0,
                   pc.micro_batch * seq_len / pc.cp * m.kv_heads * m.head_dim * act / pc.tp),
            "ep": (layers * 4 if moe and pc.ep > 1 else 0, act_bytes * m.experts_per_token),
            "pp": (2 * pc.virtual_stages if pc.pp > 1 else 0, act_bytes / (pc.tp if pc.sp else 1)),
            "dp_reduce": (1 if pc.dp * pc.cp > 1 else 0, (dense + expert) * gb),
            # the gathered copy is in the compute dtype (FSDP2's param_dtype; Megatron's bf16 params)
            "dp_gather": (1 if pc.dp * pc.cp > 1 and pc.zero >= 1 else 0, (dense + expert) * act)}


def step_time(m: ModelSpec, pc: ParallelConfig, c: ClusterSpec, seq_len: int,
              utilisation: float | None = None) -> TimeBreakdown:
    """Predicted seconds per optimizer step for one layout, with its parts and MFU. `utilisation`: the share
    of the peak every matmul reaches; None: by the layer's per-GPU width (gemm_efficiency.py)."""
    if utilisation is None:
        utilisation = gemm_efficiency(m, pc.tp, pc.micro_batch * seq_len / pc.cp)
    pb, gb, ob, act, _ = PLAN_PRECISIONS[pc.precision]
    traffic = collective_bytes(m, pc, seq_len)
    peak_tflops = c.accelerator.peak_tflops
    peak = 1e12 * (peak_tflops.get("bf16") if act == 2 else peak_tflops.get("tf32", peak_tflops.get("fp32")))
    t_f, t_b, t_attn, hw_over_model = _compute(m, pc, seq_len, peak * utilisation, c.accelerator.hbm_gbps * 1e9)
    mbs = pc.micro_batches
    s_local = seq_len / pc.cp
    slow = c.accelerator.overlap_slowdown  # compute beside a collective runs this much slower (overlap.py)
    (n_tp, b_tp), (n_cp, b_cp), (n_ep, b_ep), (n_pp, b_pp) = (traffic[k] for k in ("tp", "cp", "ep", "pp"))
    tp = n_tp * planned_allreduce_s(b_tp, pc.tp, 1, c)
    if pc.tp_overlap and pc.tp > 1:
        # async TP (Wang et al., ASPLOS 2023, "Overlap communication with dependent computation via
        # decomposition"; torchtitan's async TP): each collective is split into tp steps, each hidden
        # behind the matmul of the previous shard; the first step and what the matmuls cannot cover stay
        tp = tp / pc.tp + exposed_s(t_f + t_b, tp - tp / pc.tp, slow)
    cp = n_cp / 2 * _send_s(2 * b_cp, pc.cp, pc.tp, c)  # K and V (dK and dV) travel together: one hop, two chunks
    cp_exposed = exposed_s(t_attn, cp, slow)
    ep = n_ep * _all_to_all_s(b_ep, pc.ep, pc.tp * pc.cp, c)
    stride_pp = pc.tp * pc.cp * pc.dp
    pp = n_pp * _send_s(b_pp, pc.pp, stride_pp, c)
    dense, expert = stage_params(m, pc, "last" if pc.pp > 1 else "only")
    n_dp = pc.dp * pc.cp
    ar = planned_allreduce_s(traffic["dp_reduce"][1], n_dp, pc.tp, c)
    sharded = zero_traffic(pc.zero, n_dp, pc.tp, c, stage_layers(m, pc), traffic["dp_gather"][1],
                           traffic["dp_reduce"][1], mbs, t_f, t_b, ar, pc.framework, pc.recompute)
    # ZeRO-3's exposed gathers lengthen every micro-batch's slot, so the pipeline bubble grows with them
    t_mb = t_f + t_b + tp + cp_exposed + ep + pp + sharded.exposed_per_micro_s
    slots = (pc.pp - 1) / pc.virtual_stages  # the bubble, in micro-batch times: (pp-1)/v
    pipe = (mbs + slots) * t_mb
    fill_drain = slots * t_mb
    dp, dp_exposed = sharded.traffic_s, sharded.exposed_step_s + mbs * sharded.exposed_per_micro_s
    shard = n_dp if pc.zero >= 1 else 1
    opt = (dense + expert) * (pb + gb + 2 * ob / shard) / (c.accelerator.hbm_gbps * 1e9)
    step = pipe + sharded.exposed_step_s + opt
    tokens_gpu = mbs * pc.micro_batch * s_local
    flops = model_flops_per_token(m, seq_len) * tokens_gpu * pc.dp * pc.cp
    mfu = flops / (pc.gpus * peak * step)
    per_token_bwd = t_b / (pc.micro_batch * s_local)
    links = (("tp", _link_name(pc.tp, 1, c)), ("cp", _link_name(pc.cp, pc.tp, c)),
             ("ep", _link_name(pc.ep, pc.tp * pc.cp, c)), ("dp", _link_name(n_dp, pc.tp, c)),
             ("pp", _link_name(pc.pp, stride_pp, c)))
    hfu = mfu * hw_over_model
    return TimeBreakdown(mbs * (t_f + t_b), mbs * tp, mbs * cp_exposed, mbs * ep, mbs * pp,
                         fill_drain, dp, dp_exposed, opt, step, mfu,
                         (ar if pc.zero == 0 else ar / 2) / per_token_bwd, tokens_gpu, links, hfu, utilisation)
