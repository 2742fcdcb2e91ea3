"""Pipeline parallel: model-parallel stages fed with micro-batches, GPipe, 1F1B or interleaved 1F1B.

With p stages and m micro-batches a stage idles (p-1) slots of the m+p-1 in a step:
bubble = (p-1)/(m+p-1) (GPipe, Huang et al. 2018, arXiv:1811.06965). 1F1B has the same bubble
but starts backward early, so a stage holds at most p micro-batches' activations instead of m.
Interleaved 1F1B (Narayanan et al., SC 2021, arXiv:2104.04473) gives each rank v chunks (stages
r, r+p, ...): the slots of filling and draining are 1/v as long, bubble (p-1)/(v m + p-1), for v
times more messages. The schedules are lists of operations (theory/pipeline_schedule.py, where a
simulation checks them for deadlocks). The bubble is measured as 1 - sum of stage busy time /
(p x global span) on the common clock and reported beside the formula, with the difference split
into stage imbalance and per-micro-batch overhead (bubble.py).

On a mesh {"pp": p, "dp": d} (`ExperimentConfig(mesh=...)`) the strategy composes two parallelisms in
order, as torchtitan does (its pipeline splits the model, then each stage is parallelized): the stages
and schedule on the pp dimension (send/recv counted under "pp"), then data parallel over dp applied to
this rank's stage (parallel/mesh.apply_data_parallel, the function tp x dp uses: each stage's gradients
averaged over its d replicas by one flat all-reduce). Each replica trains on its 1/d of the batch. The
composition is checked against one process on a small GPT when the strategy starts, with this strategy's
own step (its stages, schedule and dp all-reduce), weight by weight. parallel/mesh.check_mesh checks the same
composition written by hand for a lesson (parallel/pipeline.py's stages and 1F1B, then apply_data_parallel).
"""
from __future__ import annotations

from typing import Any, Callable

import torch
import torch.distributed as dist
from torch import nn

import kit.experiments.parallel.wire as wire
from kit.experiments.measure.memory import beside_formula
from kit.experiments.measure.timing import StepClock
from kit.experiments.choices import GPT_SEQ
from kit.experiments.models import Block
from kit.experiments.parallel.mesh import against_one_process, apply_data_parallel, make_mesh, pss_mib
from kit.experiments.parallel.reference import SGD_LR, lm_loss, small_gpt
from kit.experiments.theory.bubble import predicted_bubble
from kit.experiments.theory.comm_bytes import predict_pp_bytes
from kit.experiments.theory.parallel_memory import state_mib
from kit.experiments.theory.pipeline_schedule import schedule
from kit.experiments.strategies.common import chunks
from kit.experiments.strategies.model_parallel import ModelParallel

__all__ = ["Pipeline", "schedule", "predicted_bubble"]


