"""Tensor parallelism: Megatron-LM's column- then row-parallel layers, by hand and with torch's API.

Shoeybi et al. 2019 (arXiv:1909.08053), section 3. The MLP's first Linear is split by output
columns, the second by input rows, so each rank computes its slice of the hidden 4h without
talking; one all-reduce sums the second Linear's partial outputs. Attention is split by heads
(q, k, v column-parallel, the output projection row-parallel). Two conjugate operators do the
talking, as autograd Functions:

- f (`copy_to_tp`): identity forward, all-reduce of the gradient in backward (in front of a
  column-parallel Linear: every rank's slice contributes to the input's gradient);
- g (`reduce_from_tp`): all-reduce forward, identity backward (after a row-parallel Linear).

Per transformer layer and step: 2 all-reduces forward (g after attention and after the MLP) and
2 backward (f in front of both), each of b*s*h elements. `torch_tensor_parallel` does the same with
`parallelize_module`, `ColwiseParallel` and `RowwiseParallel` on a DeviceMesh (DTensor inserts
the collectives); its collectives are counted by torch's `CommDebugMode`.
"""
from __future__ import annotations

from typing import Any, Callable

import torch
import torch.distributed as dist
from torch import nn

import kit.experiments.parallel.wire as wire
from kit.experiments.measure.memory import ActivationMeter
from kit.experiments.models import Block
from kit.experiments.parallel.reference import check_result, max_abs_diff, small_gpt, token_batches, train, trained_diffs
from kit.experiments.theory.comm_bytes import over_steps, predict_tp_bytes
from kit.experiments.theory.parallel_memory import predict_tp_activation_bytes

__all__ = ["copy_to_tp", "reduce_from_tp", "ColumnParallelLinear", "RowParallelLinear", "TPBlock",
           "tensor_parallel", "torch_tensor_parallel", "gather_full_state",
           "layer_activation_bytes", "check_tp"]


class _CopyToTP(torch.autograd.Function):
    """Megatron's f: identity forward, all-reduce backward."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, group: Any) -> torch.Tensor:
        ctx.group = group
        return x.view_as(x)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, None]:
        return wire.all_reduce(grad.contiguous().clone(), ctx.group), None


class _ReduceFromTP(torch.autograd.Function):
    """Megatron's g: all-reduce forward, identity backward."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, group: Any) -> torch.Tensor:
        return wire.all_reduce(x.contiguous().clone(), group)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, None]:
        return grad, None


def copy_to_tp(x: torch.Tensor, group: Any = None) -> torch.Tensor:
    return _CopyToTP.apply(x, group)


def reduce_from_tp(x: torch.Tensor, group: Any = None) -> torch.Tensor:
    return _ReduceFromTP.apply(x, group)


