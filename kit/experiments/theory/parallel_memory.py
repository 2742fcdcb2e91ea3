"""Memory per rank by kind for the kit's gpt under tp, sp, cp and ep: parameters, gradients,
optimizer state and activations, as formulas. Pure Python, never torch: the ranks put these
beside what they measured, and a test checks how they change with the world size.

The model (kit/experiments/models.py `gpt`): an embedding (tokens V x h, positions S x h), L blocks
(ln1, qkv h -> 3h, proj h -> h, ln2, MLP h -> 4h -> h, all with biases), a head (LayerNorm,
Linear h -> V). Sources (docs/strategies.md):
- tp / sp (Shoeybi et al. 2019, Megatron-LM, arXiv:1909.08053, Sec. 3): qkv and the MLP's first
  Linear are split by output (weight and bias / t), proj and the MLP's second Linear by input
  (weight / t, the bias whole: it is added once, after the all-reduce). The LayerNorms, the
  embedding and the head stay whole (the toy keeps them replicated; Megatron splits the
  vocabulary too). Sequence parallelism moves activations, not weights.
- cp (ring attention, Liu et al. 2023, arXiv:2310.01889): every weight whole on every rank.
- ep (GShard, Lepikhin et al. 2020, arXiv:2006.16668; Switch, Fedus et al. 2021,
  arXiv:2101.03961): a rank holds E/n experts of each layer and the whole dense part (attention,
  LayerNorms, router, embedding, head).
- Adam (Kingma & Ba 2015; torch.optim.Adam): exp_avg and exp_avg_sq, fp32 like the weight (8
  bytes/parameter), plus `step`, one fp32 scalar per parameter tensor (torch/optim/adam.py `_init_group`:
  `torch.tensor(0.0, dtype=_get_scalar_dtype())`, float32 unless the default dtype is float64, kept on the
  CPU unless capturable or fused). Gradients as the weights. The bytes per parameter are
  zero_bytes_per_param's (the planner's table, PLAN_PRECISIONS); `state_mib` is the one formula every
  strategy's prediction goes through (single, ddp, zero1, fsdp, hsdp, the meshes, the pipeline).
- Activations (Korthikanti et al. 2022, arXiv:2205.05198, Sec. 4), counted for this fp32 model
  without dropout and with flash-style attention (no s x s scores): per block 4 b s h replicated
  (the LayerNorms' inputs and outputs; sp splits them), 12 b s h split (q, k, v, attention output,
  the MLP's 4h input and GELU output), per token the LayerNorms' mean and 1/std and attention's
  log-sum-exp per head; plus the ends: the embedding's token ids, the head's LayerNorm, the logits'
  log-softmax and the loss's int64 targets.
"""
from __future__ import annotations

import math
from typing import Any

from kit.experiments.choices import HAND_WRITTEN, SPLITS_SEQUENCE, SPLITS_WEIGHTS
from kit.experiments.theory.layout_memory import PLAN_PRECISIONS
from kit.units import MIB
from kit import _renamed

__all__ = ["gpt_params_per_rank", "zero_bytes_per_param", "ZERO_SPLITS", "adam_bytes", "state_mib", "STEP_BYTES",
           "predict_tp_activation_bytes", "edge_activation_bytes",
           "moe_activation_bytes", "model_activation_bytes", "memory_per_rank", "ep_routing_expected"]
__getattr__ = _renamed.renamed_getattr(__name__)  # this release's old names, for one release

F32, I64 = 4, 8
STEP_BYTES = F32  # Adam's `step`: a 0-dim float32 per parameter tensor (torch.optim.Adam, default dtype float32)
# The first ZeRO stage that splits each kind over the ranks.
ZERO_SPLITS = {"params": 3, "grads": 2, "optimizer": 1}
_ROWS = {False: "fp32", True: "bf16-bf16grads"}  # PLAN_PRECISIONS' rows: fp32 Adam, the paper's mixed precision
PARALLEL_KINDS = HAND_WRITTEN  # the kinds the formulas below cover: the hand-written parallelisms


