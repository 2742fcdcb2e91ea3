"""Sequence parallelism on top of tensor parallelism (Korthikanti et al. 2022, arXiv:2205.05198).

Under tensor parallelism the LayerNorms, residual adds and dropouts run on the whole b*s*h
activation on every rank: replicated work and replicated memory. Sequence parallelism splits those
along the sequence: a block's input is rank r's s/t tokens. The all-reduce after a row-parallel
Linear becomes a reduce-scatter (sum, then keep my tokens); the identity in front of a
column-parallel Linear becomes an all-gather (every rank needs every token there). A ring
all-reduce is a reduce-scatter followed by an all-gather, so the forward and backward collectives
carry the same bytes as tensor parallelism's all-reduces. Like Megatron-LM, the column-parallel
Linear saves only its s/t input shard and gathers it again in backward (2 more all-gathers per
layer) so that nothing of size b*s*h is kept: activations per layer drop from (4 + 12/t) b*s*h
to 16/t b*s*h (the kit's fp32 block; the paper's fp16 count: 34/t).

The LayerNorm weights and the row-parallel biases are replicated but see only s/t tokens per rank:
their gradients are summed over the group after backward (one all-reduce of 6h per layer).
"""
from __future__ import annotations

from typing import Any

import torch
import torch.distributed as dist
from torch import nn

import kit.experiments.parallel.wire as wire
from kit.experiments.parallel.reference import check_result, max_abs_diff, small_gpt, token_batches, train, trained_diffs
from kit.experiments.parallel.tensor import (ColumnParallelLinear, RowParallelLinear, TPBlock, gather_full_state,
                                             layer_activation_bytes, tensor_parallel)
from kit.experiments.theory.comm_bytes import over_steps, predict_sp_bytes
from kit.experiments.theory.parallel_memory import predict_tp_activation_bytes

__all__ = ["AllGatherColumnLinear", "ReduceScatterRowLinear", "SequenceParallelGPT", "sequence_parallel",
           "sync_sequence_parallel_grads", "scatter_sequence", "check_sp"]

SEQ_DIM = 1  # activations are (batch, sequence, hidden)


class _AllGatherLinear(torch.autograd.Function):
    """all-gather the sequence, then x W^T + b; saves only this rank's shard of x."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, w: torch.Tensor, b: torch.Tensor, group: Any) -> torch.Tensor:
        ctx.save_for_backward(x, w)
        ctx.group = group
        return nn.functional.linear(wire.all_gather(x, SEQ_DIM, group), w, b)

    @staticmethod
    def backward(ctx: Any, g: torch.Tensor) -> tuple[Any, ...]:
        x, w = ctx.saved_tensors
        full = wire.all_gather(x, SEQ_DIM, ctx.group)  # gathered again: the price of saving s/t
        gx = wire.reduce_scatter(g @ w, SEQ_DIM, ctx.group)
        gw = g.reshape(-1, g.shape[-1]).t() @ full.reshape(-1, full.shape[-1])
        return gx, gw, g.sum(dim=(0, 1)), None


class _ReduceScatter(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, group: Any) -> torch.Tensor:
        ctx.group = group
        return wire.reduce_scatter(x, SEQ_DIM, group)

    @staticmethod
    def backward(ctx: Any, g: torch.Tensor) -> tuple[Any, ...]:
        return wire.all_gather(g, SEQ_DIM, ctx.group), None


def _my_chunk(x: torch.Tensor, group: Any) -> torch.Tensor:
    """This rank's s/t slice of the sequence (what _Scatter keeps forward and _Gather keeps backward)."""
    return x.chunk(dist.get_world_size(group), SEQ_DIM)[dist.get_rank(group)].contiguous()


class _Scatter(torch.autograd.Function):
    """Keep my s/t tokens; backward gathers the gradient (every rank's part of the input's)."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, group: Any) -> torch.Tensor:
        ctx.group = group
        return _my_chunk(x, group)

    @staticmethod
    def backward(ctx: Any, g: torch.Tensor) -> tuple[Any, ...]:
        return wire.all_gather(g, SEQ_DIM, ctx.group), None


def scatter_sequence(x: torch.Tensor, group: Any = None) -> torch.Tensor:
    """This rank's s/t tokens of `x` (batch, sequence, ...); in backward the gradient is gathered."""
    return _Scatter.apply(x, group)


