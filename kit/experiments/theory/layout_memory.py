"""Memory per GPU for a layout: tensor (tp), pipeline (pp), data (dp), context (cp), expert (ep)
parallel degrees and a ZeRO stage. Pure Python, never imports torch; every number is predicted.

Model states (bytes per parameter: params, grads, optimizer):
- Precision layouts, `PLAN_PRECISIONS`. ZeRO stage z shards optimizer (z>=1), grads (z>=2), params (z=3)
  over the data-parallel group; context-parallel ranks hold the same weights, so the group is
  dp x cp (Megatron-LM's distributed optimizer); expert weights over dp x cp / ep.
- tp shards every weight matrix (and the vocabulary-parallel embedding); pp gives a stage
  ceil(L/pp) layers, the first stage the embedding, the last the output head; ep gives a GPU
  experts/ep of each layer's experts (and tp shards each expert, as Megatron-core does by default).
- ZeRO-3 keeps, at its peak, two gathered layers (the one computing and the one prefetched:
  FSDP's backward prefetch) and one layer's unsharded gradient before its reduce-scatter; DeepSpeed
  caps them by its live-parameter and reduce-bucket limits.

Activations per layer and micro-batch (Korthikanti et al. 2022, arXiv:2205.05198, Sec. 4), in units
of s b h bytes, s the sequence (s/cp per GPU under context parallelism), b the micro-batch:
- kept whole on every tp rank unless sequence parallel: the two norm inputs (4), the attention and
  MLP inputs (2 + 2), dropout masks (1 + 1, if the model has dropout);
- split by tp: Q, K, V (2 + 2r + 2r, r = kv_heads/heads), the output projection input (2), the MLP's
  inner activations (GeLU: 4f/h, SwiGLU: 6f/h; times experts_per_token for an MoE);
- the attention scores, split by tp: 5as/h with dropout (softmax output, mask, dropout output), 2as/h
  without. For GPT (f = 4h, r = 1, dropout) this is the paper's sbh(34 + 5as/h) exactly.
Selective recompute drops the score term, and so does fused attention (`ModelSpec.flash_attention`); full recompute keeps
only each layer's input, 2sbh (/tp under SP), plus one layer's activations while it is recomputed.
In flight on the first stage: 1F1B min(pp, m) micro-batches, GPipe all m (Narayanan et al. 2021,
arXiv:2104.04473). Interleaved 1F1B with v chunks per GPU (a chunk is L/(pp v) layers): rank 0 runs
2(pp-1) + (v-1)pp warm-up chunk forwards and one more before its first backward, so it holds
(2(pp-1) + (v-1)pp + 1)/v = pp (1 + (pp-1)/(pp v)) micro-batches' worth of its layers (at most m):
Korthikanti et al. 2022's factor 1 + (p-1)/(p v), as Megatron-LM's theoretical_memory_usage.py applies
it; the last rank holds ((v-1)pp + 1)/v (one for v = 1). With m = pp every rank runs all its forwards
first (Megatron's schedule does), so both hold all m, as in GPipe. The last stage also holds the logits:
bf16 plus an fp32 copy for the loss (6 s b V/tp); under torch (torchtitan) also the fp32 log-probabilities'
gradient and the bf16 one (12 s b V/tp). recompute="op" is torchtitan's per-op selective policy
(`op_sac_split`); "selective" is Korthikanti's (the attention core).

The allowance for the CUDA context, library workspaces and fragmentation is a stated assumption:
`ALLOWANCE_GIB` fixed plus `FRAGMENTATION` of what is allocated (The Ultra-Scale Playbook: "1-2 GB"
for CUDA kernels). It is not measured on this machine (no GPU here).
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from functools import lru_cache

from kit.experiments.theory.models import ModelSpec
from kit import _renamed
from kit.units import GIB

__all__ = ["ParallelConfig", "MemoryBreakdown", "PLAN_PRECISIONS", "ALLOWANCE_GIB", "FRAGMENTATION",
           "memory_per_gpu", "in_flight", "stage_layers", "op_sac_split", "attention_score_units", "FRAMEWORKS", "state_bytes", "activation_bytes_per_layer", "stage_params", "GIB"]
__getattr__ = _renamed.renamed_getattr(__name__)  # this release's old names, for one release

ALLOWANCE_GIB = 2.0      # CUDA context + cuBLAS/NCCL workspaces (Playbook: 1-2 GB); an assumption
FRAGMENTATION = 0.05     # caching-allocator fragmentation, a fraction of what is allocated; an assumption

# name -> (param, grad, optimizer) bytes per parameter, activation bytes per element, source
PLAN_PRECISIONS: dict[str, tuple[float, float, float, int, str]] = {
    "bf16": (2, 4, 12, 2, "Megatron-LM (docs: distributed optimizer): bf16 params, fp32 gradient accumulation, "
                          "fp32 master weights + Adam m, v: 2 + 4 + 12 = 18 B/param"),
    "bf16-bf16grads": (2, 2, 12, 2, "ZeRO (Rajbhandari et al. 2020, arXiv:1910.02054): 2 + 2 + 12 = 16 B/param"),
    "fp32": (4, 4, 8, 4, "fp32 Adam: params 4 + grads 4 + m, v 8 = 16 B/param"),
    "bf16-fp32params": (4, 4, 8, 2, "FSDP2 MixedPrecisionPolicy(param_dtype=bf16, reduce_dtype=fp32), torchtitan's "
                                    "default: fp32 params 4 + fp32 grads 4 + Adam m, v 8 = 16 B/param, bf16 compute"),
}
RECOMPUTE = ("none", "selective", "op", "full")   # op: torchtitan's per-op selective checkpointing
FRAMEWORKS = ("torch", "megatron", "deepspeed")
PLAN_SCHEDULES = ("1f1b", "gpipe", "interleaved_1f1b")


@_renamed.renamed_keywords("kit.experiments.theory.layout_memory:ParallelConfig")  # microbatches=, one release
@dataclass(frozen=True)
class ParallelConfig:
    tp: int = 1
    pp: int = 1
    dp: int = 1
    cp: int = 1
    ep: int = 1
    zero: int = 0
    micro_batch: int = 1
    micro_batches: int = 1        # per step, per data-parallel rank (gradient accumulation / pipeline)
    recompute: str = "selective"
    sp: bool = True              # sequence parallel (only means something when tp > 1)
    schedule: str = "1f1b"
    precision: str = "bf16"
    virtual_stages: int = 1      # v chunks per GPU (interleaved 1F1B, Megatron's virtual pipeline); 1 = none
    framework: str = "torch"     # whose implementation runs it: "torch" (FSDP2), "megatron" or "deepspeed"
    tp_overlap: bool = False     # async TP: tp's collectives decomposed and overlapped with the matmuls they feed
    __getattr__ = _renamed.renamed_attributes("kit.experiments.theory.layout_memory:ParallelConfig")

    @property
    def gpus(self) -> int:
        return self.tp * self.pp * self.dp * self.cp

    def check(self) -> None:
        if min(self.tp, self.pp, self.dp, self.cp, self.ep, self.micro_batch, self.micro_batches) < 1:
            raise ValueError("every parallel degree and batch size must be at least 1")
        if self.virtual_stages < 1 or (self.virtual_stages > 1) != (self.schedule == "interleaved_1f1b"):
            raise ValueError(f"virtual_stages={self.virtual_stages} goes with schedule='interleaved_1f1b' "
                             f"(v > 1) and only with it (got schedule={self.schedule!r})")
        if self.zero not in (0, 1, 2, 3):
            raise ValueError(f"zero must be 0, 1, 2 or 3, not {self.zero}")
        if (self.recompute in RECOMPUTE and self.schedule in PLAN_SCHEDULES and self.framework in FRAMEWORKS
                and self.precision in PLAN_PRECISIONS):
            return  # the common case, without building the message list (a plan checks thousands of layouts)
        bad = [f"{name}={value!r} is not one of {tuple(known)}" for name, value, known in
               (("recompute", self.recompute, RECOMPUTE), ("schedule", self.schedule, PLAN_SCHEDULES),
                ("framework", self.framework, FRAMEWORKS),
                ("precision", self.precision, PLAN_PRECISIONS)) if value not in known]
        if bad:
            raise ValueError("; ".join(bad))


@dataclass(frozen=True)
class MemoryBreakdown:
    """Predicted GiB on the fullest GPU (first or last pipeline stage)."""
    params_gib: float
    grads_gib: float
    optimizer_gib: float
    activations_gib: float
    gathered_gib: float      # ZeRO-3's gathered layers and unsharded layer gradient
    logits_gib: float
    allowance_gib: float     # CUDA context, workspaces, fragmentation (assumed)
    stage: str               # "first", "last" or "only"

    @property
    def total_gib(self) -> float:
        return (self.params_gib + self.grads_gib + self.optimizer_gib + self.activations_gib + self.gathered_gib
                + self.logits_gib + self.allowance_gib)

    def text(self) -> str:
        parts = [("params", self.params_gib), ("grads", self.grads_gib), ("optimizer", self.optimizer_gib),
                 ("activations", self.activations_gib), ("ZeRO-3 gathered", self.gathered_gib),
                 ("logits", self.logits_gib), ("allowance", self.allowance_gib)]
        return " + ".join(f"{k} {v:.1f}" for k, v in parts if v > 0.05) + f" = {self.total_gib:.1f} GiB (predicted)"


def stage_layers(m: ModelSpec, pc: ParallelConfig) -> int:
    """Layers on the fullest GPU: v chunks of ceil(L / (pp v)) layers, the last chunks holding fewer when
    the layers do not split evenly (Llama 3 405B's 126 layers on 16 stages; Dubey et al. 2024 Sec. 3.3.2
    give the first and last stages one layer less, which the fullest GPU does not see)."""
    v = pc.virtual_stages
    return v * math.ceil(m.layers / (pc.pp * v))


def stage_params(m: ModelSpec, pc: ParallelConfig, stage: str) -> tuple[float, float]:
    """(non-MLP, MLP/expert) parameters one GPU of a pipeline stage holds, before ZeRO sharding."""
    return _stage_params(m, pc.tp, pc.pp, pc.ep, pc.virtual_stages, stage)


@lru_cache(maxsize=4096)  # a plan asks ~20,000 times for a few hundred (tp, pp, ep, v, stage); the spec is frozen
def _stage_params(m: ModelSpec, tp: int, pp: int, ep: int, v: int, stage: str) -> tuple[float, float]:
    layers = v * math.ceil(m.layers / (pp * v))   # stage_layers
    dense_layer, expert_layer = m.layer_params()
    dense = layers * dense_layer
    if stage in ("first", "only"):
        dense += m.embedding_params()
    if stage in ("last", "only"):
        # a tied head is the embedding itself; on its own last stage it is a copy (Megatron-LM keeps one)
        copy = m.vocab * m.hidden if (m.tied_embeddings and pp > 1) else 0
        dense += m.norm_params() + m.head_params() + copy
    return dense / tp, layers * expert_layer / (tp * ep)


def state_bytes(m: ModelSpec, pc: ParallelConfig, stage: str = "only") -> dict[str, float]:
    """Bytes of params, grads and optimizer state on one GPU under the ZeRO stage."""
    return dict(_state_bytes(m, pc.tp, pc.pp, pc.ep, pc.virtual_stages, pc.dp * pc.cp, pc.zero, pc.precision, stage))


@lru_cache(maxsize=8192)  # a plan asks ~12,000 times for a few thousand distinct states; the spec is frozen
def _state_bytes(m: ModelSpec, tp: int, pp: int, ep: int, v: int, shard: int, zero: int, precision: str,
                 stage: str) -> tuple[tuple[str, float], ...]:
    pb, gb, ob, _, _ = PLAN_PRECISIONS[precision]
    dense, expert = _stage_params(m, tp, pp, ep, v, stage)
    shard_dense, shard_expert = shard, max(shard // ep, 1)

    def held(nbytes: float, sharded: bool) -> float:
        return nbytes * (dense / shard_dense + expert / shard_expert if sharded else dense + expert)

    return (("params", held(pb, zero >= 3)), ("grads", held(gb, zero >= 2)), ("optimizer", held(ob, zero >= 1)))


def activation_bytes_per_layer(m: ModelSpec, pc: ParallelConfig, seq_len: int, recompute: str | None = None) -> float:
    """Korthikanti et al. 2022's per-layer activation bytes, generalised to GQA, SwiGLU, MoE, no dropout."""
    return _activation_bytes(m, seq_len, pc.cp, pc.micro_batch, pc.tp, pc.sp, pc.precision, recompute or pc.recompute)