class Pipeline(ModelParallel):
    """The same stages as ModelParallel (v per rank when interleaved); the step runs the
    micro-batches in schedule order."""

    def __init__(self, cfg: Any, model: nn.Sequential, loss_fn: Callable[..., torch.Tensor], device: torch.device,
                 clock: StepClock, check: bool = True):
        # 1. the stages on pp: every rank, or a mesh's pp dimension (one stage per rank: the config refuses
        # virtual_stages on a mesh)
        self.mesh = make_mesh(cfg.mesh, device.type) if getattr(cfg, "mesh", None) else None
        self.micro_batches = cfg.micro_batches  # before the stages are cut: blocks are timed on one micro-batch
        super().__init__(cfg, model, loss_fn, device, clock,
                         pp_group=self.mesh["pp"].get_group() if self.mesh is not None else None)
        m, p, v = self.micro_batches, self.world, self.virtual
        self.ops = schedule(self.cfg.schedule, self.rank, p, m, v)
        formula = "(p-1)/(m+p-1)" if v == 1 else "(p-1)/(v*m+p-1)"
        self.notes.append(f"{self.cfg.schedule}: p={p} stages" + (f" x v={v} chunks each" if v > 1 else "")
                          + f", m={m} micro-batches, predicted bubble {formula} = {100 * predicted_bubble(p, m, v):.0f}%")
        self.inflight_peak_mib: float | None = None
        # 2. then data parallel over dp on this rank's stage
        self.replicas, self.after_backward, self.data_bytes = 1, None, {}
        self.check_result: dict[str, Any] = {}
        self.last_step: dict[str, Any] = {}
        if self.mesh is not None:
            self._replicate_over_dp(model, check)

    def _replicate_over_dp(self, model: nn.Sequential, check: bool) -> None:
        self.replicas = self.mesh["dp"].size()
        self.after_backward, self.data_bytes = apply_data_parallel(self.chunks[0], self.mesh, "dp")
        self.hidden = next(m for m in model if isinstance(m, Block)).qkv.in_features
        self.check_result = _one_process_check(self.cfg) if check else {}
        self.notes = [f"mesh {self.cfg.mesh}: {self.cfg.schedule} pipeline over pp={self.world} stages (blocks "
                      f"{self.blocks}), m={self.cfg.micro_batches} micro-batches per replica; each stage's gradients "
                      f"averaged over dp={self.replicas} replicas (one flat all-reduce)"]
        if self.check_result:
            self.notes.append(f"check of this strategy's step against one process (small model, same mesh): "
                              f"max |difference| {self.check_result['max_abs_diff']:.1e}")
        wire.WIRE.clock = self.clock

    def train_step(self, x: torch.Tensor, y: torch.Tensor, probe: Callable[[], None] | None = None) -> float:
        self.p2p_bytes = 0
        if self.mesh is not None:  # this replica's share of the batch; the wire counts this step only
            me = self.mesh["dp"].get_local_rank()
            x, y = x.chunk(self.replicas)[me], y.chunk(self.replicas)[me]
            wire.WIRE.reset()
        micro = chunks(x, y, self.cfg.micro_batches)
        if probe:  # memory step (untimed): each micro-batch its own input, as after a copy to the
            # device; a view would make the meter count the whole batch's storage once per micro-batch
            micro = [(xm.clone(), ym) for xm, ym in micro]
        scale = 1.0 / len(micro)  # mean of micro-batch means = the global-batch mean
        held: dict[tuple[int, int], tuple[Any, Any]] = {}
        mb_bytes: dict[tuple[int, int], int] = {}
        live = peak = 0
        loss = 0.0
        for op, c, i in self.ops:
            if op == "F":
                inp, out, l = self.forward(*micro[i], scale, meter=probe is not None, chunk=c)
                held[c, i] = (inp, out)
                loss += l
                if probe:  # activations alive at once: what 1F1B saves over GPipe
                    mb_bytes[c, i] = self.meter.bytes
                    live += mb_bytes[c, i]
                    peak = max(peak, live)
            else:
                self.backward(*held.pop((c, i)), chunk=c)  # frees its saved activations
                live -= mb_bytes.get((c, i), 0)
        self.finish_sends()
        if probe:
            self.meter.bytes = peak
        return self._optimizer_step(loss, probe)

    def _optimizer_step(self, loss: float, probe: Callable[[], None] | None) -> float:
        if self.after_backward is not None:  # on a mesh: the stage's gradients averaged over dp
            self.after_backward()
            if not probe:  # the untimed memory probe step's times are not a timed step's (hand_parallel.py)
                self.last_step = wire.WIRE.report()
            t = torch.tensor([loss if self.rank == self.world - 1 else 0.0], device=self.device)
            dist.all_reduce(t)  # every rank shows the global batch's loss: the last stages' mean
            loss = float(t) / self.replicas
        return super()._optimizer_step(loss, probe)

    # -- what the record says on a mesh --------------------------------------------------------------
    def predict(self) -> dict[str, Any]:
        """Bytes per step on a mesh, per "<dimension>/<kind>": pp's sends and dp's all-reduce."""
        m, d = self.cfg.micro_batches, self.replicas
        act = self.cfg.batch_size // d * GPT_SEQ * self.hidden * 4  # a step's activations (or their grads), fp32
        sends = int(self.rank != self.world - 1) + int(self.rank != 0)
        pred: dict[str, Any] = {**self.data_bytes, **predict_pp_bytes(act, m, sends)}
        pred["formula"] = ("pp: a stage sends b/d*s*h*4 bytes per step forward (activations, all but the last "
                           "stage) and backward (their gradients, all but the first), in m messages each; "
                           "dp: one all-reduce of the stage's gradients, ring 2(d-1)/d of them")
        return pred

    def comm_report(self) -> dict[str, Any] | None:
        if self.mesh is None:
            return None
        return {"payload_bytes_per_step": int(sum(v["payload_bytes"] for v in self.last_step.values())),
                "measured_per_step": self.last_step, "predicted_per_step": self.predict(),
                "check_vs_one_process": self.check_result,
                "method": "payload counted at each send and collective call (wire.py); this rank's"}

    def adjust_memory(self, memory: dict[str, Any]) -> None:
        if self.mesh is None:
            return
        mine = [p for i in self.blocks[self.rank] for p in self.full[i].parameters()]
        n, total = sum(p.numel() for p in mine), sum(p.numel() for p in self.full.parameters())
        state = state_mib(n, len(mine), of="P_stage")
        beside_formula(memory, {**state, "activations_mib": None, "formula": {
            **state["formula"], "activations": "not predicted (measured: the micro-batches in flight at the peak)"}})
        memory["mesh"] = {"formula": f"P_stage = the parameters of this stage's blocks {self.blocks[self.rank]}: "
                          f"{n} of {total} (P/p = {total // self.world} when stages are equal); every dp replica "
                          "holds its stage whole", "pss_mib": pss_mib()}


