"""Device meshes: two parallelisms at once on a grid of ranks (torch's `init_device_mesh`).

A mesh {"dp": 2, "tp": 2} puts 4 ranks on a 2 x 2 grid: ranks in a row form a tensor-parallel
group, ranks in a column a data-parallel group; each collective runs over one dimension's group
and is counted under that dimension's name. Four compositions, as torchtitan composes them
(Liang et al. 2024, arXiv:2410.06511):

- dp x tp: Megatron tensor parallelism inside each replica (by hand), gradients all-reduced across
  replicas (one flat all-reduce per step);
- fsdp x tp: the same tensor parallelism, then FSDP2's `fully_shard` on the fsdp dimension
  (each rank keeps 1/d of its tp shard; FSDP's all-gathers and reduce-scatters are counted under
  "fsdp" through FSDP2's custom-collective API);
- pp x dp: pipeline stages by hand on the pp dimension (pipeline.py: 1F1B, send/recv), then data
  parallel over dp on each stage (`apply_data_parallel`, as for tp: gradients all-reduced across
  replicas); the `pipeline` strategy composes the two in that order too (strategies/pipeline.py);
- dp x fsdp (HSDP): FSDP2's `fully_shard` on the 2-D mesh (`apply_hsdp`): sharded over fsdp,
  replicated over dp; FSDP2 itself all-reduces each gradient shard across the replicas, counted and
  timed around its call (wire_fsdp.ReplicaAllReduce).

Each is checked against one process on the global batch (`check_mesh`, below). For tp meshes and HSDP the
run loop composes these functions (strategies/mesh_strategies.py) and reports `check_mesh` when it starts;
pp x dp is the `Pipeline` strategy's own step, which checks itself (strategies/pipeline.py).
"""
from __future__ import annotations

import contextlib
import logging
import math
import warnings
from typing import Any, Callable, Iterator

import torch
import torch.distributed as dist
from torch import nn

import kit.experiments.parallel.wire as wire
import kit.experiments.parallel.wire_fsdp as wire_fsdp
from kit.experiments.choices import MESH_DIMS
from kit.experiments.measure.group_device import group_device
from kit.experiments.parallel.pipeline import pipeline_stage, pipeline_step, stages_full_state
from kit.experiments.parallel.reference import (SGD_LR, check_result, max_abs_diff, small_gpt, token_batches, train,
                                               trained_diffs)
from kit.experiments.parallel.tensor import gather_full_state, tensor_parallel
from kit.experiments.theory.comm_bytes import (over_steps, predict_dp_bytes, predict_fsdp_bytes, predict_hsdp_bytes,
                                               predict_pp_bytes, predict_tp_bytes)

__all__ = ["make_mesh", "pss_mib", "average_gradients", "apply_tp", "apply_fsdp", "apply_data_parallel", "parallelize",
           "fsdp_full_state", "quiet_fsdp_tp", "dp_tp", "against_one_process", "apply_hsdp", "hsdp", "pp_dp",
           "check_mesh"]