@lru_cache(maxsize=8192)  # a plan asks ~16,000 times for a few hundred shapes; the spec is frozen
def _activation_bytes(m: ModelSpec, seq_len: int, cp: int, micro_batch: int, tp: int, sp_on: bool, precision: str,
                      recompute: str) -> float:
    s, b, h, t = seq_len / cp, micro_batch, m.hidden, tp
    sp = sp_on and t > 1
    _, _, _, act, _ = PLAN_PRECISIONS[precision]
    scale = s * b * h * act / 2  # the coefficients below are for 2-byte activations
    if recompute == "full":
        return scale * 2 / (t if sp else 1)
    if recompute == "op":
        _, saved = op_sac_split(m)
        return scale * (2 / (t if sp else 1) + 2 * (1 + sum(saved)) / t)   # block input; attention output + saved
    r = m.kv_heads / m.heads
    whole = 4 + 2 + 2 + (2 if m.dropout else 0)
    mlp = (6 if m.gated_mlp else 4) * m.ffn / h * m.experts_per_token
    split = 2 + 4 * r + 2 + mlp
    score = attention_score_units(m, seq_len) if recompute == "none" else 0.0
    return scale * (whole / (t if sp else 1) + (split + score) / t)


@lru_cache(maxsize=64)  # a plan asks thousands of times for one spec (tuples: the cached value is shared)
def op_sac_split(m: ModelSpec) -> tuple[tuple[float, ...], tuple[float, ...]]:
    """torchtitan's per-op selective checkpointing (its `_save_list` policy): of a block's matmuls, in the
    order they run, every second one is recomputed, the others' outputs saved, as are the attention's
    output and the block's input; pointwise ops are recomputed. Returns (FLOPs per token of the recomputed
    matmuls, in units of h^2; widths of the saved outputs, in units of h)."""
    r, f = m.kv_heads / m.heads, m.ffn / m.hidden * m.experts_per_token
    shapes = [(1, 1), (1, r), (1, r), (1, 1)] + ([(1, f), (1, f), (f, 1)] if m.gated_mlp else [(1, f), (f, 1)])
    return tuple(2 * a * b for a, b in shapes[1::2]), tuple(b for _, b in shapes[0::2])


