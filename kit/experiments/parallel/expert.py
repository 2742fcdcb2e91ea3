"""Expert parallelism: a small mixture-of-experts layer with its experts split over ranks.

A router sends each token to its top-k of E experts (Shazeer et al. 2017; GShard, Lepikhin et al.
2020, arXiv:2006.16668; Switch, Fedus et al. 2021, arXiv:2101.03961), weighting their outputs by
the renormalised router probabilities. Each of n ranks holds E/n experts and its own tokens;
`all_to_all` sends every token to the rank of each expert chosen for it (dispatch) and brings the
results back (combine). Backward runs the same two all-to-alls in reverse. An expert takes at most
C = ceil(capacity_factor x tokens x k / E) tokens of a rank's batch (first come, first choices
first, as GShard); the rest are dropped (they contribute 0; a residual connection carries them).

Bytes per rank and step, from the routing counts: rows each rank sends to other ranks in dispatch,
plus the rows it sends back in combine, twice (forward, backward), h elements each; with uniform
routing that is 4 T k (n-1)/n h elements. gloo's list `all_to_all` needs equal sizes, so the
uneven splits go through `all_to_all_single` (as torchtitan does).
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

import kit.experiments.parallel.wire as wire
from kit.experiments.parallel.reference import SGD_LR, check_result, max_abs_diff, trained_diffs
from kit.experiments.theory.comm_bytes import predict_dp_bytes, predict_ep_bytes

__all__ = ["Routing", "route", "MoE", "ExpertParallelMoE", "TokenMoE", "check_ep"]


@dataclass
class Routing:
    """One batch's routing: per (token, choice) assignment its expert, gate and whether it fits."""

    token: torch.Tensor  # (T*k,) token index, first choices first
    expert: torch.Tensor  # (T*k,)
    gate: torch.Tensor  # (T*k,) renormalised router probability (differentiable)
    keep: torch.Tensor  # (T*k,) bool: within its expert's capacity
    capacity: int | None

    def load(self, experts: int) -> dict[str, list[int]]:
        """Per-expert histogram: assignments routed, kept and dropped."""
        routed = torch.bincount(self.expert, minlength=experts)
        kept = torch.bincount(self.expert[self.keep], minlength=experts)
        return {"routed": routed.tolist(), "kept": kept.tolist(), "dropped": (routed - kept).tolist()}


def route(x: torch.Tensor, router: nn.Linear, k: int, capacity_factor: float | None) -> Routing:
    """Top-k routing with an optional per-expert capacity (None: no token is ever dropped)."""
    experts = router.out_features
    gate, expert = torch.softmax(router(x), dim=-1).topk(k, dim=-1)
    gate = gate / gate.sum(-1, keepdim=True)
    n = x.shape[0]
    token = torch.arange(n, device=x.device).repeat(k)
    expert, gate = expert.t().reshape(-1), gate.t().reshape(-1)  # choice-major order
    if capacity_factor is None:
        return Routing(token, expert, gate, torch.ones_like(expert, dtype=torch.bool), None)
    cap = math.ceil(capacity_factor * n * k / experts)
    onehot = nn.functional.one_hot(expert, experts)
    place = (onehot.cumsum(0) * onehot).sum(1) - 1  # how many earlier assignments this expert has
    return Routing(token, expert, gate, place < cap, cap)


def _expert(hidden: int, ffn: int) -> nn.Sequential:
    return nn.Sequential(nn.Linear(hidden, ffn), nn.GELU(), nn.Linear(ffn, hidden))


class MoE(nn.Module):
    """The single-process reference: router + E experts, every expert here."""

    def __init__(self, hidden: int = 32, experts: int = 4, k: int = 2, ffn: int = 64,
                 capacity_factor: float | None = None, seed: int = 0):
        super().__init__()
        torch.manual_seed(seed)
        self.router = nn.Linear(hidden, experts, bias=False)
        self.experts = nn.ModuleList(_expert(hidden, ffn) for _ in range(experts))
        self.k, self.capacity_factor = k, capacity_factor

    def forward(self, x: torch.Tensor, groups: int = 1) -> torch.Tensor:
        """`groups`: capacity is applied per group of tokens (one group per rank under EP)."""
        return torch.cat([self._group(g) for g in x.chunk(groups)])

    def _group(self, x: torch.Tensor) -> torch.Tensor:
        r = route(x, self.router, self.k, self.capacity_factor)
        out = torch.zeros_like(x)
        for e, expert in enumerate(self.experts):
            sel = r.keep & (r.expert == e)
            out = out.index_add(0, r.token[sel], expert(x[r.token[sel]]) * r.gate[sel, None])
        return out