def _one_process_check(cfg: Any) -> dict[str, Any]:
    """This strategy's own step on this mesh and micro-batches, on a small GPT (enough blocks for the pp
    stages), against one process: a CheckResult, as check_mesh's."""
    shape, dims = dict(cfg.mesh), (64, 4, max(2, cfg.mesh["pp"] - 2))
    return against_one_process(shape, 3, 2 * shape["dp"] * cfg.micro_batches, dims,
                               lambda batches: _train_on_mesh(shape, batches, dims, cfg.micro_batches))


def _train_on_mesh(shape: dict[str, int], batches: list, dims: tuple[int, int, int],
                   micro: int) -> tuple[list[float], dict[str, torch.Tensor], dict[str, Any]]:
    """Train a small GPT with this strategy on the mesh (SGD, as the reference; reference.py says why);
    returns the losses, every parameter by the full model's names, and the bytes of all steps."""
    from kit.experiments.config import ExperimentConfig
    cfg = ExperimentConfig(strategy="pipeline", workload="gpt", world_size=dist.get_world_size(), mesh=dict(shape),
                           batch_size=batches[0][0].shape[0], micro_batches=micro, steps=len(batches))
    strat = Pipeline(cfg, small_gpt(*dims), lm_loss, torch.device("cpu"), StepClock(False), check=False)
    strat.opt = torch.optim.SGD(strat.params, lr=SGD_LR)
    losses, measured = [], wire.Wire()
    for x, y in batches:
        losses.append(strat.train_step(x, y))
        for k, row in strat.last_step.items():
            for key, v in row.items():
                measured.rows[tuple(k.split("/"))][key] += v  # type: ignore[index]
    mine = {f"{strat.blocks[strat.rank][int(n.split('.', 1)[0])]}.{n.split('.', 1)[1]}": p.detach()
            for n, p in strat.chunks[0].named_parameters()}
    states: list[Any] = [None] * strat.world
    dist.all_gather_object(states, mine, group=strat.pp_group)
    pred = {k: ({key: x * len(batches) for key, x in v.items()} if isinstance(v, dict) else v)
            for k, v in strat.predict().items()}
    return losses, {k: v for s in states for k, v in s.items()}, {"measured": measured.report(), "predicted": pred}
