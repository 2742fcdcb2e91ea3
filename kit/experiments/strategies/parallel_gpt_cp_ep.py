"""Context and expert parallelism as run-loop strategies on the gpt workload (the loop, the
reports and the timeline: parallel_gpt.HandParallel)."""
from __future__ import annotations

from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from kit.experiments.models import Block, SEQ, VOCAB
from kit.experiments.strategies.parallel_gpt import HandParallel
from kit.experiments.measure.memory import ActivationMeter
from kit.experiments.parallel.context import check_ring_attention, chunk_starts, ring_attention, split_sequence
from kit.experiments.parallel.expert import ExpertParallelMoE, MoE, check_ep
from kit.experiments.parallel.mesh import average_gradients
from kit.experiments.parallel.tensor import layer_activation_bytes
from kit.experiments.theory.comm_bytes import predict_cp_bytes, predict_ep_bytes
from kit.experiments.theory.parallel_memory import (ep_routing_expected, memory_per_rank, model_activation_bytes,
                                                   predict_tp_activation_bytes)

__all__ = ["ContextParallelGPT", "ContextParallel", "TokenMoE", "ExpertParallel"]


class ContextParallelGPT(nn.Sequential):
    """The gpt with each rank holding its part of the sequence and attention done by ring attention.
    Same module names as the single-process model; `positions` are this rank's token positions."""

    def __init__(self, *mods: nn.Module, group: Any = None, zigzag: bool = True):
        super().__init__(*mods)
        self.group, self.zigzag = group, zigzag

    def block(self, blk: Block, h: torch.Tensor, work: dict[str, float] | None = None) -> torch.Tensor:
        """One block; `work` accumulates ring attention's score entries and compute ms."""
        b, s, d = h.shape
        q, k, v = blk.qkv(blk.ln1(h)).view(b, s, 3, blk.heads, d // blk.heads).unbind(2)
        st: dict[str, Any] = {}
        y = ring_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), self.group, True, self.zigzag, st)
        for key, val in st.items():
            if work is not None:
                work[key] = work.get(key, 0) + val
        h = h + blk.proj(y.transpose(1, 2).reshape(b, s, d))
        return h + blk.mlp(blk.ln2(h))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        t, r = dist.get_world_size(self.group), dist.get_rank(self.group)
        pos = torch.cat([torch.arange(s, s + n) for s, n in chunk_starts(x.shape[1] * t, r, t, self.zigzag)])
        h = self[0].tok(x) + self[0].pos[pos]
        work: dict[str, float] = {}
        for blk in list(self)[1:-1]:
            h = self.block(blk, h, work)
        self.attention_work = work  # this forward's, every layer: the record's work per rank
        return self[-1](h)


def _average_grads(params: list[torch.Tensor], group: Any, dim: str, scale_only: list[torch.Tensor] = ()) -> None:
    """One flat all-reduce averaging `params`' gradients over the group; `scale_only` are divided
    by the group size without communication (expert weights: their rank already got every token)."""
    average_gradients(params, group, dim)
    n = dist.get_world_size(group)
    for p in scale_only:
        if p.grad is not None:
            p.grad /= n


