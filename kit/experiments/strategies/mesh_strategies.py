"""Meshes through the run loop: `ExperimentConfig(mesh=...)` on the strategy that splits the model.

A mesh adds a data-parallel dimension to a model-splitting strategy (torch's `init_device_mesh`,
dimensions named outermost first, as torchtitan orders them):

- `strategy="tp", mesh={"dp": d, "tp": t}`: Megatron tensor parallelism by hand on tp, the
  replica's gradients averaged over dp by one flat all-reduce;
- `strategy="tp", mesh={"fsdp": d, "tp": t}`: the same tp, then FSDP2's `fully_shard` on fsdp
  (each rank keeps 1/d of its tp shard; all-gathers and reduce-scatters on fsdp);
- `strategy="pipeline", mesh={"pp": p, "dp": d}`: the pipeline strategy's stages and schedule on
  pp (send/recv), each stage's gradients averaged over dp.

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

import kit.experiments.parallel.wire as wire
from kit.experiments.measure.memory import MIB, ShardAwareMeter, beside_formula, sharded_memory
from kit.experiments.measure.timing import StepClock
from kit.experiments.measure.workloads import SEQ, Block
from kit.experiments.parallel.mesh import average_gradients, dp_tp, make_mesh, parallelize, pss_mib, quiet_fsdp_tp
from kit.experiments.strategies.parallel_gpt import TensorParallel
from kit.experiments.strategies.pipeline import Pipeline
from kit.experiments.parallel.reference import (LR, check_result, lm_loss, max_abs_diff, small_gpt, token_batches,
                                               train, trained_diffs)
from kit.experiments.choices import MESH_DIMS
from kit.experiments.theory.comm_bytes import predict_dp_bytes, predict_pp_bytes
from kit.experiments.theory.parallel_memory import F32, adam_bytes

__all__ = ["MeshTensorParallel", "MeshPipeline", "check_mesh", "pipeline_on_mesh"]


def _mesh_memory(memory: dict[str, Any], formula: str) -> None:
    """What P is on this mesh, and this rank's PSS (the memory by kind is beside its formula in `by_kind`)."""
    memory["mesh"] = {"formula": formula, "pss_mib": pss_mib()}


def _check_report(check: dict[str, Any]) -> str:
    return f"check against one process (small model, same mesh): max |difference| {check['max_abs_diff']:.1e}"


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


