"""Device meshes: two parallelisms at once on a grid of ranks (torch's `init_device_mesh`).

A mesh {"dp": 2, "tp": 2} puts 4 ranks on a 2 x 2 grid: ranks in a row form a tensor-parallel
group, ranks in a column a data-parallel group; each collective runs over one dimension's group
and is counted under that dimension's name. Three compositions, as torchtitan composes them
(Liang et al. 2024, arXiv:2410.06511):

- dp x tp: Megatron tensor parallelism inside each replica (by hand), gradients all-reduced across
  replicas (one flat all-reduce per step);
- fsdp x tp: torch's `parallelize_module` on the tp dimension, then FSDP2's `fully_shard` on the
  dp dimension (2-D DTensor parameters);
- pp x dp: two pipeline stages (GPipe order, `isend`/`irecv`), each stage replicated and its
  gradients all-reduced across replicas.

Each is checked against one process on the global batch, as the one-dimensional strategies are.
"""
from __future__ import annotations

import contextlib
import logging
import math
import warnings
from typing import Any, Iterator

import torch
import torch.distributed as dist
from torch import nn

import kit.experiments.strategies.wire as wire
from kit.experiments.strategies.reference import LR, lm_loss, max_abs_diff, small_gpt, token_batches, train
from kit.experiments.strategies.tensor_parallel import (gather_full_state, predict_tp_bytes, tensor_parallel,
                                                       torch_tensor_parallel)

__all__ = ["make_mesh", "check_mesh", "pss_mib"]


@contextlib.contextmanager
def _quiet_2d() -> Iterator[None]:
    """Silence two torch notices that fsdp x tp triggers inside the kit's own check (never in a
    user's cell): FSDP2's "returned a view tensor" (our loop does no in-place op on the outputs)
    and DTensor's "2 sequential all_gather operations" when the check gathers the 2-D weights.
    Both are per-rank and repeat on every rank, which buries the lesson's result."""
    log = logging.getLogger("torch.distributed.tensor._redistribute")
    level = log.level
    log.setLevel(logging.ERROR)
    try:
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", message=r".*returned a view tensor", category=UserWarning)
            yield
    finally:
        log.setLevel(level)


def make_mesh(shape: dict[str, int], device_type: str = "cpu") -> Any:
    """`init_device_mesh` with named dimensions; the product must be the world size."""
    from torch.distributed.device_mesh import init_device_mesh
    world = dist.get_world_size()
    if math.prod(shape.values()) != world:
        raise ValueError(f"mesh {shape} has {math.prod(shape.values())} ranks but the world has {world}; "
                         f"make the sizes multiply to {world}")
    return init_device_mesh(device_type, tuple(shape.values()), mesh_dim_names=tuple(shape))


def pss_mib() -> float | None:
    """This process's proportional set size (shared pages split between their users), MiB."""
    try:
        with open("/proc/self/smaps_rollup") as f:
            for line in f:
                if line.startswith("Pss:"):
                    return int(line.split()[1]) / 1024
    except OSError:
        pass
    return None


def _dp_sync(params: list[torch.Tensor], group: Any, dim: str = "dp") -> None:
    """Average gradients over the data-parallel group: one flat all-reduce (one bucket)."""
    ps = [p for p in params if p.grad is not None]
    flat = wire.all_reduce(torch.cat([p.grad.reshape(-1) for p in ps]), group, dim)
    flat /= dist.get_world_size(group)
    for p, g in zip(ps, flat.split([p.numel() for p in ps])):
        p.grad.copy_(g.view_as(p))


def _mean_over(value: float, group: Any) -> float:
    t = torch.tensor([value])
    dist.all_reduce(t, group=group)
    return float(t) / dist.get_world_size(group)


def _dp_tp(mesh: Any, batches: list, dims: tuple[int, int, int], fsdp: bool) -> tuple[list[float], dict, dict]:
    hidden, heads, layers = dims
    dp, tp = mesh["dp"], mesh["tp"]
    d, me = dp.size(), dp.get_local_rank()
    local = [(x.chunk(d)[me], y.chunk(d)[me]) for x, y in batches]
    pred: dict[str, Any] = {}
    b, s = local[0][0].shape
    for k, v in predict_tp_bytes(b, s, hidden, layers, tp.size()).items():
        pred[k] = {key: x * len(batches) for key, x in v.items()} if isinstance(v, dict) else v
    if fsdp:
        from torch.distributed.fsdp import fully_shard
        model = torch_tensor_parallel(small_gpt(hidden, heads, layers), tp)
        for m in model:
            fully_shard(m, mesh=dp)
        fully_shard(model, mesh=dp)
        with _quiet_2d(), wire.FunctionalCollectives("tp") as w:
            losses = train(model, local)
        pred["note"] = "FSDP's all-gathers and reduce-scatters on dp are not counted here (see strategy 'fsdp')"
    else:
        model = tensor_parallel(small_gpt(hidden, heads, layers), tp.get_group())
        params = list(model.parameters())
        with wire.WIRE.counting() as w:
            losses = train(model, local, after_backward=lambda: _dp_sync(params, dp.get_group()))
        n = sum(p.numel() for p in params) * 4
        pred["dp/all_reduce"] = {"calls": len(batches), "payload_bytes": len(batches) * n,
                                 "wire_bytes": len(batches) * 2 * (d - 1) / d * n}
    with _quiet_2d():
        full = gather_full_state(model, tp.get_group())
    return [_mean_over(v, dp.get_group()) for v in losses], full, {"measured": w.report(), "predicted": pred}


