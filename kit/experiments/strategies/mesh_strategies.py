"""Meshes through the run loop: `ExperimentConfig(mesh=...)` on the strategy that splits the model.

A mesh adds a data-parallel dimension to a model-splitting strategy (torch's `init_device_mesh`,
dimensions named outermost first, as torchtitan orders them):

- `strategy="tp", mesh={"dp": d, "tp": t}`: Megatron tensor parallelism by hand on tp, the
  replica's gradients averaged over dp by one flat all-reduce;
- `strategy="tp", mesh={"fsdp": d, "tp": t}`: the same tp, then FSDP2's `fully_shard` on fsdp
  (each rank keeps 1/d of its tp shard; all-gathers and reduce-scatters on fsdp);
- `strategy="fsdp", mesh={"dp": r, "fsdp": s}`: HSDP, FSDP2's `fully_shard` on the 2-D mesh
  (parallel/mesh.apply_hsdp): each block sharded over fsdp and replicated over dp; the all-gathers and
  reduce-scatters on fsdp, then each gradient shard all-reduced across the replicas on dp (FSDP2 issues
  it; counted and timed from the reduce-scatter's end to FSDP2's all-reduce hook, wire_fsdp.ReplicaAllReduce);
- `strategy="pipeline", mesh={"pp": p, "dp": d}`: the pipeline strategy's stages and schedule on
  pp (send/recv), then data parallel over dp on each stage; the `Pipeline` strategy composes the two
  itself (strategies/pipeline.py).

Every collective is counted and timed per "<dimension>/<kind>" (wire.py) beside its formula, shown
as a "<dimension> <kind>" comm phase in the timeline. When a tp mesh or HSDP starts, the composition is
checked against one process on a small GPT (parallel/mesh.check_mesh, which composes the same functions);
pp x dp checks the Pipeline strategy's own step instead (strategies/pipeline._one_process_check). Memory
per rank sits beside its formula, with the rank's PSS.
"""
from __future__ import annotations

from dataclasses import replace
from typing import Any, Callable

import torch
import torch.distributed as dist
from torch import nn

import kit.experiments.parallel.wire as wire
from kit.experiments.measure.memory import ShardAwareMeter, beside_formula, sharded_memory
from kit.experiments.parallel.mesh import apply_hsdp, check_mesh, make_mesh, parallelize, pss_mib, quiet_fsdp_tp
from kit.experiments.strategies.hand_parallel import Built, Groups, HandParallel, predicted_memory, standard_memory
from kit.experiments.strategies.hand_parts import TP, tp_describe, tp_predict
from kit.experiments.strategies.sharding import FSDPStrategy
from kit.experiments.theory.comm_bytes import over_steps
from kit.experiments.theory.parallel_memory import state_mib
from kit.units import MIB
from kit import _renamed

__all__ = ["DP_X_TP", "FSDP_X_TP", "HSDPStrategy"]
__getattr__ = _renamed.renamed_getattr(__name__)  # this release's old names, for one release


def _mesh_memory(memory: dict[str, Any], formula: str) -> None:
    """What P is on this mesh, and this rank's PSS (the memory by kind is beside its formula in `by_kind`)."""
    memory["mesh"] = {"formula": formula, "pss_mib": pss_mib()}


def _mesh_groups(cfg: Any, device: torch.device) -> Groups:
    mesh = make_mesh(cfg.mesh, device.type)
    return Groups(mesh["tp"].get_group(), mesh[_data_dim(mesh)].get_group(), mesh)


def _data_dim(mesh: Any) -> str:
    return next(k for k in mesh.mesh_dim_names if k != "tp")


def _mesh_build(run: HandParallel, model: nn.Sequential) -> Built:
    """`parallelize` (parallel/mesh.py): tp's split on tp (`apply_tp`, the model TP's build makes), then
    data parallelism on the other dimension (`apply_data_parallel`)."""
    return Built(*parallelize(model, run.mesh))