class MeshPipeline(Pipeline):
    """strategy="pipeline" on a mesh {"pp": p, "dp": d}: the pipeline's stages and schedule on pp."""

    def __init__(self, cfg: Any, model: nn.Sequential, loss_fn: Callable[..., torch.Tensor], device: torch.device,
                 clock: Any, check: bool = True):
        self.mesh = make_mesh(cfg.mesh, device.type)
        self.dp_group = self.mesh["dp"].get_group()
        # the pipeline's stages on pp, one per rank (the config refuses virtual_stages on a mesh)
        super().__init__(cfg, model, loss_fn, device, clock, pp_group=self.mesh["pp"].get_group())
        self.stage = self.chunks[0]
        self.first, self.last = self.rank == 0, self.rank == self.world - 1
        self.hidden = next(m for m in model if isinstance(m, Block)).qkv.in_features
        self.last_step: dict[str, Any] = {}
        self.check = _pipeline_check(cfg) if check else {}
        self.notes = [f"mesh {cfg.mesh}: {cfg.schedule} pipeline over pp={self.world} stages (blocks {self.blocks}), "
                      f"m={cfg.micro_batches} micro-batches per replica; each stage's gradients averaged over "
                      f"dp={self.mesh['dp'].size()} replicas (one flat all-reduce)"]
        if self.check:
            self.notes.append(_check_report(self.check))
        wire.WIRE.clock = clock

    # -- the pp dimension: stage indices to global ranks, every message counted ----------------------
    def send(self, t: torch.Tensor, dst: int, tag: int = 0) -> None:
        t = t.detach().float().contiguous()
        self._sends.append((wire.isend(t, dist.get_global_rank(self.pp_group, dst), self.pp_group, "pp", tag), t))
        self.p2p_bytes += t.numel() * t.element_size()

    def recv(self, shape: torch.Size, src: int, tag: int = 0) -> torch.Tensor:
        buf = torch.empty(shape, device=self.device)
        with self.clock.phase("pp recv", "idle"):  # waiting for the neighbour stage (the bubble)
            dist.recv(buf, dist.get_global_rank(self.pp_group, src), group=self.pp_group, tag=tag)
        return buf

    # -- the step: this replica's share of the batch, then dp ------------------------------------------
    def train_step(self, x: torch.Tensor, y: torch.Tensor, probe: Callable[[], None] | None = None) -> float:
        d, me = self.mesh["dp"].size(), self.mesh["dp"].get_local_rank()
        wire.WIRE.reset()
        return super().train_step(x.chunk(d)[me], y.chunk(d)[me], probe)

    def _optimizer_step(self, loss: float, probe: Callable[[], None] | None) -> float:
        average_gradients(self.params, self.dp_group)
        self.last_step = wire.WIRE.report()
        t = torch.tensor([loss if self.last else 0.0], device=self.device)
        dist.all_reduce(t)  # every rank shows the global batch's loss: the last stages' mean
        return super()._optimizer_step(float(t) / self.mesh["dp"].size(), probe)

    # -- what the record says --------------------------------------------------------------------------
    def predict(self) -> dict[str, Any]:
        m, d = self.cfg.micro_batches, self.mesh["dp"].size()
        act = self.cfg.batch_size // d * SEQ * self.hidden * 4  # a step's activations (or their grads), fp32
        sends = int(not self.last) + int(not self.first)
        n = sum(p.numel() * p.element_size() for p in self.params)
        pred: dict[str, Any] = {**predict_dp_bytes(n, d), **predict_pp_bytes(act, m, sends)}
        pred["formula"] = ("pp: a stage sends b/d*s*h*4 bytes per step forward (activations, all but the last "
                           "stage) and backward (their gradients, all but the first), in m messages each; "
                           "dp: one all-reduce of the stage's gradients, ring 2(d-1)/d of them")
        return pred

    def comm_report(self) -> dict[str, Any]:
        return {"payload_bytes_per_step": int(sum(v["payload_bytes"] for v in self.last_step.values())),
                "measured_per_step": self.last_step, "predicted_per_step": self.predict(),
                "check_vs_one_process": self.check,
                "method": "payload counted at each send and collective call (wire.py); this rank's"}

    def adjust_memory(self, memory: dict[str, Any]) -> None:
        mine = [p for i in self.blocks[self.rank] for p in self.full[i].parameters()]
        n, total = sum(p.numel() for p in mine), sum(p.numel() for p in self.full.parameters())
        pred = {"params_mib": F32 * n / MIB, "grads_mib": F32 * n / MIB,
                "optimizer_mib": adam_bytes(n, len(mine)) / MIB, "activations_mib": None,
                "formula": {"params": "4 bytes x P_stage", "grads": "4 bytes x P_stage",
                            "optimizer": "Adam: 8 bytes x P_stage + 4 bytes x tensors (step)",
                            "activations": "not predicted (measured: the micro-batches in flight at the peak)"}}
        beside_formula(memory, pred)
        _mesh_memory(memory, f"P_stage = the parameters of this stage's blocks {self.blocks[self.rank]}: "
                     f"{n} of {total} (P/p = {total // self.world} when stages are equal); every dp replica "
                     "holds its stage whole")


def _pipeline_check(cfg: Any) -> dict[str, Any]:
    """The strategy's own code on a small GPT against one process (check_mesh)."""
    return check_mesh(dict(cfg.mesh), steps=3, batch=2 * cfg.mesh["dp"] * cfg.micro_batches,
                      micro_batches=cfg.micro_batches, layers=max(2, cfg.mesh["pp"] - 2))


