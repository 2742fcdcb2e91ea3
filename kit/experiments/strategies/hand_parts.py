"""The parts `HandParallel` runs each hand-written parallelism with: `TP`, `SP`, `CP` and `EP`, one
`HandParts` each (hand_parallel.py declares the fields), built from parallel/'s blocks and
theory/'s formulas. tp on a mesh is built from `TP` in mesh_strategies.py.
"""
from __future__ import annotations

from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from kit.experiments.measure.memory import ActivationMeter
from kit.experiments.choices import GPT_SEQ
from kit.experiments.models import Block, VOCAB
from kit.experiments.parallel.context import ContextParallelGPT, check_ring_attention, split_sequence
from kit.experiments.parallel.expert import ExpertParallelMoE, MoE, TokenMoE, check_ep
from kit.experiments.parallel.mesh import average_gradients
from kit.experiments.parallel.sequence import (check_sp, scatter_sequence, sequence_parallel,
                                               sync_sequence_parallel_grads)
from kit.experiments.parallel.tensor import check_tp, layer_activation_bytes, tensor_parallel
from kit.experiments.measure.group_device import group_device
from kit.experiments.strategies.hand_parallel import (Built, HandParallel, HandParts, predicted_memory,
                                                      standard_comm_report, standard_memory)
from kit.experiments.theory.comm_bytes import (predict_cp_bytes, predict_dp_bytes, predict_ep_bytes, predict_sp_bytes,
                                              predict_tp_bytes)
from kit.experiments.theory.parallel_memory import (ep_routing_expected, memory_per_rank, model_activation_bytes,
                                                   predict_tp_activation_bytes)

__all__ = ["TP", "SP", "CP", "EP", "tp_describe", "tp_predict", "tp_layer_activations"]


# -- tp: Megatron tensor parallelism over every rank (parallel/tensor.py) ----------------------------
def tp_describe(run: HandParallel) -> str:
    return (f"tensor parallel over {run.t} ranks: heads {run.heads} -> {run.heads // run.t} per rank, "
            f"MLP 4h={4 * run.hidden} -> {4 * run.hidden // run.t}; 2 all-reduces forward, 2 backward per layer")


def tp_predict(run: HandParallel, batch: int) -> dict[str, Any]:
    return predict_tp_bytes(batch, GPT_SEQ, run.hidden, run.layers, run.t)


def tp_layer_activations(run: HandParallel, x: torch.Tensor) -> dict[str, Any]:
    return {"measured": layer_activation_bytes(run.model, x, 1),  # type: ignore[arg-type]
            "predicted": predict_tp_activation_bytes(x.shape[0], x.shape[1], run.hidden, run.heads, run.t)}


TP = HandParts(kind="tp", build=lambda run, model: Built(tensor_parallel(model, run.group)), describe=tp_describe,
               check=lambda run: check_tp(steps=3, group=run.group), predict=tp_predict,
               layer_activations=tp_layer_activations)


# -- sp: tensor parallelism with the LayerNorms split along the sequence (parallel/sequence.py) -----
def _sp_build(run: HandParallel, model: nn.Sequential) -> Built:
    built = sequence_parallel(model, run.group)
    return Built(built, lambda: sync_sequence_parallel_grads(built))


def _sp_describe(run: HandParallel) -> str:
    return (f"sequence parallel over {run.t} ranks: LayerNorms on {GPT_SEQ // run.t} of {GPT_SEQ} tokens, "
            "all-gather / reduce-scatter in place of all-reduce")


def _sp_layer_activations(run: HandParallel, x: torch.Tensor) -> dict[str, Any]:
    model: Any = run.model
    with torch.no_grad():
        h = scatter_sequence(model[0](x), run.group)
    return {"measured": layer_activation_bytes(nn.Sequential(model[1]), h, 0),
            "predicted": predict_tp_activation_bytes(x.shape[0], x.shape[1], run.hidden, run.heads, run.t, sp=True)}


SP = HandParts(kind="sp", build=_sp_build, describe=_sp_describe, check=lambda run: check_sp(steps=3, group=run.group),
               predict=lambda run, batch: predict_sp_bytes(batch, GPT_SEQ, run.hidden, run.layers, run.t),
               layer_activations=_sp_layer_activations)


# -- cp: ring attention, each rank holding s/t tokens (parallel/context.py) -------------------------
def _all_reduce_bytes(params: list[torch.Tensor], t: int, dim: str) -> dict[str, Any]:
    """The data all-reduce of `params`' gradients over the t ranks, as a dp dimension's (comm_bytes)."""
    return predict_dp_bytes(sum(p.numel() * p.element_size() for p in params), t, dim)


def _cp_build(run: HandParallel, model: nn.Sequential) -> Built:
    # every weight is replicated; each rank saw s/t tokens: one flat all-reduce averages the gradients
    return Built(ContextParallelGPT(*model, group=run.group, zigzag=run.cfg.zigzag),
                 lambda: average_gradients(run.params, run.group, "cp"))


