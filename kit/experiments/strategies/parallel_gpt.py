"""Tensor, sequence, context and expert parallelism as run-loop strategies on the gpt workload.

Each wraps the workload's model with the hand-written building blocks (tensor_parallel.py,
sequence_parallel.py, context_parallel.py, expert_parallel.py), trains it with the kit's Adam,
and reports:
- comm_report: the last step's collectives per mesh dimension and kind, counted at each call
  (wire.py), beside the formula's prediction, and the check against one process (the strategy's
  `check_*` on a small model, run once when the strategy starts);
- memory: parameters, gradients, optimizer state and the whole forward's activations on this rank,
  measured, beside theory/parallel_memory.py's formulas (`by_kind`, the plot's predicted bars), and
  the activations saved by one transformer block beside the per-layer formula;
- the timeline: every collective a "comm" phase named "<dimension> <kind>".
"""
from __future__ import annotations

from contextlib import nullcontext
from typing import Any, Callable

import torch
import torch.distributed as dist
from torch import nn

from kit.experiments.measure.memory import ActivationMeter, beside_formula
from kit.experiments.measure.timing import StepClock
from kit.experiments.models import Block, SEQ, VOCAB
import kit.experiments.parallel.wire as wire
from kit.experiments.strategies.base import Strategy
from kit.experiments.strategies.common import make_optimizer
from kit.experiments.parallel.sequence import (check_sp, scatter_sequence, sequence_parallel,
                                               sync_sequence_parallel_grads)
from kit.experiments.parallel.tensor import check_tp, layer_activation_bytes, tensor_parallel
from kit.experiments.theory.comm_bytes import predict_sp_bytes, predict_tp_bytes
from kit.experiments.theory.parallel_memory import memory_per_rank, predict_tp_activation_bytes
from kit.units import MIB

__all__ = ["HandParallel", "TensorParallel", "SequenceParallel"]