def _pp_dp(mesh: Any, batches: list, dims: tuple[int, int, int], micro: int) -> tuple[list[float], dict, dict]:
    """Two stages (embedding + first half of the blocks | the rest + head), GPipe order."""
    hidden, heads, layers = dims
    pp, dp = mesh["pp"], mesh["dp"]
    stage, d, me = pp.get_local_rank(), dp.size(), dp.get_local_rank()
    full = small_gpt(hidden, heads, layers)
    cut = 1 + layers // 2
    mods = list(full)[:cut] if stage == 0 else list(full)[cut:]
    offset = 0 if stage == 0 else cut
    part = nn.Sequential(*mods)
    peer = dist.get_global_rank(pp.get_group(), 1 - stage)
    opt = torch.optim.SGD(part.parameters(), lr=LR)
    losses = []
    with wire.WIRE.counting() as w:
        for x, y in batches:
            x, y = x.chunk(d)[me], y.chunk(d)[me]
            held, loss = [], 0.0
            for xm, ym in zip(x.chunk(micro), y.chunk(micro)):  # forward of every micro-batch
                if stage == 0:
                    h = part(xm)
                    wire.isend(h.detach(), peer, pp.get_group(), "pp").wait()
                    held.append(h)
                else:
                    h = torch.empty(xm.shape[0], xm.shape[1], hidden)
                    wire.irecv(h, peer, pp.get_group(), "pp").wait()
                    h.requires_grad_()
                    out = lm_loss(part(h), ym) / micro
                    loss += float(out.detach())
                    held.append((h, out))
            for item in held:  # then every backward (GPipe)
                if stage == 0:
                    g = torch.empty_like(item)
                    wire.irecv(g, peer, pp.get_group(), "pp").wait()
                    item.backward(g)
                else:
                    item[1].backward()
                    wire.isend(item[0].grad, peer, pp.get_group(), "pp").wait()
            _dp_sync(list(part.parameters()), dp.get_group())
            opt.step(), opt.zero_grad()
            t = torch.tensor([loss])
            dist.broadcast(t, dist.get_global_rank(pp.get_group(), 1), group=pp.get_group())
            losses.append(_mean_over(float(t), dp.get_group()))
    mine = {f"{int(n.split('.', 1)[0]) + offset}.{n.split('.', 1)[1]}": p.detach() for n, p in part.named_parameters()}
    states: list[Any] = [None, None]
    dist.all_gather_object(states, mine, group=pp.get_group())
    b = batches[0][0].shape[0] // d
    act = b * batches[0][0].shape[1] * hidden * 4
    n = sum(p.numel() for p in part.parameters()) * 4
    steps = len(batches)
    pred = {"pp/send": {"calls": steps * micro, "payload_bytes": steps * act, "wire_bytes": steps * act},
            "dp/all_reduce": {"calls": steps, "payload_bytes": steps * n, "wire_bytes": steps * 2 * (d - 1) / d * n},
            "formula": "pp: each stage sends b/d*s*h per step (activations forward or gradients back); "
                       "dp: its stage's gradients"}
    return losses, {**states[0], **states[1]}, {"measured": w.report(), "predicted": pred}


def check_mesh(mesh: dict[str, int] | None = None, steps: int = 3, batch: int = 8, hidden: int = 64, heads: int = 4,
               layers: int = 2, micro_batches: int = 2) -> dict[str, Any]:
    """Train a small GPT on a mesh ({"dp": 2, "tp": 2}, {"fsdp": 2, "tp": 2} or {"pp": 2, "dp": 2})
    and in one process; every rank calls this. Returns the differences, bytes per dimension and
    collective kind (measured, predicted) and this rank's PSS."""
    shape = mesh or {"dp": 2, "tp": 2}
    names = tuple(shape)
    torch_names = {"fsdp": "dp"}  # the fsdp dimension is a data-parallel dimension to the mesh
    m = make_mesh({torch_names.get(k, k): v for k, v in shape.items()})
    batches = token_batches(steps, batch)
    ref = small_gpt(hidden, heads, layers)
    start = {name: p.detach().clone() for name, p in ref.named_parameters()}
    ref_losses = train(ref, batches)
    dims = (hidden, heads, layers)
    if "pp" in names:
        losses, full, comm = _pp_dp(m, batches, dims, micro_batches)
    else:
        losses, full, comm = _dp_tp(m, batches, dims, fsdp="fsdp" in names)
    return {"mesh": shape, "rank": dist.get_rank(), "losses": losses, "ref_losses": ref_losses,
            "loss_max_abs_diff": max(abs(a - b) for a, b in zip(losses, ref_losses)),
            "weights_max_abs_diff": max_abs_diff(full, ref), "weights_moved": max_abs_diff(start, ref),
            "bytes": comm, "pss_mib": pss_mib()}