@contextlib.contextmanager
def quiet_fsdp_tp() -> Iterator[None]:
    """Silence two torch notices that FSDP with tensor parallelism may trigger inside the kit's own
    check (never in a user's cell): FSDP2's "returned a view tensor" (our loop does no in-place op
    on the outputs) and DTensor's "2 sequential all_gather operations" on 2-D weights.
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


def average_gradients(params: list[torch.Tensor], group: Any, dim: str = "dp") -> None:
    """Average gradients over the data-parallel group: one flat all-reduce (one bucket)."""
    ps = [p for p in params if p.grad is not None]
    flat = wire.all_reduce(torch.cat([p.grad.reshape(-1) for p in ps]), group, dim)
    flat /= dist.get_world_size(group)
    for p, g in zip(ps, flat.split([p.numel() for p in ps])):
        p.grad.copy_(g.view_as(p))


def _mean_over(value: float, group: Any) -> float:
    t = torch.tensor([value], device=group_device(group))
    dist.all_reduce(t, group=group)
    return float(t) / dist.get_world_size(group)


def apply_fsdp(model: nn.Sequential, mesh: Any, dim: str = "fsdp") -> dict[str, Any]:
    """FSDP2's `fully_shard` on every block with parameters, then the root, over the 1-D `mesh`;
    its collectives counted and timed under `dim` (wire_fsdp.CustomCollectives). Returns the bytes per
    step FSDP2 moves (ZeRO-3: each block gathered in forward and again in backward, its gradients
    reduce-scattered; FSDP2 pads dim 0 of every parameter to a multiple of d)."""
    d = mesh.size()
    padded = _shard_blocks(model, mesh, d, wire_fsdp.CustomCollectives(dim, d), lambda m: None)
    return predict_fsdp_bytes(padded, d, dim)


def _shard_blocks(model: nn.Sequential, mesh: Any, shards: int, comms: Any,
                  each: Callable[[nn.Module], None]) -> list[int]:
    """`fully_shard` every block with parameters (its collectives counted by `comms`, then `each(block)`),
    then the root. Returns each block's bytes as FSDP2 pads them (dim 0 to a multiple of `shards`)."""
    from torch.distributed.fsdp import fully_shard
    padded = []
    for m in model:
        ps = list(m.parameters())
        if not ps:
            continue
        padded.append(sum(-(-p.shape[0] // shards) * shards * (p.numel() // p.shape[0]) * p.element_size()
                          for p in ps))
        fully_shard(m, mesh=mesh)
        if not wire_fsdp.install_fsdp_comms(m, comms):
            raise RuntimeError("this torch has no FSDP2 custom all-gather API; the kit cannot count FSDP's bytes")
        each(m)
    fully_shard(model, mesh=mesh)
    return padded


def apply_hsdp(model: nn.Sequential, mesh: Any) -> dict[str, Any]:
    """HSDP: FSDP2's `fully_shard` on the 2-D mesh {"dp": r, "fsdp": s} (replicate over dp, shard over
    fsdp), every block with parameters, then the root. FSDP's all-gathers and reduce-scatters run on
    fsdp, counted and timed (wire_fsdp.CustomCollectives); each block's gradient shard is then all-reduced
    across the replicas on dp by FSDP2 itself, counted and timed from the end of the reduce-scatter to
    FSDP2's all-reduce hook (wire_fsdp.ReplicaAllReduce). Returns the bytes per step predicted
    (theory/comm_bytes.predict_hsdp_bytes)."""
    r, s = mesh["dp"].size(), mesh["fsdp"].size()
    replicas = wire_fsdp.ReplicaAllReduce("dp", r)
    padded = _shard_blocks(model, mesh, s, wire_fsdp.CustomCollectives("fsdp", s, reduced=replicas.reduced),
                           replicas.install)
    return predict_hsdp_bytes(padded, s, r)


def apply_tp(model: nn.Sequential, mesh: Any) -> nn.Sequential:
    """Tensor parallelism by hand over the mesh's "tp" dimension (Megatron's layers, tensor.py)."""
    return tensor_parallel(model, mesh["tp"].get_group())


def apply_data_parallel(model: nn.Module, mesh: Any, dim: str) -> tuple[Callable[[], None] | None, dict[str, Any]]:
    """Data parallelism over the mesh dimension `dim`, applied after the model is split: "fsdp" shards
    every block over it (FSDP2, `apply_fsdp`: its collectives run inside forward and backward);
    "dp" keeps a whole replica per rank and returns the step to call after backward (the gradients
    averaged by one flat all-reduce). Returns (that step or None, the bytes per step predicted)."""
    if dim == "fsdp":
        return None, apply_fsdp(model, mesh[dim], dim)  # type: ignore[arg-type]
    params = [p for p in model.parameters() if p.requires_grad]
    group = mesh[dim].get_group()
    grad_bytes = sum(p.numel() * p.element_size() for p in params)
    return (lambda: average_gradients(params, group, dim)), predict_dp_bytes(grad_bytes, mesh[dim].size(), dim)


def parallelize(model: nn.Sequential, mesh: Any) -> tuple[nn.Module, Callable[[], None] | None, dict[str, Any]]:
    """A model on a {"dp" | "fsdp": d, "tp": t} mesh, composed as torchtitan composes it: the layers
    split first (`apply_tp`), then data parallelism over the other dimension (`apply_data_parallel`).
    Returns the model, the step to call after each backward (or None) and the data dimension's
    bytes per step predicted. The run loop's strategy (mesh_strategies.py) and `check_mesh` call this."""
    data = next(k for k in mesh.mesh_dim_names if k != "tp")
    model = apply_tp(model, mesh)
    after_backward, predicted = apply_data_parallel(model, mesh, data)
    return model, after_backward, predicted


def fsdp_full_state(model: nn.Module, tp_group: Any = None) -> dict[str, torch.Tensor]:
    """Every parameter as one process names it: FSDP's shards gathered (unshard), then the tp ones (if any)."""
    from torch.distributed.fsdp import FSDPModule
    held = [m for m in model.modules() if isinstance(m, FSDPModule)]
    for m in held:
        m.unshard()
    try:  # copies: reshard frees the unsharded storage the replicated parameters' views point into
        whole = gather_full_state(model, tp_group) if tp_group is not None else dict(model.named_parameters())
        return {k: v.detach().clone() for k, v in whole.items()}
    finally:
        for m in held:
            m.reshard()


def dp_tp(mesh: Any, batches: list, dims: tuple[int, int, int], data: str) -> tuple[list[float], dict, dict]:
    hidden, heads, layers = dims
    dp, tp = mesh[data], mesh["tp"]
    d, me = dp.size(), dp.get_local_rank()
    local = [(x.chunk(d)[me], y.chunk(d)[me]) for x, y in batches]
    b, s = local[0][0].shape
    with wire.WIRE.counting() as w:
        model, after_backward, data_bytes = parallelize(small_gpt(hidden, heads, layers), mesh)
        with quiet_fsdp_tp():
            losses = train(model, local, after_backward=after_backward)
        measured = w.report()  # before the gather below, whose collectives are not training's
    pred = over_steps({**predict_tp_bytes(b, s, hidden, layers, tp.size()), **data_bytes}, len(batches))
    full = fsdp_full_state(model, tp.get_group()) if data == "fsdp" else gather_full_state(model, tp.get_group())
    return [_mean_over(v, dp.get_group()) for v in losses], full, {"measured": measured, "predicted": pred}


Trainer = Callable[[list], tuple[list[float], dict[str, torch.Tensor], dict[str, Any]]]


def against_one_process(shape: dict[str, int], steps: int, batch: int, dims: tuple[int, int, int],
                        on_mesh: Trainer) -> dict[str, Any]:
    """A small GPT trained on the global batches in one process, then by `on_mesh(batches)` (losses, every
    parameter by the full model's names, bytes measured and predicted); their differences as a CheckResult."""
    batches = token_batches(steps, batch)
    ref = small_gpt(*dims)
    start = {name: p.detach().clone() for name, p in ref.named_parameters()}
    ref_losses = train(ref, batches)
    losses, full, comm = on_mesh(batches)
    return check_result(trained_diffs(full, ref, losses, ref_losses), comm["measured"], comm["predicted"],
                        weights_moved=max_abs_diff(start, ref), mesh=shape, rank=dist.get_rank(), losses=losses,
                        ref_losses=ref_losses, pss_mib=pss_mib())


def hsdp(mesh: Any, batches: list, dims: tuple[int, int, int]) -> tuple[list[float], dict, dict]:
    """Train a small GPT with HSDP on a {"dp": r, "fsdp": s} mesh: every rank holds a data shard (1/(r*s)
    of each batch); returns the losses (mean over ranks), every parameter whole, the bytes of all steps."""
    r, s = mesh["dp"].size(), mesh["fsdp"].size()
    me = mesh["dp"].get_local_rank() * s + mesh["fsdp"].get_local_rank()  # this rank's data shard
    local = [(x.chunk(r * s)[me], y.chunk(r * s)[me]) for x, y in batches]
    with wire.WIRE.counting() as w:
        model = small_gpt(*dims)
        predicted = apply_hsdp(model, mesh)
        with quiet_fsdp_tp():
            losses = train(model, local)
        measured = w.report()
    return [_mean_over(v, None) for v in losses], fsdp_full_state(model), {
        "measured": measured, "predicted": over_steps(predicted, len(batches))}


def pp_dp(mesh: Any, batches: list, dims: tuple[int, int, int], micro_batches: int) -> tuple[list[float], dict, dict]:
    """Train a small GPT on a {"pp": p, "dp": d} mesh: its stages on pp (pipeline.py, 1F1B over `micro_batches`),
    then data parallel over dp on each stage (`apply_data_parallel`); each replica trains on 1/d of each batch.
    Returns the losses (the global batch's), every parameter by the full model's names, the bytes of all steps."""
    hidden = dims[0]
    pp, dp = mesh["pp"], mesh["dp"]
    d, me = dp.size(), dp.get_local_rank()
    local = [(x.chunk(d)[me], y.chunk(d)[me]) for x, y in batches]
    b, s = local[0][0].shape
    with wire.WIRE.counting() as w:
        stage, blocks = pipeline_stage(small_gpt(*dims), pp.get_group())
        after_backward, data_bytes = apply_data_parallel(stage, mesh, "dp")
        opt = torch.optim.SGD(stage.parameters(), lr=SGD_LR)  # SGD, as the reference (reference.py says why)
        losses = []
        for x, y in local:
            loss = pipeline_step(stage, x, y, micro_batches, (b // micro_batches, s, hidden), pp.get_group())
            after_backward()  # this stage's gradients averaged over its d replicas
            opt.step()
            opt.zero_grad(set_to_none=True)
            losses.append(loss)
        measured = w.report()
    r, p = pp.get_local_rank(), pp.size()
    sends = int(r != p - 1) + int(r != 0)  # activations on to the next stage, their gradients back
    predicted = {**data_bytes, **predict_pp_bytes(b * s * hidden * 4, micro_batches, sends)}  # fp32 activations
    # the last stages hold the loss of their replica's share: their mean is the global batch's
    global_losses = [_mean_over(v if r == p - 1 else 0.0, None) * p for v in losses]
    return global_losses, stages_full_state(stage, blocks, pp.get_group()), {
        "measured": measured, "predicted": over_steps(predicted, len(batches))}


def check_mesh(mesh: dict[str, int] | None = None, steps: int = 3, batch: int = 8, hidden: int = 64, heads: int = 4,
               layers: int = 2, micro_batches: int = 2) -> dict[str, Any]:
    """Train a small GPT on a mesh ({"dp": 2, "tp": 2}, {"fsdp": 2, "tp": 2}, {"pp": 2, "dp": 2} or HSDP's
    {"dp": 2, "fsdp": 2}) and in one process; every rank calls this. Returns the differences, bytes per
    dimension and collective kind (measured, predicted) and this rank's PSS (a CheckResult).
    `micro_batches`: the pipeline's, on a pp mesh."""
    shape = mesh or {"dp": 2, "tp": 2}
    _check_shape(shape)
    dims = (hidden, heads, layers)
    if "pp" in shape:
        if batch % (shape["dp"] * micro_batches):
            raise ValueError(f"batch={batch} does not split into dp={shape['dp']} replicas of {micro_batches} "
                             f"micro-batches; use a multiple of {shape['dp'] * micro_batches}")
        trainer: Trainer = lambda batches: pp_dp(make_mesh(shape), batches, dims, micro_batches)
    elif "tp" not in shape:  # HSDP: FSDP2 replicating over dp, sharding over fsdp
        trainer = lambda batches: hsdp(make_mesh(shape), batches, dims)
    else:
        trainer = lambda batches: dp_tp(make_mesh(shape), batches, dims, next(k for k in shape if k != "tp"))
    return against_one_process(shape, steps, batch, dims, trainer)


def _check_shape(shape: Any) -> None:
    """The meshes the run loop composes, named outermost first (its config refuses the rest the same way)."""
    known = [d for shapes in MESH_DIMS.values() for d in shapes]
    ok = isinstance(shape, dict) and tuple(shape) in known \
        and all(isinstance(v, int) and not isinstance(v, bool) and v >= 1 for v in shape.values())
    if not ok:
        raise ValueError(f"check_mesh takes a dict of sizes named outermost first, one of "
                         f"{', '.join(' x '.join(d) for d in known)}, e.g. check_mesh({{'dp': 2, 'tp': 2}}); got {shape!r}")