def gpt_params_per_rank(strategy: str, hidden: int, layers: int, vocab: int, seq: int, t: int,
                        experts: int = 0) -> dict[str, Any]:
    """Parameters (elements) and parameter tensors one rank holds; `split` is the part divided over t."""
    h, f = hidden, 4 * hidden
    ends, end_tensors = vocab * h + seq * h + 2 * h + vocab * h + vocab, 6  # embed (2), head LN (2) + Linear (2)
    if strategy in SPLITS_WEIGHTS:
        split, whole, tensors = layers * (12 * h * h + 7 * h) // t, layers * 6 * h, 12 * layers
        formula = "L(12h^2 + 7h)/t + 6hL + (2Vh + Sh + 2h + V)"
    elif strategy == "cp":
        split, whole, tensors = 0, layers * (12 * h * h + 13 * h), 12 * layers
        formula = "L(12h^2 + 13h) + (2Vh + Sh + 2h + V), every weight whole"
    elif strategy == "ep":
        local = experts // t
        split = layers * local * (2 * h * f + f + h)
        whole, tensors = layers * (4 * h * h + 8 * h + h * experts), layers * (9 + 4 * local)
        formula = "L(E/t)(2hf + f + h), f=4h, + L(4h^2 + 8h + hE) + (2Vh + Sh + 2h + V)"
    else:
        raise ValueError(f"strategy {strategy!r}: one of {PARALLEL_KINDS}")
    return {"numel": split + whole + ends, "split": split, "whole": whole + ends,
            "tensors": tensors + end_tensors, "formula": formula}


def zero_bytes_per_param(stage: int, world_size: int, mixed: bool = False) -> dict[str, float]:
    """Bytes per parameter on one rank for params, grads and optimizer state at a ZeRO stage.

    fp32 Adam: params 4, grads 4, optimizer 8 (m, v). Mixed precision (the paper's numbers):
    params 2, grads 2, optimizer 12 (fp32 master copy + m + v). Stage 1 shards the optimizer
    state, stage 2 also the gradients, stage 3 also the parameters, each over N ranks.
    """
    whole = dict(zip(ZERO_SPLITS, map(float, PLAN_PRECISIONS[_ROWS[mixed]][:3])))
    return {k: b / world_size if stage >= ZERO_SPLITS[k] else b for k, b in whole.items()}


def adam_bytes(numel: float, tensors: float) -> float:
    """exp_avg + exp_avg_sq (fp32) per element, plus one fp32 `step` per parameter tensor."""
    return zero_bytes_per_param(0, 1)["optimizer"] * numel + STEP_BYTES * tensors


def state_mib(numel: int, tensors: int, shards: int = 1, of: str = "P", over: str = "N", stage: int = 3,
              whole_tensors: bool = False, mixed: bool = False) -> dict[str, Any]:
    """Parameters, gradients and Adam's state (MiB) one rank holds of `numel` parameters in `tensors` tensors,
    with their formulas: the bytes per parameter of zero_bytes_per_param (fp32 Adam 4 + 4 + 8;
    `mixed`: the paper's 2 + 2 + 12), the kinds ZeRO's `stage` splits divided over `shards` ranks (FSDP and HSDP
    are stage 3, torch's ZeRO-1 stage 1; shards=1: held whole), plus Adam's `step`, 4 bytes per tensor. FSDP
    splits every tensor, so every rank keeps all `tensors` steps; `whole_tensors`: the ranks own whole tensors
    (torch's ZeroRedundancyOptimizer), so a rank keeps tensors / shards steps on average. `of` names the
    parameters in the formulas ("P", "P_stage"), `over` the shards ("N", "d", "s")."""
    whole = zero_bytes_per_param(0, 1, mixed)
    split = {k: shards > 1 and stage >= first for k, first in ZERO_SPLITS.items()}
    name = {k: f"{of} / {over}" if split[k] else of for k in whole}
    mib = {k: whole[k] * numel / (shards if split[k] else 1) for k in whole}
    steps = tensors / shards if whole_tensors and split["optimizer"] else tensors
    mib["optimizer"] += STEP_BYTES * steps
    adam = f"Adam: {whole['optimizer']:g} bytes x {name['optimizer']}" + (" (fp32 master, m, v)" if mixed else "")
    tensors_of = f"tensors / {over}" if whole_tensors and split["optimizer"] else "tensors"
    return {"params_mib": mib["params"] / MIB, "grads_mib": mib["grads"] / MIB, "optimizer_mib": mib["optimizer"] / MIB,
            "formula": {"params": f"{whole['params']:g} bytes x {name['params']}",
                        "grads": f"{whole['grads']:g} bytes x {name['grads']}",
                        "optimizer": f"{adam} + {STEP_BYTES} bytes x {tensors_of} (step)"}}