class ContextParallel(HandParallel):
    """Ring attention over the ranks, each holding s/t tokens (zig-zag split by default)."""

    kind = "cp"

    def build(self, model: nn.Sequential) -> nn.Module:
        return ContextParallelGPT(*model, group=self.group, zigzag=self.cfg.zigzag)

    def describe(self) -> str:
        split = "zig-zag (chunks r and 2t-1-r)" if self.cfg.zigzag else "contiguous"
        return f"context parallel over {self.t} ranks: {SEQ // self.t} of {SEQ} tokens each, {split}, ring attention"

    def one_process_check(self) -> dict[str, Any]:
        return check_ring_attention(zigzag=self.cfg.zigzag, group=self.group)

    def local(self, x: torch.Tensor, y: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        r = dist.get_rank(self.group)
        return (split_sequence(x, r, self.t, self.cfg.zigzag, dim=1),
                split_sequence(y, r, self.t, self.cfg.zigzag, dim=1))

    def sync_grads(self) -> None:
        _average_grads(self.params, self.group, "cp")  # every weight is replicated; each rank saw s/t tokens

    def mean_over_ranks(self) -> bool:
        return True

    def layer_activations(self, x: torch.Tensor) -> dict[str, Any]:
        """One block on this rank's s/t tokens: what one process keeps for the block, over t (ring
        attention keeps q, k, v, its output and log-sum-exp of the local tokens only)."""
        model: Any = self.model
        with torch.no_grad():
            h = model[0].tok(x) + model[0].pos[: x.shape[1]]  # any positions: shapes are what count
        h.requires_grad_()
        meter = ActivationMeter(model[1].parameters())
        with meter.record():
            model.block(model[1], h)
        b, s = x.shape
        one = predict_tp_activation_bytes(b, s, self.hidden, self.heads, 1)
        return {"measured": meter.bytes,
                "predicted": {"bytes": one["bytes"], "formula": "4 bytes x [b*(s/t)*h x 16 + b*(s/t) x (4 + a)]"}}

    def comm_report(self) -> dict[str, Any] | None:
        """The base's, and the last forward's attention work on every rank (collective)."""
        rep = super().comm_report() or {}
        work: Any = getattr(self.model, "attention_work", {})
        mine = torch.tensor([float(work.get("score_entries", 0)), float(work.get("compute_ms", 0.0))])
        every = [torch.zeros(2) for _ in range(self.t)]
        dist.all_gather(every, mine, group=self.group)
        rep["attention_work"] = {
            "cp": self.t, "zigzag": self.cfg.zigzag, "layers": self.layers,
            "score_entries_per_rank": [int(e[0]) for e in every], "compute_ms_per_rank": [float(e[1]) for e in every],
            "method": "score entries: query-key pairs the causal mask keeps, counted per (query chunk, key chunk) from "
                      "chunk_starts, per sequence and head, summed over layers; compute ms: ring attention forward "
                      "blocks timed with perf_counter (hops excluded), last step"}
        return rep

    def predict(self, batch: int) -> dict[str, Any]:
        one = predict_cp_bytes(batch, SEQ, self.hidden, self.t)
        pred: dict[str, Any] = {"cp/send": {k: v * self.layers for k, v in one["cp/send"].items()},
                                "formula": one["formula"] + " per layer"}
        n = sum(p.numel() * p.element_size() for p in self.params)
        pred["cp/all_reduce"] = {"calls": 1, "payload_bytes": n, "wire_bytes": 2 * (self.t - 1) / self.t * n}
        return pred


class TokenMoE(nn.Module):
    """An expert-parallel MoE in place of a block's MLP: (b, s, h) tokens in, the same shape out."""

    def __init__(self, moe: nn.Module):
        super().__init__()
        self.moe = moe

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.moe(x.reshape(-1, x.shape[-1])).view_as(x)


class ExpertParallel(HandParallel):
    """Each block's MLP becomes a mixture of `experts` MLPs (top_k routing), experts split over ranks."""

    kind = "ep"

    def build(self, model: nn.Sequential) -> nn.Module:
        c = self.cfg
        for i, blk in enumerate(m for m in model if isinstance(m, Block)):
            full = MoE(self.hidden, c.experts, c.top_k, 4 * self.hidden, c.capacity_factor, seed=c.seed + i)
            blk.mlp = TokenMoE(ExpertParallelMoE(full, self.group))
        self.expert_params = [p for m in model.modules() if isinstance(m, ExpertParallelMoE) for p in m.experts.parameters()]
        return model

    def describe(self) -> str:
        c = self.cfg
        cap = f"capacity factor {c.capacity_factor:g}" if c.capacity_factor else "no capacity limit (nothing dropped)"
        return (f"expert parallel over {self.t} ranks: {c.experts} experts ({c.experts // self.t} per rank) in place "
                f"of each MLP, top-{c.top_k} routing, {cap}; each rank reads its own tokens")

    def one_process_check(self) -> dict[str, Any]:
        c = self.cfg
        return check_ep(experts=c.experts, k=c.top_k, capacity_factor=c.capacity_factor, group=self.group)

    def sync_grads(self) -> None:
        ids = {id(p) for p in self.expert_params}
        _average_grads([p for p in self.params if id(p) not in ids], self.group, "ep_dp", self.expert_params)

    def mean_over_ranks(self) -> bool:
        return True

    def _moes(self) -> list[Any]:
        return [m for m in self.model.modules() if isinstance(m, ExpertParallelMoE)]

    def layer_activations(self, x: torch.Tensor) -> dict[str, Any]:
        """The first block again on the same input (every rank calls: its all-to-alls run; the
        routing is the probe step's), measured beside the formula from its routing counts."""
        measured = layer_activation_bytes(self.model, x, 1)  # type: ignore[arg-type]
        pred = model_activation_bytes("ep", x.shape[0], x.shape[1], self.hidden, self.heads, 1, VOCAB, self.t,
                                      self._routing()[:1], self.cfg.experts, self.cfg.top_k)
        return {"measured": measured, "predicted": {"bytes": pred["per_layer_bytes"][0],
                                                    "formula": pred["formula"].split(" + ends")[0]}}

    def keep_step(self) -> None:
        # the routing of the timed step last_step counted; the probe step after it routes afresh
        self.kept_routing = [m.last for m in self._moes()]

    def predict(self, batch: int) -> dict[str, Any]:
        """From each layer's routing in the step last_step counted: rows to and from every rank (collective:
        every rank calls)."""
        me, out = dist.get_rank(self.group), {}
        kept = getattr(self, "kept_routing", None) or [m.last for m in self._moes()]
        for moe, last in zip(self._moes(), kept):
            mine = torch.bincount(last.expert[last.keep] // moe.local, minlength=self.t)
            rows = [torch.zeros_like(mine) for _ in range(self.t)]
            dist.all_gather(rows, mine, group=self.group)
            for k, v in predict_ep_bytes([r.tolist() for r in rows], me, self.hidden, self.cfg.experts).items():
                if isinstance(v, dict):
                    out[k] = {key: out.get(k, {}).get(key, 0) + x for key, x in v.items()}
                else:
                    out[k] = v
        n = sum(p.numel() * p.element_size() for p in self.params if id(p) not in {id(q) for q in self.expert_params})
        out["ep_dp/all_reduce"] = {"calls": 1, "payload_bytes": n, "wire_bytes": 2 * (self.t - 1) / self.t * n}
        return out

    def _routing(self) -> list[dict[str, int]]:
        """The last forward's routing per layer: assignments kept (dispatched) and rows received."""
        return [{"kept": int(m.last.keep.sum()), "received": m.last_received} for m in self._moes()]

    def memory_extra(self) -> dict[str, Any]:
        return {"experts": self.cfg.experts, "k": self.cfg.top_k, "moe": self._routing()}

    def adjust_memory(self, memory: dict[str, Any]) -> None:
        """By kind (the base), and the MoE layers' activations beside balanced routing's formula."""
        super().adjust_memory(memory)
        b, c = self.probe_shape[0], self.cfg
        balanced = ep_routing_expected(b * SEQ, c.experts, c.top_k, c.capacity_factor)
        even = [{"kept": balanced["kept"], "received": balanced["received"]}] * self.layers
        pred = memory_per_rank("ep", b, SEQ, self.hidden, self.heads, self.layers, VOCAB, self.t,
                               c.experts, c.top_k, even)["activations_mib"]
        memory["ep_activations"] = {
            "tokens": b * SEQ, "capacity": balanced["capacity"], "per_layer_routing": self._routing(),
            "measured_mib": memory["activations_mib"],
            "predicted_from_routing_mib": memory["predicted"]["activations_mib"],
            "predicted_balanced_mib": pred, "measured_over_balanced": memory["activations_mib"] / pred,
            "balanced": balanced["formula"],
            "note": "dispatched = kept assignments of this rank's tokens; received = rows its experts computed; "
                    "the balanced formula assumes every expert gets T k / E (capped at C)"}

    def comm_report(self) -> dict[str, Any] | None:
        rep = super().comm_report() or {}
        load = []
        for moe in self._moes():  # per layer: tokens routed, kept, dropped per expert, over every rank
            counts = {k: torch.tensor(v) for k, v in moe.last.load(self.cfg.experts).items()}
            for v in counts.values():
                dist.all_reduce(v, group=self.group)
            load.append({**{k: v.tolist() for k, v in counts.items()},  # capacity: per rank's tokens
                         "capacity_per_rank": moe.last.capacity, "ranks": self.t})
        rep["expert_load"] = load
        return rep
