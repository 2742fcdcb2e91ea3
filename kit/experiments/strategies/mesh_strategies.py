"""Meshes through the run loop: `ExperimentConfig(mesh=...)` on the strategy that splits the model.

A mesh adds a data-parallel dimension to a model-splitting strategy (torch's `init_device_mesh`,
dimensions named outermost first, as torchtitan orders them):

- `strategy="tp", mesh={"dp": d, "tp": t}`: Megatron tensor parallelism by hand on tp, the
  replica's gradients averaged over dp by one flat all-reduce;
- `strategy="tp", mesh={"fsdp": d, "tp": t}`: the same tp, then FSDP2's `fully_shard` on fsdp
  (each rank keeps 1/d of its tp shard; all-gathers and reduce-scatters on fsdp);
- `strategy="pipeline", mesh={"pp": p, "dp": d}`: the pipeline strategy's stages and schedule on
  pp (send/recv), then data parallel over dp on each stage; the `Pipeline` strategy composes the two
  itself (strategies/pipeline.py), and `check_mesh` below checks it.

Every collective is counted and timed per "<dimension>/<kind>" (wire.py) beside its formula, shown
as a "<dimension> <kind>" comm phase in the timeline, and the composition is checked against one
process on a small GPT when the strategy starts (`check_mesh`, below, runs the same code). Memory
per rank sits beside its formula, with the rank's PSS.
"""
from __future__ import annotations

from typing import Any, Callable

import torch
import torch.distributed as dist
from torch import nn

from kit.experiments.choices import HSDP_DIMS, MESH_DIMS
from kit.experiments.measure.memory import MIB, ShardAwareMeter, sharded_memory
from kit.experiments.parallel.mesh import (against_one_process, dp_tp, hsdp, make_mesh, parallelize, pss_mib,
                                          quiet_fsdp_tp)
from kit.experiments.strategies.parallel_gpt import TensorParallel
from kit.experiments.strategies.pipeline import check_pipeline_mesh
from kit.experiments.theory.parallel_memory import F32

__all__ = ["MeshTensorParallel", "check_mesh"]


def _mesh_memory(memory: dict[str, Any], formula: str) -> None:
    """What P is on this mesh, and this rank's PSS (the memory by kind is beside its formula in `by_kind`)."""
    memory["mesh"] = {"formula": formula, "pss_mib": pss_mib()}