def _cp_describe(run: HandParallel) -> str:
    split = "zig-zag (chunks r and 2t-1-r)" if run.cfg.zigzag else "contiguous"
    return f"context parallel over {run.t} ranks: {GPT_SEQ // run.t} of {GPT_SEQ} tokens each, {split}, ring attention"


def _cp_local(run: HandParallel, x: torch.Tensor, y: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    r = dist.get_rank(run.group)
    return (split_sequence(x, r, run.t, run.cfg.zigzag, dim=1), split_sequence(y, r, run.t, run.cfg.zigzag, dim=1))


def _cp_layer_activations(run: HandParallel, x: torch.Tensor) -> dict[str, Any]:
    """One block on this rank's s/t tokens: what one process keeps for the block, over t (ring
    attention keeps q, k, v, its output and log-sum-exp of the local tokens only)."""
    model: Any = run.model
    with torch.no_grad():
        h = model[0].tok(x) + model[0].pos[: x.shape[1]]  # any positions: shapes are what count
    h.requires_grad_()
    meter = ActivationMeter(model[1].parameters())
    with meter.record():
        model.block(model[1], h)
    b, s = x.shape
    one = predict_tp_activation_bytes(b, s, run.hidden, run.heads, 1)
    return {"measured": meter.bytes,
            "predicted": {"bytes": one["bytes"], "formula": "4 bytes x [b*(s/t)*h x 16 + b*(s/t) x (4 + a)]"}}


def _cp_predict(run: HandParallel, batch: int) -> dict[str, Any]:
    one = predict_cp_bytes(batch, GPT_SEQ, run.hidden, run.t)
    return {"cp/send": {k: v * run.layers for k, v in one["cp/send"].items()}, "formula": one["formula"] + " per layer",
            **_all_reduce_bytes(run.params, run.t, "cp")}


def _cp_comm_report(run: HandParallel) -> dict[str, Any]:
    """The standard report, and the last forward's attention work on every rank (collective)."""
    rep = standard_comm_report(run)
    work: Any = getattr(run.model, "attention_work", {})
    dev = group_device(run.group)
    mine = torch.tensor([float(work.get("score_entries", 0)), float(work.get("compute_ms", 0.0))], device=dev)
    every = [torch.zeros(2, device=dev) for _ in range(run.t)]
    dist.all_gather(every, mine, group=run.group)
    rep["attention_work"] = {
        "cp": run.t, "zigzag": run.cfg.zigzag, "layers": run.layers,
        "score_entries_per_rank": [int(e[0]) for e in every], "compute_ms_per_rank": [float(e[1]) for e in every],
        "method": "score entries: query-key pairs the causal mask keeps, counted per (query chunk, key chunk) from "
                  "chunk_starts, per sequence and head, summed over layers; compute ms: ring attention forward "
                  "blocks timed with perf_counter (hops excluded), last step"}
    return rep


CP = HandParts(kind="cp", build=_cp_build, describe=_cp_describe, local=_cp_local, mean_over_ranks=True,
               check=lambda run: check_ring_attention(zigzag=run.cfg.zigzag, group=run.group), predict=_cp_predict,
               layer_activations=_cp_layer_activations, comm_report=_cp_comm_report)


# -- ep: each block's MLP a mixture of experts (top-k routing), experts split over ranks (parallel/expert.py)
def _moes(run: HandParallel) -> list[Any]:
    return [m for m in run.model.modules() if isinstance(m, ExpertParallelMoE)]


def _expert_params(model: nn.Module) -> list[torch.Tensor]:
    return [p for m in model.modules() if isinstance(m, ExpertParallelMoE) for p in m.experts.parameters()]


def _ep_build(run: HandParallel, model: nn.Sequential) -> Built:
    c = run.cfg
    for i, blk in enumerate(m for m in model if isinstance(m, Block)):
        full = MoE(run.hidden, c.experts, c.top_k, 4 * run.hidden, c.capacity_factor, seed=c.seed + i)
        blk.mlp = TokenMoE(ExpertParallelMoE(full, run.group))
    return Built(model, lambda: _ep_sync(run))


def _ep_sync(run: HandParallel) -> None:
    """The replicated weights' gradients averaged by one flat all-reduce; the experts' only divided by
    the group size (their rank already got every token routed to them)."""
    experts = _expert_params(run.model)
    ids = {id(p) for p in experts}
    average_gradients([p for p in run.params if id(p) not in ids], run.group, "ep_dp")
    for p in experts:
        if p.grad is not None:
            p.grad /= run.t


def _ep_describe(run: HandParallel) -> str:
    c = run.cfg
    cap = f"capacity factor {c.capacity_factor:g}" if c.capacity_factor else "no capacity limit (nothing dropped)"
    return (f"expert parallel over {run.t} ranks: {c.experts} experts ({c.experts // run.t} per rank) in place "
            f"of each MLP, top-{c.top_k} routing, {cap}; each rank reads its own tokens")


def _ep_check(run: HandParallel) -> dict[str, Any]:
    c = run.cfg
    return check_ep(experts=c.experts, k=c.top_k, capacity_factor=c.capacity_factor, group=run.group)


def _routing(run: HandParallel) -> list[dict[str, int]]:
    """The last forward's routing per layer: assignments kept (dispatched) and rows received."""
    return [{"kept": int(m.last.keep.sum()), "received": m.last_received} for m in _moes(run)]


def _ep_layer_activations(run: HandParallel, x: torch.Tensor) -> dict[str, Any]:
    """The first block again on the same input (every rank calls: its all-to-alls run; the
    routing is the probe step's), measured beside the formula from its routing counts."""
    measured = layer_activation_bytes(run.model, x, 1)  # type: ignore[arg-type]
    pred = model_activation_bytes("ep", x.shape[0], x.shape[1], run.hidden, run.heads, 1, VOCAB, run.t,
                                  _routing(run)[:1], run.cfg.experts, run.cfg.top_k)
    return {"measured": measured, "predicted": {"bytes": pred["per_layer_bytes"][0],
                                                "formula": pred["formula"].split(" + ends")[0]}}


def _ep_predict(run: HandParallel, batch: int) -> dict[str, Any]:
    """From each layer's routing in the step last_step counted (`run.kept`): rows to and from every
    rank (collective: every rank calls)."""
    me, out = dist.get_rank(run.group), {}
    kept = run.kept or [m.last for m in _moes(run)]
    for moe, last in zip(_moes(run), kept):
        mine = torch.bincount(last.expert[last.keep] // moe.local, minlength=run.t)
        rows = [torch.zeros_like(mine) for _ in range(run.t)]
        dist.all_gather(rows, mine, group=run.group)
        for k, v in predict_ep_bytes([r.tolist() for r in rows], me, run.hidden, run.cfg.experts).items():
            if isinstance(v, dict):
                out[k] = {key: out.get(k, {}).get(key, 0) + x for key, x in v.items()}
            else:
                out[k] = v
    experts = {id(p) for p in _expert_params(run.model)}
    out.update(_all_reduce_bytes([p for p in run.params if id(p) not in experts], run.t, "ep_dp"))
    return out


def _ep_memory(run: HandParallel, memory: dict[str, Any]) -> None:
    """By kind beside the probe step's routing, and the MoE layers' activations beside balanced routing's."""
    c = run.cfg
    standard_memory(run, memory, predicted_memory(run, experts=c.experts, k=c.top_k, moe=_routing(run)))
    b = run.probe_shape[0]
    balanced = ep_routing_expected(b * GPT_SEQ, c.experts, c.top_k, c.capacity_factor)
    even = [{"kept": balanced["kept"], "received": balanced["received"]}] * run.layers
    pred = memory_per_rank("ep", b, GPT_SEQ, run.hidden, run.heads, run.layers, VOCAB, run.t,
                           c.experts, c.top_k, even)["activations_mib"]
    memory["ep_activations"] = {
        "tokens": b * GPT_SEQ, "capacity": balanced["capacity"], "per_layer_routing": _routing(run),
        "measured_mib": memory["activations_mib"],
        "predicted_from_routing_mib": memory["predicted"]["activations_mib"],
        "predicted_balanced_mib": pred, "measured_over_balanced": memory["activations_mib"] / pred,
        "balanced": balanced["formula"],
        "note": "dispatched = kept assignments of this rank's tokens; received = rows its experts computed; "
                "the balanced formula assumes every expert gets T k / E (capped at C)"}


def _ep_comm_report(run: HandParallel) -> dict[str, Any]:
    """The standard report, and per layer the tokens routed, kept and dropped per expert over every rank."""
    rep = standard_comm_report(run)
    load = []
    for moe in _moes(run):
        counts = {k: torch.tensor(v, device=group_device(run.group)) for k, v in moe.last.load(run.cfg.experts).items()}
        for v in counts.values():
            dist.all_reduce(v, group=run.group)
        load.append({**{k: v.tolist() for k, v in counts.items()},  # capacity: per rank's tokens
                     "capacity_per_rank": moe.last.capacity, "ranks": run.t})
    rep["expert_load"] = load
    return rep


EP = HandParts(kind="ep", build=_ep_build, describe=_ep_describe, check=_ep_check, predict=_ep_predict,
               # the routing of the timed step last_step counted; the probe step after it routes afresh
               keep=lambda run: [m.last for m in _moes(run)], layer_activations=_ep_layer_activations,
               mean_over_ranks=True, adjust_memory=_ep_memory, comm_report=_ep_comm_report)