def predict_tp_activation_bytes(batch: int, seq: int, hidden: int, heads: int, tp: int, sp: bool = False,
                                elem_bytes: int = 4) -> dict[str, Any]:
    """Bytes one block saves for backward, per rank, for the kit's block (fp32, no dropout,
    flash-style attention that keeps no s x s scores):

    - 4 b*s*h replicated (LayerNorm inputs and outputs; sequence parallel splits them over t),
    - 12 b*s*h split over t (q, k, v, attention output, the 4h MLP input and GELU output),
    - per token: two LayerNorms' mean and 1/std (4 b*s, replicated or split as the LayerNorms)
      and attention's log-sum-exp per local head (b*s*a/t).

    Korthikanti et al. 2022 (arXiv:2205.05198), fp16 with dropout, count the same way:
    s*b*h*(10 + 24/t + 5as/(ht)) bytes; with sequence parallel s*b*h/t*(34 + 5as/h)."""
    sbh, ln = batch * seq * hidden * elem_bytes, 4 * batch * seq * elem_bytes
    rep = (4 * sbh + ln) / (tp if sp else 1)
    split = (12 * sbh + batch * seq * heads * elem_bytes) / tp
    where = "4/t" if sp else "4"
    return {"bytes": rep + split,
            "formula": f"4 bytes x [b*s*h x ({where} + 12/t) + b*s x ({where} + a/t)]",
            "korthikanti_fp16_bytes": (seq * batch * hidden * (34 + 5 * heads * seq / hidden) / tp) if sp else
            seq * batch * hidden * (10 + 24 / tp + 5 * heads * seq / (hidden * tp))}


def edge_activation_bytes(batch: int, seq: int, hidden: int, vocab: int, position_ids: bool = False) -> int:
    """The ends of the model: token ids (int64, the embedding's backward), the head's LayerNorm
    input, output, mean and 1/std, the log-softmax of the logits, the targets (int64) and the
    loss's scalar weight; `position_ids`: a gathered position table keeps its int64 indices (cp)."""
    bs = batch * seq
    ids = I64 * bs * 2 + (I64 * seq if position_ids else 0)  # token ids and targets (+ cp's positions)
    return ids + F32 * (2 * bs * hidden + 2 * bs + bs * vocab) + F32


def moe_activation_bytes(tokens: int, hidden: int, experts: int, k: int, kept: int, received: int) -> int:
    """One expert-parallel MoE layer on a rank with `tokens` tokens, `kept` of its T k assignments
    within capacity (dispatched) and `received` rows for its own experts (expert_parallel.py):
    the router's softmax (T E), top-k indices (int64) and values, their sum (T); per kept
    assignment three int64 index vectors (gather, gate, index_add), its gate, the row back from
    its expert and that row times the gate (2h: the product is index_add's source, which
    `expand_as(source)` in its backward keeps); per received row the expert MLP's input (h),
    hidden (4h) and GELU output (4h)."""
    router = F32 * tokens * experts + (I64 + F32) * tokens * k + F32 * tokens
    return router + kept * (3 * I64 + F32 + 2 * F32 * hidden) + received * F32 * 9 * hidden