class _AllToAll(torch.autograd.Function):
    """Rows to ranks by `send` counts; backward sends the gradients back by the same counts."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, send: list[int], recv: list[int], group: Any) -> torch.Tensor:
        ctx.send, ctx.recv, ctx.group = send, recv, group
        return wire.all_to_all(x, send, recv, group, "ep")

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[Any, ...]:
        return wire.all_to_all(grad, ctx.recv, ctx.send, ctx.group, "ep"), None, None, None


class ExpertParallelMoE(nn.Module):
    """The same layer with rank r holding experts [r E/n, (r+1) E/n) and its own tokens."""

    def __init__(self, full: MoE, group: Any = None):
        super().__init__()
        n, r = dist.get_world_size(group), dist.get_rank(group)
        e = len(full.experts)
        if e % n:
            raise ValueError(f"{e} experts do not split over {n} ranks; use a number of experts divisible by {n}")
        self.group, self.n, self.local = group, n, e // n
        self.router, self.k, self.capacity_factor = full.router, full.k, full.capacity_factor
        self.experts = nn.ModuleList(full.experts[r * self.local:(r + 1) * self.local])
        self.last: Routing | None = None
        self.last_received = 0  # rows the last forward brought to this rank's experts

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        r = self.last = route(x, self.router, self.k, self.capacity_factor)
        order = torch.nonzero(r.keep).squeeze(1)
        order = order[torch.argsort(r.expert[order], stable=True)]  # grouped by expert, so by rank
        per_expert = torch.bincount(r.expert[order], minlength=self.n * self.local)
        # how many rows each rank will send me, per local expert (a small all-to-all of counts)
        got = wire.all_to_all(per_expert.view(self.n, self.local), [1] * self.n, [1] * self.n, self.group, "ep_counts")
        send = per_expert.view(self.n, self.local).sum(1).tolist()
        recv = got.sum(1).tolist()
        self.last_received = int(sum(recv))
        rows = _AllToAll.apply(x[r.token[order]], send, recv, self.group)
        segments = rows.split(got.reshape(-1).tolist())  # (source rank, local expert) blocks
        done = [self.experts[i % self.local](seg) for i, seg in enumerate(segments)]
        back = _AllToAll.apply(torch.cat(done), recv, send, self.group)
        return torch.zeros_like(x).index_add(0, r.token[order], back * r.gate[order, None])




class TokenMoE(nn.Module):
    """An expert-parallel MoE in place of a block's MLP: (b, s, h) tokens in, the same shape out."""

    def __init__(self, moe: nn.Module):
        super().__init__()
        self.moe = moe

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.moe(x.reshape(-1, x.shape[-1])).view_as(x)


def check_ep(steps: int = 3, tokens: int = 16, hidden: int = 32, experts: int = 4, k: int = 2,
             capacity_factor: float | None = None, group: Any = None, device: str = "cpu") -> dict[str, Any]:
    """Train the MoE layer `steps` SGD steps expert-parallel (every rank calls this; rank r takes
    the r-th `tokens` of each batch) and in one process on the whole batch (capacity per rank's
    group, as under EP). Returns the loss and weight differences, the last step's bytes measured
    and predicted from its routing counts, and the per-expert load (routed, kept, dropped)."""
    n, me = dist.get_world_size(group), dist.get_rank(group)
    ref = MoE(hidden, experts, k, capacity_factor=capacity_factor).to(device)
    start = {name: p.detach().clone() for name, p in ref.named_parameters()}
    ep = ExpertParallelMoE(MoE(hidden, experts, k, capacity_factor=capacity_factor).to(device), group)
    g = torch.Generator().manual_seed(5)
    data = [(torch.randn(n * tokens, hidden, generator=g).to(device), torch.randn(n * tokens, hidden, generator=g).to(device))
            for _ in range(steps)]
    opt_ref, opt_ep = torch.optim.SGD(ref.parameters(), lr=SGD_LR), torch.optim.SGD(ep.parameters(), lr=SGD_LR)
    losses, ref_losses = [], []
    for i, (x, y) in enumerate(data):
        loss = nn.functional.mse_loss(ref(x, groups=n), y)
        loss.backward()
        opt_ref.step(), opt_ref.zero_grad()
        ref_losses.append(float(loss.detach()))
        if i == steps - 1:
            wire.WIRE.reset()  # count the last step: its prediction needs its routing
        xl, yl = x.chunk(n)[me].requires_grad_(), y.chunk(n)[me]  # as inside a model: x needs its gradient
        part = ((ep(xl) - yl) ** 2).sum() / y.numel()  # this rank's share of the global mean
        part.backward()
        wire.all_reduce(ep.router.weight.grad, group, "ep_dp")  # the router is replicated: sum its grads
        opt_ep.step(), opt_ep.zero_grad()
        total = part.detach().clone()
        dist.all_reduce(total, group=group)
        losses.append(float(total))
    assert ep.last is not None
    mine = torch.bincount(ep.last.expert[ep.last.keep] // ep.local, minlength=n)
    rows = [torch.zeros_like(mine) for _ in range(n)]
    dist.all_gather(rows, mine, group=group)
    pred = predict_ep_bytes([t.tolist() for t in rows], me, hidden, experts)
    pred.update(predict_dp_bytes(experts * hidden * 4, n, "ep_dp"))  # the router's gradients
    load = {key: torch.tensor(v, device=device) for key, v in ep.last.load(experts).items()}
    for v in load.values():
        dist.all_reduce(v, group=group)
    states = [None] * n
    dist.all_gather_object(states, {f"experts.{me * ep.local + i}.{name}": p.detach()
                                    for i, e in enumerate(ep.experts) for name, p in e.named_parameters()}, group=group)
    full = {"router.weight": ep.router.weight.detach()}
    for s in states:
        full.update(s)  # type: ignore[arg-type]
    return check_result(trained_diffs(full, ref, losses, ref_losses), wire.WIRE.report(), pred,
                        weights_moved=max_abs_diff(start, ref), ep=n, experts=experts, k=k,
                        capacity_factor=capacity_factor, capacity=ep.last.capacity, losses=losses,
                        ref_losses=ref_losses, load={key: v.tolist() for key, v in load.items()})