def attention_score_units(m: ModelSpec, seq_len: int) -> float:
    """Korthikanti's score term in s b h units: 5as/h with dropout, 2as/h without; 0 when the attention
    is fused (FlashAttention keeps only its output and the softmax statistics)."""
    return 0.0 if m.flash_attention else (5 if m.dropout else 2) * m.heads * seq_len / m.hidden


def in_flight(pc: ParallelConfig) -> tuple[float, float]:
    """Micro-batches' worth of a stage's activations held at the peak on the (first, last) rank."""
    p, m, v = pc.pp, pc.micro_batches, pc.virtual_stages
    if pc.schedule == "gpipe" or (v > 1 and m == p):  # m = p: Megatron's interleaving warms up with every forward
        return m, m
    if v == 1:
        return min(p, m), 1
    return min(p + (p - 1) / v, m), min(((v - 1) * p + 1) / v, m)


def memory_per_gpu(m: ModelSpec, pc: ParallelConfig, seq_len: int, allowance_gib: float = ALLOWANCE_GIB,
                   fragmentation: float = FRAGMENTATION) -> MemoryBreakdown:
    """The fullest stage's predicted memory (first stage: most micro-batches in flight; last: logits)."""
    pc.check()
    layers = stage_layers(m, pc)
    per_layer = activation_bytes_per_layer(m, pc, seq_len)
    # full recompute: one layer's activations are rematerialised during its backward
    # full recompute rematerialises one layer at a time: Korthikanti's terms less the scores
    working = activation_bytes_per_layer(m, pc, seq_len, "selective") if pc.recompute == "full" else 0.0
    in_flight_first, in_flight_last = in_flight(pc)
    pb, gb, _, act, _ = PLAN_PRECISIONS[pc.precision]
    dense_layer, expert_layer = m.layer_params()
    layer_gpu = dense_layer / pc.tp + expert_layer / (pc.tp * pc.ep)
    gathered = (2 * act + gb) * layer_gpu if pc.zero == 3 else 0.0  # gathered in the compute dtype
    if pc.zero == 3 and pc.framework == "deepspeed":
        # DeepSpeed gathers parameter by parameter and caps what is live: stage3_max_live_parameters (1e9)
        # and reduce_bucket_size (5e8 elements) by default (DeepSpeed's config docs)
        gathered = min(2 * layer_gpu, 1e9) * act + min(layer_gpu, 5e8) * gb
    # 1F1B and interleaving (m > pp): the last chunk's forward is followed by its backward, one logits at a time
    logits_held = pc.micro_batches if in_flight_last == pc.micro_batches and pc.pp > 1 else 1
    # the logits and the loss: bf16 logits and an fp32 copy (Megatron's count); torchtitan's
    # cross_entropy(logits.float()) also keeps fp32 log-probabilities and their gradient beside the bf16 one
    per_logit = act + 4 + (4 + act if pc.framework == "torch" else 0)
    logits = pc.micro_batch * seq_len / pc.cp * m.vocab / pc.tp * per_logit * logits_held
    stages = ["only"] if pc.pp == 1 else ["first", "last"]
    best: MemoryBreakdown | None = None
    for stage in stages:
        st = state_bytes(m, pc, stage)
        flight = in_flight_first if stage in ("first", "only") else in_flight_last
        acts = layers * per_layer * flight + working
        lg = logits if stage in ("last", "only") else 0.0
        allocated = sum(st.values()) + acts + gathered + lg
        mb = MemoryBreakdown(st["params"] / GIB, st["grads"] / GIB, st["optimizer"] / GIB, acts / GIB,
                             gathered / GIB, lg / GIB, allowance_gib + fragmentation * allocated / GIB, stage)
        if best is None or mb.total_gib > best.total_gib:
            best = mb
    assert best is not None
    return best