def ep_routing_expected(tokens: int, experts: int, k: int, capacity_factor: float | None) -> dict[str, Any]:
    """Balanced routing (the planning case): every expert gets T k / E of a rank's assignments,
    at most its capacity C = ceil(cf T k / E) (GShard); a rank's E/n experts then receive
    n (E/n) min(C, T k / E) = E min(C, T k / E) rows."""
    per_expert = tokens * k / experts
    cap = math.ceil(capacity_factor * tokens * k / experts) if capacity_factor else None
    fit = min(per_expert, cap) if cap is not None else per_expert
    return {"capacity": cap, "kept": experts * fit, "received": experts * fit,
            "formula": "kept = received = E min(C, T k / E), C = ceil(cf T k / E)"}


def model_activation_bytes(strategy: str, batch: int, seq: int, hidden: int, heads: int, layers: int,
                           vocab: int, t: int, moe: list[dict[str, int]] | None = None,
                           experts: int = 0, k: int = 0) -> dict[str, Any]:
    """What the whole forward saves on one rank. `seq` is the full sequence; `batch` this rank's.
    ep: `moe` per layer {"kept", "received"} (routing counts, or `ep_routing_expected`)."""
    if strategy in SPLITS_WEIGHTS:
        per = predict_tp_activation_bytes(batch, seq, hidden, heads, t, sp=strategy in SPLITS_SEQUENCE)
        layer = [per["bytes"]] * layers
        ends, formula = edge_activation_bytes(batch, seq, hidden, vocab), f"L x {per['formula']} + ends"
    elif strategy == "cp":
        per = predict_tp_activation_bytes(batch, seq // t, hidden, heads, 1)
        layer = [per["bytes"]] * layers
        ends = edge_activation_bytes(batch, seq // t, hidden, vocab, position_ids=True)
        formula = "L x 4 bytes x [b(s/t)h x 16 + b(s/t) x (4 + a)] + ends on s/t tokens"
    elif strategy == "ep":
        bsh, bs = batch * seq * hidden, batch * seq
        dense = F32 * (8 * bsh + bs * (4 + heads))  # the block without its MLP (t = 1)
        layer = [dense + moe_activation_bytes(bs, hidden, experts, k, m["kept"], m["received"]) for m in moe or []]
        ends = edge_activation_bytes(batch, seq, hidden, vocab)
        formula = ("per layer 4 bytes x [8bsh + bs(4 + a)] + MoE(T E + 3Tk + T + kept (7 + 2h) + received 9h) + ends")
    else:
        raise ValueError(f"strategy {strategy!r}: one of {PARALLEL_KINDS}")
    return {"bytes": sum(layer) + ends, "per_layer_bytes": layer, "ends_bytes": ends, "formula": formula}


def memory_per_rank(strategy: str, batch: int, seq: int, hidden: int, heads: int, layers: int, vocab: int,
                    t: int, experts: int = 0, k: int = 0, moe: list[dict[str, int]] | None = None) -> dict[str, Any]:
    """Predicted MiB per rank by kind, each with its formula (the plot's 'predicted' bars)."""
    p = gpt_params_per_rank(strategy, hidden, layers, vocab, seq, t, experts)
    act = model_activation_bytes(strategy, batch, seq, hidden, heads, layers, vocab, t, moe, experts, k)
    state = state_mib(p["numel"], p["tensors"])
    formula = {**state.pop("formula"), "activations": act["formula"]}
    return {**state, "activations_mib": act["bytes"] / MIB, "n_params": p["numel"], "n_tensors": p["tensors"],
            "formula": {**formula, "params": f"4 bytes x P, P = {p['formula']}"}}