def _rows(t: torch.Tensor, rank: int, n: int, groups: int) -> torch.Tensor:
    """This rank's 1/n of dim 0, taken from each of `groups` equal blocks (q, k, v: groups=3)."""
    blocks = t.reshape(groups, t.shape[0] // groups, *t.shape[1:])
    return blocks.chunk(n, dim=1)[rank].reshape(-1, *t.shape[1:]).clone()


class ColumnParallelLinear(nn.Module):
    """y_r = f(x) A_r^T + b_r: rank r holds rows r of the weight (its slice of the outputs)."""

    def __init__(self, full: nn.Linear, group: Any = None, groups: int = 1):
        super().__init__()
        self.group, self.groups = group, groups
        rank, n = dist.get_rank(group), dist.get_world_size(group)
        self.weight = nn.Parameter(_rows(full.weight.detach(), rank, n, groups))
        self.bias = nn.Parameter(_rows(full.bias.detach(), rank, n, groups))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return nn.functional.linear(copy_to_tp(x, self.group), self.weight, self.bias)


class RowParallelLinear(nn.Module):
    """y = g(x_r B_r^T) + b: rank r holds columns r of the weight; the bias is added once, after."""

    def __init__(self, full: nn.Linear, group: Any = None):
        super().__init__()
        self.group = group
        rank, n = dist.get_rank(group), dist.get_world_size(group)
        self.weight = nn.Parameter(full.weight.detach().chunk(n, dim=1)[rank].clone())
        self.bias = nn.Parameter(full.bias.detach().clone())

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return reduce_from_tp(nn.functional.linear(x, self.weight), self.group) + self.bias


class TPBlock(nn.Module):
    """The kit's transformer `Block` with `heads` local heads and the given linear layers.

    The names match the full Block (ln1, qkv, proj, ln2, mlp.0, mlp.2), so parameters map one to
    one. The forward is Block's own: tensor parallelism changes which layers compute, not what the
    block computes (f and g sit inside the parallel Linears)."""

    def __init__(self, block: Block, heads: int, qkv: nn.Module, proj: nn.Module, fc1: nn.Module,
                 fc2: nn.Module):
        super().__init__()
        self.ln1, self.ln2, self.heads = block.ln1, block.ln2, heads
        self.qkv, self.proj = qkv, proj
        self.mlp = nn.Sequential(fc1, nn.GELU(), fc2)

    forward = Block.forward  # layer norm, attention over this rank's heads, MLP: read it in models.py


def _check_divides(block: Block, n: int) -> None:
    h = block.qkv.in_features
    if block.heads % n or h % n:
        raise ValueError(f"tensor parallel size {n} must divide the heads ({block.heads}) and the hidden "
                         f"size ({h}); choose a tp size among {[d for d in range(1, block.heads + 1) if block.heads % d == 0]}")


def tensor_parallel(model: nn.Sequential, group: Any = None,
                    column: Callable[..., nn.Module] = ColumnParallelLinear,
                    row: Callable[..., nn.Module] = RowParallelLinear) -> nn.Sequential:
    """Every `Block` of `model` split over `group` by hand (Megatron); the rest stays replicated."""
    n = dist.get_world_size(group)
    out = []
    for m in model:
        if isinstance(m, Block):
            _check_divides(m, n)
            m = TPBlock(m, m.heads // n, column(m.qkv, group, groups=3), row(m.proj, group),
                        column(m.mlp[0], group), row(m.mlp[2], group))
        out.append(m)
    return nn.Sequential(*out)


def _rank_major_qkv(w: torch.Tensor, n: int, inverse: bool = False) -> torch.Tensor:
    """(3, heads, ...) rows <-> (n, 3, heads/n, ...): ColwiseParallel's contiguous chunk r is then
    rank r's q, k and v heads."""
    shape = w.shape
    if inverse:
        return w.reshape(n, 3, -1, *shape[1:]).transpose(0, 1).reshape(shape)
    return w.reshape(3, n, -1, *shape[1:]).transpose(0, 1).reshape(shape)


def torch_tensor_parallel(model: nn.Sequential, mesh: Any) -> nn.Sequential:
    """The same split with torch's `parallelize_module` (ColwiseParallel / RowwiseParallel) on `mesh`."""
    from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module
    n = mesh.size()
    plan = {"qkv": ColwiseParallel(), "proj": RowwiseParallel(), "mlp.0": ColwiseParallel(),
            "mlp.2": RowwiseParallel()}
    out = []
    for m in model:
        if isinstance(m, Block):
            _check_divides(m, n)
            qkv = nn.Linear(m.qkv.in_features, m.qkv.out_features)
            with torch.no_grad():
                qkv.weight.copy_(_rank_major_qkv(m.qkv.weight, n))
                qkv.bias.copy_(_rank_major_qkv(m.qkv.bias, n))
            m = parallelize_module(TPBlock(m, m.heads // n, qkv, m.proj, m.mlp[0], m.mlp[2]), mesh, plan)
        out.append(m)
    return nn.Sequential(*out)


def gather_full_state(model: nn.Module, group: Any = None) -> dict[str, torch.Tensor]:
    """Every parameter as the single-process model names and shapes it (collective: all ranks call)."""
    n = dist.get_world_size(group)
    full: dict[str, torch.Tensor] = {}
    for mod_name, mod in model.named_modules():
        for p_name, p in mod.named_parameters(recurse=False):
            name = f"{mod_name}.{p_name}" if mod_name else p_name
            t = p.detach()
            if hasattr(t, "full_tensor"):  # torch's DTensor
                t = t.full_tensor()
                if mod_name.endswith("qkv"):
                    t = _rank_major_qkv(t, n, inverse=True)
            elif isinstance(mod, ColumnParallelLinear) or (isinstance(mod, RowParallelLinear) and p_name == "weight"):
                parts = [torch.empty_like(t) for _ in range(n)]
                dist.all_gather(parts, t.contiguous(), group=group)
                if isinstance(mod, RowParallelLinear):
                    t = torch.cat(parts, dim=1)
                else:  # each rank's rows hold `groups` blocks (q, k, v): interleave them back
                    g = mod.groups
                    t = torch.cat([q.reshape(g, -1, *t.shape[1:]) for q in parts], dim=1).reshape(-1, *t.shape[1:])
            full[name] = t
    return full




def layer_activation_bytes(model: nn.Sequential, x: torch.Tensor, layer: int = 1) -> int:
    """Bytes autograd saves for backward inside block `layer` (the kit's ActivationMeter)."""
    meter = ActivationMeter(model.parameters())
    with torch.no_grad():
        h = model[:layer](x)
    h.requires_grad_()
    with meter.record():
        model[layer](h)
    return meter.bytes


def check_tp(steps: int = 3, batch: int = 4, hidden: int = 64, heads: int = 4, layers: int = 2,
             impl: str = "hand", group: Any = None, device: str = "cpu") -> dict[str, Any]:
    """Train a small GPT `steps` steps tensor-parallel over `group` (every rank calls this) and in
    one process; returns a CheckResult (parallel/reference.py): the weights' and losses' differences,
    bytes measured and predicted, and (by hand) the activations one block saves.
    `device`: where the models and batches live ("cuda" under NCCL: this rank's current GPU)."""
    t = dist.get_world_size(group)
    batches = token_batches(steps, batch, device=device)
    ref = small_gpt(hidden, heads, layers, device=device)
    start = {name: p.detach().clone() for name, p in ref.named_parameters()}
    ref_losses = train(ref, batches)
    full = small_gpt(hidden, heads, layers, device=device)
    own: dict[str, Any] = {"impl": impl, "tp": t}
    if impl == "torch":
        from torch.distributed.device_mesh import init_device_mesh
        model = torch_tensor_parallel(full, init_device_mesh(torch.device(device).type, (t,), mesh_dim_names=("tp",)))
        with wire.FunctionalCollectives("tp") as w:  # blocks' weights are DTensors, the rest plain tensors
            losses = train(model, batches, foreach=False)
        measured = w.report()
    else:
        model = tensor_parallel(full, group)
        with wire.WIRE.counting() as w:
            losses = train(model, batches)
        measured = w.report()  # training's collectives only: the activation count below runs a block again
        x = batches[0][0]
        own["activations"] = {"measured_bytes_per_layer": layer_activation_bytes(model, x),
                              "single_process_bytes_per_layer": layer_activation_bytes(ref, x),
                              "predicted": predict_tp_activation_bytes(batch, x.shape[1], hidden, heads, t),
                              "predicted_one_process": predict_tp_activation_bytes(batch, x.shape[1], hidden, heads, 1)}
    predicted = over_steps(predict_tp_bytes(batch, batches[0][0].shape[1], hidden, layers, t), steps)
    return check_result(trained_diffs(gather_full_state(model, group), ref, losses, ref_losses), measured, predicted,
                        weights_moved=max_abs_diff(start, ref), losses=losses, ref_losses=ref_losses, **own)