class HandParallel(Strategy):
    """The loop shared by tp, sp, cp and ep; subclasses say how to split and what to predict."""

    kind = ""  # the strategy's name in theory/parallel_memory.py

    def __init__(self, cfg: Any, model: nn.Sequential, loss_fn: Callable[..., torch.Tensor], device: torch.device,
                 clock: StepClock):
        self.cfg, self.device, self.clock, self.loss_fn = cfg, device, clock, loss_fn
        self.group, self.dp_group = self.groups()
        self.t = dist.get_world_size(self.group)
        first = next(m for m in model if isinstance(m, Block))
        self.hidden, self.heads, self.layers = first.qkv.in_features, first.heads, sum(isinstance(m, Block) for m in model)
        self.model = self.build(model).to(device)
        self.params = [p for p in self.model.parameters() if p.requires_grad]
        self.opt = make_optimizer(self.params)
        self.meter = self.activation_meter()
        self.bucket_bytes: list[int] = []
        self.last_step: dict[str, Any] = {}
        self.layer_memory: dict[str, Any] = {}
        clock.watch_grads(self.params)
        self.check = self.one_process_check()
        self.notes = [self.describe(),
                      f"check against one process (small model): max |difference| {self.check['max_abs_diff']:.1e}"]
        wire.WIRE.clock = clock

    # -- what a subclass says -----------------------------------------------------------------
    def groups(self) -> tuple[Any, Any]:
        return None, None

    def build(self, model: nn.Sequential) -> nn.Module:
        """The parallel model, built once: the optimizer is made for its parameters after this."""
        raise NotImplementedError

    def activation_meter(self) -> Any:
        return ActivationMeter(self.params)

    def describe(self) -> str:
        return ""

    def one_process_check(self) -> dict[str, Any]:
        return {}

    def local(self, x: torch.Tensor, y: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return x, y

    def sync_grads(self) -> None:
        """After backward: gradients that are partial on this rank are summed or averaged."""

    def predict(self, batch: int) -> dict[str, Any]:
        return {}

    def layer_activations(self, x: torch.Tensor) -> dict[str, Any]:
        return {}

    def mean_over_ranks(self) -> bool:
        return False

    # -- the loop --------------------------------------------------------------------------------
    def train_step(self, x: torch.Tensor, y: torch.Tensor, probe: Callable[[], None] | None = None) -> float:
        x, y = self.local(x.to(self.device), y.to(self.device))
        wire.WIRE.reset()
        with self.clock.phase("forward"), (self.meter.record() if probe else nullcontext()):
            loss = self.loss_fn(self.model(x), y)
        with self.clock.phase("backward"):
            loss.backward()
        self.sync_grads()
        if not probe:  # the untimed memory probe step's collectives wait on its probing: keep the last timed step's
            self.last_step = wire.WIRE.report()
            self.keep_step()
        if probe:
            self.layer_memory = self.layer_activations(x)
            self.probe_shape = tuple(x.shape)  # this rank's (batch, tokens): the memory formula's b and s/t
            probe()
        with self.clock.phase("optimizer"):
            self.opt.step()
            self.opt.zero_grad(set_to_none=True)
        value = loss.detach().clone()
        if self.mean_over_ranks():  # each rank's loss is its tokens' mean: the global one is the mean
            dist.all_reduce(value)
            value /= dist.get_world_size()
        return float(value)

    def keep_step(self) -> None:
        """Keep what `predict` needs of the step `last_step` counts (ep: its routing); nothing by default."""

    def comm_report(self) -> dict[str, Any] | None:
        batch = self.cfg.batch_size
        return {"payload_bytes_per_step": int(sum(v["payload_bytes"] for v in self.last_step.values())),
                "measured_per_step": self.last_step, "predicted_per_step": self.predict(batch),
                "check_vs_one_process": self.check,
                "method": "payload counted at each collective call (kit/experiments/parallel/wire.py); "
                          "wire bytes per rank under the ring algorithm"}

    def adjust_memory(self, memory: dict[str, Any]) -> None:
        lm = self.layer_memory
        if lm:
            memory["activations_per_layer"] = {
                "measured_mib": lm["measured"] / MIB, "predicted_mib": lm["predicted"]["bytes"] / MIB,
                "formula": lm["predicted"]["formula"],
                "korthikanti_fp16_mib": lm["predicted"].get("korthikanti_fp16_bytes", 0) / MIB or None}
        predicted = self.memory_prediction()
        if predicted:
            beside_formula(memory, predicted)

    def memory_prediction(self) -> dict[str, Any]:
        """This rank's memory by kind from theory/parallel_memory.py (the probe step's shapes)."""
        if not self.kind:
            return {}
        return memory_per_rank(self.kind, self.probe_shape[0], SEQ, self.hidden, self.heads, self.layers, VOCAB, self.t,
                               **self.memory_extra())

    def memory_extra(self) -> dict[str, Any]:
        """More arguments for memory_per_rank (ep: experts, top-k, the probe step's routing)."""
        return {}


class TensorParallel(HandParallel):
    """Megatron tensor parallelism over every rank (on a mesh: mesh_strategies.MeshTensorParallel)."""

    kind = "tp"

    def build(self, model: nn.Sequential) -> nn.Module:
        return tensor_parallel(model, self.group)

    def describe(self) -> str:
        return (f"tensor parallel over {self.t} ranks: heads {self.heads} -> {self.heads // self.t} per rank, "
                f"MLP 4h={4 * self.hidden} -> {4 * self.hidden // self.t}; 2 all-reduces forward, 2 backward per layer")

    def one_process_check(self) -> dict[str, Any]:
        return check_tp(steps=3, group=self.group)

    def predict(self, batch: int) -> dict[str, Any]:
        return predict_tp_bytes(batch, SEQ, self.hidden, self.layers, self.t)

    def layer_activations(self, x: torch.Tensor) -> dict[str, Any]:
        return {"measured": layer_activation_bytes(self.model, x, 1),
                "predicted": predict_tp_activation_bytes(x.shape[0], x.shape[1], self.hidden, self.heads, self.t)}


class SequenceParallel(TensorParallel):
    """Tensor parallelism with the LayerNorms split along the sequence (Korthikanti et al. 2022)."""

    kind = "sp"

    def build(self, model: nn.Sequential) -> nn.Module:
        return sequence_parallel(model, self.group)

    def describe(self) -> str:
        return (f"sequence parallel over {self.t} ranks: LayerNorms on {SEQ // self.t} of {SEQ} tokens, "
                "all-gather / reduce-scatter in place of all-reduce")

    def one_process_check(self) -> dict[str, Any]:
        return check_sp(steps=3, group=self.group)

    def sync_grads(self) -> None:
        sync_sequence_parallel_grads(self.model)  # type: ignore[arg-type]

    def predict(self, batch: int) -> dict[str, Any]:
        return predict_sp_bytes(batch, SEQ, self.hidden, self.layers, self.t)

    def layer_activations(self, x: torch.Tensor) -> dict[str, Any]:
        with torch.no_grad():
            h = scatter_sequence(self.model[0](x), self.group)  # type: ignore[index]
        return {"measured": layer_activation_bytes(nn.Sequential(self.model[1]), h, 0),  # type: ignore[index]
                "predicted": predict_tp_activation_bytes(x.shape[0], x.shape[1], self.hidden, self.heads, self.t,
                                                         sp=True)}