def pipeline_on_mesh(shape: dict[str, int], batches: list, dims: tuple[int, int, int],
                     micro: int) -> tuple[list[float], dict[str, torch.Tensor], dict[str, Any]]:
    """Train a small GPT with MeshPipeline (SGD, as the reference; reference.py says why);
    returns the losses, every parameter by the full model's names, and the bytes of all steps."""
    from kit.experiments.config import ExperimentConfig
    cfg = ExperimentConfig(strategy="pipeline", workload="gpt", world_size=dist.get_world_size(), mesh=dict(shape),
                           batch_size=batches[0][0].shape[0], micro_batches=micro, steps=len(batches))
    strat = MeshPipeline(cfg, small_gpt(*dims), lm_loss, torch.device("cpu"), StepClock(False), check=False)
    strat.opt = torch.optim.SGD(strat.params, lr=LR)
    losses, measured = [], wire.Wire()
    for x, y in batches:
        losses.append(strat.train_step(x, y))
        for k, row in strat.last_step.items():
            for key, v in row.items():
                measured.rows[tuple(k.split("/"))][key] += v  # type: ignore[index]
    mine = {f"{strat.blocks[strat.rank][int(n.split('.', 1)[0])]}.{n.split('.', 1)[1]}": p.detach()
            for n, p in strat.stage.named_parameters()}
    states: list[Any] = [None] * strat.world
    dist.all_gather_object(states, mine, group=strat.pp_group)
    pred = {k: ({key: x * len(batches) for key, x in v.items()} if isinstance(v, dict) else v)
            for k, v in strat.predict().items()}
    return losses, {k: v for s in states for k, v in s.items()}, {"measured": measured.report(), "predicted": pred}


def check_mesh(mesh: dict[str, int] | None = None, steps: int = 3, batch: int = 8, hidden: int = 64, heads: int = 4,
               layers: int = 2, micro_batches: int = 2) -> dict[str, Any]:
    """Train a small GPT on a mesh ({"dp": 2, "tp": 2}, {"fsdp": 2, "tp": 2} or {"pp": 2, "dp": 2})
    and in one process; every rank calls this. Returns the differences, bytes per dimension and
    collective kind (measured, predicted) and this rank's PSS."""
    shape = mesh or {"dp": 2, "tp": 2}
    _check_shape(shape)
    batches = token_batches(steps, batch)
    ref = small_gpt(hidden, heads, layers)
    start = {name: p.detach().clone() for name, p in ref.named_parameters()}
    ref_losses = train(ref, batches)
    if "pp" in shape:  # MeshPipeline itself, as the run loop runs it
        losses, full, comm = pipeline_on_mesh(shape, batches, (hidden, heads, layers), micro_batches)
    else:
        losses, full, comm = dp_tp(make_mesh(shape), batches, (hidden, heads, layers),
                                    next(k for k in shape if k != "tp"))
    return check_result(trained_diffs(full, ref, losses, ref_losses), comm["measured"], comm["predicted"],
                        weights_moved=max_abs_diff(start, ref), mesh=shape, rank=dist.get_rank(), losses=losses,
                        ref_losses=ref_losses, pss_mib=pss_mib())


def _check_shape(shape: Any) -> None:
    """The meshes the run loop composes, named outermost first (its config refuses the rest the same way)."""
    known = [d for shapes in MESH_DIMS.values() for d in shapes]
    ok = isinstance(shape, dict) and tuple(shape) in known \
        and all(isinstance(v, int) and not isinstance(v, bool) and v >= 1 for v in shape.values())
    if not ok:
        raise ValueError(f"check_mesh takes a dict of sizes named outermost first, one of "
                         f"{', '.join(' x '.join(d) for d in known)}, e.g. check_mesh({{'dp': 2, 'tp': 2}}); got {shape!r}")