def _local(run: HandParallel, x: torch.Tensor, y: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    d, me = dist.get_world_size(run.dp_group), dist.get_rank(run.dp_group)
    return x.chunk(d)[me], y.chunk(d)[me]  # this replica's share of the global batch


def _describe(run: HandParallel) -> str:
    data = _data_dim(run.mesh)
    d = run.cfg.mesh[data]
    how = (f"FSDP2 fully_shard over fsdp={d} (each rank keeps 1/{d} of its tp shard)" if data == "fsdp"
           else f"gradients averaged over dp={d} replicas (one flat all-reduce)")
    return f"mesh {run.cfg.mesh}: {tp_describe(run)}; {how}"


def _check(run: HandParallel) -> dict[str, Any]:
    heads = max(4, run.t)
    return check_mesh(run.cfg.mesh, hidden=16 * heads, heads=heads)


def _predict(run: HandParallel, batch: int) -> dict[str, Any]:
    # tp's bytes on this replica's batch; the data dimension's are `parallelize`'s (Built.predicted)
    return tp_predict(run, batch // run.mesh[_data_dim(run.mesh)].size())


_P_SPLIT = ("P_split (qkv, proj, MLP weights, column biases) split over tp, P_rep (embeddings, LayerNorms, row biases, "
            "head) whole on every tp rank")


def _dp_memory(run: HandParallel, memory: dict[str, Any]) -> None:
    """By kind beside tp's formula on this replica's batch, and what P is."""
    standard_memory(run, memory)
    _mesh_memory(memory, f"P = P_split/t + P_rep: {_P_SPLIT}; every dp replica holds its tp shard whole")


def _fsdp_memory(run: HandParallel, memory: dict[str, Any]) -> None:
    """This rank's local shards by kind beside tp's formula over d (FSDP shards every parameter, its
    gradient and Adam state over fsdp), and what P is."""
    sharded_memory(memory, run.params, run.opt)  # a DTensor's numel is the whole tensor's: count the local shards
    pred = predicted_memory(run)
    d = run.mesh["fsdp"].size()
    state = state_mib(pred["n_params"], pred["n_tensors"], d, over="d")
    pred.update(params_mib=state["params_mib"], grads_mib=state["grads_mib"], optimizer_mib=state["optimizer_mib"])
    pred["formula"] = {**pred["formula"], **state["formula"], "params": pred["formula"]["params"] + " / d (fsdp)"}
    standard_memory(run, memory, pred)
    _mesh_memory(memory, f"P = P_split/t + P_rep over d = {d}: {_P_SPLIT}; FSDP shards all of it over fsdp")


# tp on a mesh: TP's parts, with the mesh's groups, model, batch share, check and memory. FSDP gathers a
# block's parameters in forward and autograd saves them: not activations (ShardAwareMeter); one block run
# alone would gather FSDP's shards outside a training step, so fsdp x tp leaves the per-layer count out.
DP_X_TP = replace(TP, groups=_mesh_groups, build=_mesh_build, local=_local, describe=_describe, check=_check,
                  predict=_predict, adjust_memory=_dp_memory, mean_over_ranks=True, step_context=quiet_fsdp_tp)
FSDP_X_TP = replace(DP_X_TP, activation_meter=lambda run: ShardAwareMeter(run.model),
                    layer_activations=lambda run, x: {}, adjust_memory=_fsdp_memory)


class HSDPStrategy(FSDPStrategy):
    """strategy="fsdp" on a mesh {"dp": r, "fsdp": s}: the model wrapped once by `apply_hsdp` (FSDP2 on the
    2-D mesh), every collective counted per dimension (wire.py) beside `predict_hsdp_bytes`, the loss shown
    for the global batch, and the composition checked against one process when the strategy starts."""

    def wrap(self, model: nn.Module) -> nn.Module:
        self.mesh = make_mesh(self.cfg.mesh, self.device.type)
        r, s = self.mesh["dp"].size(), self.mesh["fsdp"].size()
        self.world_size = s  # what FSDP's shards divide by
        self.n_params = sum(p.numel() for p in model.parameters())
        self.n_tensors = sum(1 for _ in model.parameters())
        self.check_result = check_mesh(dict(self.cfg.mesh))  # before any collective of the run's own
        # FSDP2 reduces at every backward: each accumulated micro-batch repeats the step's collectives
        self.data_bytes = over_steps(apply_hsdp(model, self.mesh), self.cfg.grad_accum_steps)
        wire.WIRE.clock = self.clock
        self.gathered_after_forward_bytes = 0
        self.params = [p for p in model.parameters() if p.requires_grad]
        self.last_step: dict[str, Any] = {}
        model.register_forward_hook(self._after_forward)
        self.notes.append(f"mesh {self.cfg.mesh}: HSDP, FSDP2 fully_shard on the 2-D mesh: every block sharded over "
                          f"fsdp={s} (all-gathers, reduce-scatters) and replicated over dp={r} (each gradient shard "
                          f"all-reduced across replicas: timed from the reduce-scatter's end to FSDP2's all-reduce hook)")
        self.notes.append(f"check against one process (small model, same mesh): max |difference| "
                          f"{self.check_result['max_abs_diff']:.1e}")
        return model

    def train_step(self, x: torch.Tensor, y: torch.Tensor, probe: Callable[[], None] | None = None) -> float:
        with quiet_fsdp_tp():  # FSDP2's "returned a view tensor" per module and rank: the loop does no in-place op
            loss = super().train_step(x, y, probe)  # FSDPStrategy's: the wire reset, then its report in last_step
        t = torch.tensor([loss], device=self.device)
        dist.all_reduce(t)  # every rank shows the global batch's loss, as one process does
        return float(t) / dist.get_world_size()

    def comm_report(self) -> dict[str, Any]:
        return {"payload_bytes_per_step": int(sum(v["payload_bytes"] for v in self.last_step.values())),
                "measured_per_step": self.last_step, "predicted_per_step": self.data_bytes,
                "check_vs_one_process": self.check_result,
                "method": "payload counted at each collective call (wire.py; dp's all-reduce, which FSDP2 issues "
                          "itself, timed from the reduce-scatter's end to FSDP2's all-reduce hook); this rank's"}

    def adjust_memory(self, memory: dict[str, Any]) -> None:
        sharded_memory(memory, self.params, self.opt)  # a DTensor's numel is the whole tensor's: the local shards
        memory["gathered_params_after_forward_mib"] = self.gathered_after_forward_bytes / MIB
        s = self.mesh["fsdp"].size()
        state = state_mib(self.n_params, self.n_tensors, s, over="s")
        beside_formula(memory, {**state, "activations_mib": None,
                                "formula": {**state["formula"], "activations": "not predicted (measured)"}})
        _mesh_memory(memory, f"P / s: every block sharded over fsdp = {s}; each of the dp = "
                     f"{self.mesh['dp'].size()} replicas holds the same shards")