class MeshTensorParallel(TensorParallel):
    """strategy="tp" on a mesh {"dp" | "fsdp": d, "tp": t}: the model built once by `parallelize`
    (parallel/mesh.py: tensor parallel on tp, then data parallel on the other dimension), and the
    optimizer made for what that left on this rank."""

    def groups(self) -> tuple[Any, Any]:
        self.mesh = make_mesh(self.cfg.mesh, self.device.type)
        self.data_dim = next(k for k in self.cfg.mesh if k != "tp")
        return self.mesh["tp"].get_group(), self.mesh[self.data_dim].get_group()

    def build(self, model: nn.Sequential) -> nn.Module:
        built, self.after_backward, self.data_bytes = parallelize(model, self.mesh)
        return built

    def activation_meter(self) -> Any:
        # FSDP gathers a block's parameters in forward and autograd saves them: not activations
        return ShardAwareMeter(self.model) if self.data_dim == "fsdp" else super().activation_meter()

    def local(self, x: torch.Tensor, y: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        d, me = dist.get_world_size(self.dp_group), dist.get_rank(self.dp_group)
        return x.chunk(d)[me], y.chunk(d)[me]  # this replica's share of the global batch

    def mean_over_ranks(self) -> bool:
        return True

    def describe(self) -> str:
        d = self.cfg.mesh[self.data_dim]
        data = (f"FSDP2 fully_shard over fsdp={d} (each rank keeps 1/{d} of its tp shard)" if self.data_dim == "fsdp"
                else f"gradients averaged over dp={d} replicas (one flat all-reduce)")
        return f"mesh {self.cfg.mesh}: {super().describe()}; {data}"

    def one_process_check(self) -> dict[str, Any]:
        heads = max(4, self.t)
        return check_mesh(self.cfg.mesh, steps=3, hidden=16 * heads, heads=heads)

    def train_step(self, x: torch.Tensor, y: torch.Tensor, probe: Callable[[], None] | None = None) -> float:
        with quiet_fsdp_tp():  # FSDP2's "returned a view tensor" per module and rank: the loop does no in-place op
            return super().train_step(x, y, probe)

    def sync_grads(self) -> None:
        if self.after_backward is not None:  # fsdp: FSDP reduce-scattered them inside backward
            self.after_backward()

    def predict(self, batch: int) -> dict[str, Any]:
        return {**super().predict(batch // self.mesh[self.data_dim].size()), **self.data_bytes}

    def layer_activations(self, x: torch.Tensor) -> dict[str, Any]:
        # one block run alone would gather FSDP's shards outside a training step; tp's count holds
        return {} if self.data_dim == "fsdp" else super().layer_activations(x)

    def memory_prediction(self) -> dict[str, Any]:
        pred = super().memory_prediction()  # tp on this rank's batch (theory/parallel_memory.py)
        if self.data_dim == "fsdp":  # FSDP shards every parameter, its gradient and Adam state over fsdp
            d, n = self.mesh["fsdp"].size(), pred["n_params"]
            pred["params_mib"] = pred["grads_mib"] = F32 * n / d / MIB
            pred["optimizer_mib"] = (2 * F32 * n / d + F32 * pred["n_tensors"]) / MIB
            pred["formula"] = {**pred["formula"], "params": pred["formula"]["params"] + " / d (fsdp)",
                               "grads": "4 bytes x P / d",
                               "optimizer": "Adam: 8 bytes x P / d + 4 bytes x tensors (step)"}
        return pred

    def adjust_memory(self, memory: dict[str, Any]) -> None:
        fsdp = self.data_dim == "fsdp"
        if fsdp:  # a DTensor's numel is the whole tensor's: count the local shards
            sharded_memory(memory, self.params, self.opt)
        super().adjust_memory(memory)  # by kind beside memory_prediction()
        _mesh_memory(memory, f"P = P_split/t + P_rep{' over d = ' + str(self.mesh['fsdp'].size()) if fsdp else ''}: "
                     "P_split (qkv, proj, MLP weights, column biases) split over tp, P_rep (embeddings, LayerNorms, "
                     "row biases, head) whole on every tp rank" + ("; FSDP shards all of it over fsdp" if fsdp else
                                                                   "; every dp replica holds its tp shard whole"))


def check_mesh(mesh: dict[str, int] | None = None, steps: int = 3, batch: int = 8, hidden: int = 64, heads: int = 4,
               layers: int = 2, micro_batches: int = 2) -> dict[str, Any]:
    """Train a small GPT on a mesh ({"dp": 2, "tp": 2}, {"fsdp": 2, "tp": 2}, {"pp": 2, "dp": 2} or HSDP's
    {"dp": 2, "fsdp": 2}) and in one process; every rank calls this. Returns the differences, bytes per
    dimension and collective kind (measured, predicted) and this rank's PSS."""
    shape = mesh or {"dp": 2, "tp": 2}
    _check_shape(shape)
    if "pp" in shape:  # the pipeline strategy itself on the mesh, as the run loop runs it
        return check_pipeline_mesh(shape, steps, batch, hidden, heads, layers, micro_batches)
    dims = (hidden, heads, layers)
    if "tp" not in shape:  # HSDP: FSDP2 replicating over dp, sharding over fsdp
        return against_one_process(shape, steps, batch, dims, lambda batches: hsdp(make_mesh(shape), batches, dims))
    return against_one_process(shape, steps, batch, dims, lambda batches: dp_tp(
        make_mesh(shape), batches, dims, next(k for k in shape if k != "tp")))


def _check_shape(shape: Any) -> None:
    """The meshes the run loop composes, named outermost first (its config refuses the rest the same way)."""
    known = [d for shapes in MESH_DIMS.values() for d in shapes] + [HSDP_DIMS]
    ok = isinstance(shape, dict) and tuple(shape) in known \
        and all(isinstance(v, int) and not isinstance(v, bool) and v >= 1 for v in shape.values())
    if not ok:
        raise ValueError(f"check_mesh takes a dict of sizes named outermost first, one of "
                         f"{', '.join(' x '.join(d) for d in known)}, e.g. check_mesh({{'dp': 2, 'tp': 2}}); got {shape!r}")