class _Gather(torch.autograd.Function):
    """All tokens from every rank; backward keeps my part (the layers after are replicated)."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, group: Any) -> torch.Tensor:
        ctx.group = group
        return wire.all_gather(x, SEQ_DIM, group)

    @staticmethod
    def backward(ctx: Any, g: torch.Tensor) -> tuple[Any, ...]:
        return _my_chunk(g, ctx.group), None


class AllGatherColumnLinear(ColumnParallelLinear):
    """Column-parallel Linear whose input is this rank's tokens: all-gather, then the local slice."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return _AllGatherLinear.apply(x, self.weight, self.bias, self.group)


class ReduceScatterRowLinear(RowParallelLinear):
    """Row-parallel Linear whose partial outputs are summed and scattered: my tokens, complete."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return _ReduceScatter.apply(nn.functional.linear(x, self.weight), self.group) + self.bias


class SequenceParallelGPT(nn.Sequential):
    """Embed (replicated), then this rank's tokens through the blocks, then all tokens to the head.
    Same module names as the single-process model."""

    def __init__(self, *mods: nn.Module, group: Any = None):
        super().__init__(*mods)
        self.group = group

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = scatter_sequence(self[0](x), self.group)
        for block in list(self)[1:-1]:
            h = block(h)
        return self[-1](_Gather.apply(h, self.group))

    def partial_grad_params(self) -> list[nn.Parameter]:
        """Replicated parameters that see only this rank's tokens: LayerNorms, row-parallel biases."""
        out: list[nn.Parameter] = []
        for m in self:
            if isinstance(m, TPBlock):
                out += [*m.ln1.parameters(), *m.ln2.parameters(), m.proj.bias, m.mlp[2].bias]
        return out


def sequence_parallel(model: nn.Sequential, group: Any = None) -> SequenceParallelGPT:
    """Tensor parallel blocks with sequence-parallel LayerNorms (Megatron's SP)."""
    tp = tensor_parallel(model, group, column=AllGatherColumnLinear, row=ReduceScatterRowLinear)
    return SequenceParallelGPT(*tp, group=group)


def sync_sequence_parallel_grads(model: SequenceParallelGPT) -> None:
    """Sum the partial gradients of the sequence-parallel parameters over the group (one all-reduce)."""
    ps = [p for p in model.partial_grad_params() if p.grad is not None]
    flat = wire.all_reduce(torch.cat([p.grad.reshape(-1) for p in ps]), model.group, "sp_params")
    for p, g in zip(ps, flat.split([p.numel() for p in ps])):
        p.grad.copy_(g.view_as(p))




def check_sp(steps: int = 3, batch: int = 4, hidden: int = 64, heads: int = 4, layers: int = 2,
             group: Any = None, device: str = "cpu") -> dict[str, Any]:
    """As `check_tp`, sequence-parallel: differences from one process, bytes, activations per layer."""
    t = dist.get_world_size(group)
    batches = token_batches(steps, batch, device=device)
    seq = batches[0][0].shape[1]
    ref = small_gpt(hidden, heads, layers, device=device)
    start = {name: p.detach().clone() for name, p in ref.named_parameters()}
    ref_losses = train(ref, batches)
    model = sequence_parallel(small_gpt(hidden, heads, layers, device=device), group)
    with wire.WIRE.counting() as w:
        losses = train(model, batches, after_backward=lambda: sync_sequence_parallel_grads(model))
    measured = w.report()  # training's collectives only: the activation count below runs a block again
    pred = over_steps(predict_sp_bytes(batch, seq, hidden, layers, t), steps)
    x = batches[0][0]
    with torch.no_grad():  # a block's input is this rank's tokens
        h = scatter_sequence(model[0](x), group)
    activations = {"measured_bytes_per_layer": layer_activation_bytes(nn.Sequential(model[1]), h, 0),
                   "single_process_bytes_per_layer": layer_activation_bytes(ref, x),
                   "predicted": predict_tp_activation_bytes(batch, seq, hidden, heads, t, sp=True),
                   "predicted_tp_only": predict_tp_activation_bytes(batch, seq, hidden, heads, t)}
    return check_result(trained_diffs(gather_full_state(model, group), ref, losses, ref_losses), measured, pred,
                        weights_moved=max_abs_diff(start, ref), impl="sp", tp=t, losses=losses, ref_losses=ref_losses,
                        activations=activations)
