"""The hand-written parallelisms (tp, sp, cp, ep, and tp on a mesh) as one run-loop strategy on the gpt
workload: `HandParallel`, given the parallelism's `HandParts`.

What differs between the parallelisms is one declared object, `HandParts` (below): how to make the
groups, build the model, split a batch, check against one process, what to predict and how to
report. One instance per parallelism lives in hand_parts.py (tp, sp, cp, ep, built from
parallel/'s blocks) and mesh_strategies.py (tp on a dp or fsdp mesh, built from tp's parts);
registry.py says which a config runs. The loop, the reports and the timeline are `HandParallel`'s:
- comm_report: the last step's collectives per mesh dimension and kind, counted at each call
  (wire.py), beside the formula's prediction, and the check against one process (the parts'
  `check` on a small model, run once when the strategy starts);
- memory: parameters, gradients, optimizer state and the whole forward's activations on this rank,
  measured, beside theory/parallel_memory.py's formulas (`by_kind`, the plot's predicted bars), and
  the activations saved by one transformer block beside the per-layer formula;
- the timeline: every collective a "comm" phase named "<dimension> <kind>".
"""
from __future__ import annotations

from contextlib import nullcontext
from dataclasses import dataclass
from typing import Any, Callable, ContextManager, NamedTuple

import torch
import torch.distributed as dist
from torch import nn

from kit.experiments.measure.memory import ActivationMeter, beside_formula
from kit.experiments.measure.timing import StepClock
from kit.experiments.choices import GPT_SEQ
from kit.experiments.models import Block, VOCAB
import kit.experiments.parallel.wire as wire
from kit.experiments.strategies.base import Strategy
from kit.experiments.strategies.common import make_optimizer
from kit.experiments.theory.parallel_memory import memory_per_rank
from kit.units import MIB

__all__ = ["Groups", "Built", "HandParts", "HandParallel", "standard_comm_report", "standard_memory",
           "predicted_memory"]


class Groups(NamedTuple):
    """The process groups a parallelism runs on: `split` the model's (None: every rank), `data` the
    data dimension's on a mesh, and the mesh itself (None off a mesh)."""

    split: Any = None
    data: Any = None
    mesh: Any = None


class Built(NamedTuple):
    """What `HandParts.build` returns (parallel/mesh.parallelize's shape): the parallel model, the step
    to call after each backward (gradients summed or averaged where they are partial; None: nothing),
    and the bytes per step of the collectives that step or the wrapping adds, predicted (merged into
    `predict`'s)."""

    model: nn.Module
    after_backward: Callable[[], None] | None = None
    predicted: dict[str, Any] = {}


def _world(cfg: Any, device: torch.device) -> Groups:
    return Groups()


def _whole(run: HandParallel, x: torch.Tensor, y: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    return x, y


def _nothing(run: HandParallel, *args: Any) -> dict[str, Any]:
    return {}


def _keep_nothing(run: HandParallel) -> Any:
    return None


def _every_parameter(run: HandParallel) -> Any:
    return ActivationMeter(run.params)


@dataclass(frozen=True)
class HandParts:
    """What one hand-written parallelism gives `HandParallel`: every place the parallelisms differ,
    named and typed (no hook is overridden; a field left out takes the default shown). Each function
    takes the running strategy `run` and reads its public attributes (listed on `HandParallel`)."""

    kind: str  # the parallelism's name in theory/parallel_memory.py ("tp", "sp", "cp", "ep")
    build: Callable[[HandParallel, nn.Sequential], Built]  # the parallel model, built once (optimizer after)
    describe: Callable[[HandParallel], str]  # the run's first note: how the model is split
    check: Callable[[HandParallel], dict[str, Any]]  # against one process on a small model (a CheckResult)
    groups: Callable[[Any, torch.device], Groups] = _world  # (cfg, device): made before the model is built
    local: Callable[[HandParallel, torch.Tensor, torch.Tensor], tuple[torch.Tensor, torch.Tensor]] = _whole
    predict: Callable[[HandParallel, int], dict[str, Any]] = _nothing  # bytes per step for a batch
    keep: Callable[[HandParallel], Any] = _keep_nothing  # what `predict` needs of the step counted (`run.kept`)
    layer_activations: Callable[[HandParallel, torch.Tensor], dict[str, Any]] = _nothing  # one block, probe step
    activation_meter: Callable[[HandParallel], Any] = _every_parameter  # the whole forward's (measure/memory.py)
    mean_over_ranks: bool = False  # each rank's loss is its own tokens': the loss shown is their mean
    adjust_memory: Callable[[HandParallel, dict[str, Any]], None] | None = None  # None: standard_memory
    comm_report: Callable[[HandParallel], dict[str, Any]] | None = None  # None: standard_comm_report
    step_context: Callable[[], ContextManager[Any]] = nullcontext  # around each train step (torch's notices)


class HandParallel(Strategy):
    """The one strategy for tp, sp, cp, ep and tp on a mesh: the loop, given the parallelism's `parts`.

    What a part may read: `cfg`, `device`, `group` (the split's), `dp_group` (the data dimension's),
    `mesh`, `t` (ranks in `group`), `hidden`, `heads`, `layers` (the workload's), `model`, `params`,
    `opt`, `last_step` (the last timed step's collectives), `kept` (what `parts.keep` returned for
    it), `layer_memory`, `probe_shape` (this rank's batch and tokens in the probe step), `check_result`
    (what `parts.check` returned)."""

    def __init__(self, cfg: Any, model: nn.Sequential, loss_fn: Callable[..., torch.Tensor], device: torch.device,
                 clock: StepClock, parts: HandParts):
        self.cfg, self.device, self.clock, self.loss_fn, self.parts = cfg, device, clock, loss_fn, parts
        self.group, self.dp_group, self.mesh = parts.groups(cfg, device)
        self.t = dist.get_world_size(self.group)
        first = next(m for m in model if isinstance(m, Block))
        self.hidden, self.heads, self.layers = first.qkv.in_features, first.heads, sum(isinstance(m, Block) for m in model)
        built = parts.build(self, model)
        self.model, self.after_backward, self.built_bytes = built.model.to(device), built.after_backward, built.predicted
        self.params = [p for p in self.model.parameters() if p.requires_grad]
        self.opt = make_optimizer(self.params)
        self.meter = parts.activation_meter(self)
        self.bucket_bytes: list[int] = []
        self.last_step: dict[str, Any] = {}
        self.kept: Any = None
        self.layer_memory: dict[str, Any] = {}
        clock.watch_grads(self.params)
        self.check_result = parts.check(self)
        self.notes = [parts.describe(self), "check against one process (small model): max |difference| "
                                            f"{self.check_result['max_abs_diff']:.1e}"]
        wire.WIRE.clock = clock

    def train_step(self, x: torch.Tensor, y: torch.Tensor, probe: Callable[[], None] | None = None) -> float:
        with self.parts.step_context():
            return self._step(x, y, probe)

    def _step(self, x: torch.Tensor, y: torch.Tensor, probe: Callable[[], None] | None) -> float:
        x, y = self.parts.local(self, x.to(self.device), y.to(self.device))
        wire.WIRE.reset()
        with self.clock.phase("forward"), (self.meter.record() if probe else nullcontext()):
            loss = self.loss_fn(self.model(x), y)
        with self.clock.phase("backward"):
            loss.backward()
        if self.after_backward is not None:
            self.after_backward()
        if not probe:  # the untimed memory probe step's collectives wait on its probing: keep the last timed step's
            self.last_step = wire.WIRE.report()
            self.kept = self.parts.keep(self)
        if probe:
            self.layer_memory = self.parts.layer_activations(self, x)
            self.probe_shape = tuple(x.shape)  # this rank's (batch, tokens): the memory formula's b and s/t
            probe()
        with self.clock.phase("optimizer"):
            self.opt.step()
            self.opt.zero_grad(set_to_none=True)
        value = loss.detach().clone()
        if self.parts.mean_over_ranks:  # each rank's loss is its tokens' mean: the global one is the mean
            dist.all_reduce(value)
            value /= dist.get_world_size()
        return float(value)

    def comm_report(self) -> dict[str, Any] | None:
        return (self.parts.comm_report or standard_comm_report)(self)

    def adjust_memory(self, memory: dict[str, Any]) -> None:
        (self.parts.adjust_memory or standard_memory)(self, memory)


def standard_comm_report(run: HandParallel) -> dict[str, Any]:
    """The last timed step's collectives beside the prediction for the run's batch, and the check."""
    return {"payload_bytes_per_step": int(sum(v["payload_bytes"] for v in run.last_step.values())),
            "measured_per_step": run.last_step,
            "predicted_per_step": {**run.parts.predict(run, run.cfg.batch_size), **run.built_bytes},
            "check_vs_one_process": run.check_result,
            "method": "payload counted at each collective call (kit/experiments/parallel/wire.py); "
                      "wire bytes per rank under the ring algorithm"}


def standard_memory(run: HandParallel, memory: dict[str, Any], predicted: dict[str, Any] | None = None) -> None:
    """One block's activations beside the per-layer formula, and each kind beside `predicted` (default:
    `predicted_memory(run)`)."""
    lm = run.layer_memory
    if lm:
        memory["activations_per_layer"] = {
            "measured_mib": lm["measured"] / MIB, "predicted_mib": lm["predicted"]["bytes"] / MIB,
            "formula": lm["predicted"]["formula"],
            "korthikanti_fp16_mib": lm["predicted"].get("korthikanti_fp16_bytes", 0) / MIB or None}
    beside_formula(memory, predicted_memory(run) if predicted is None else predicted)


def predicted_memory(run: HandParallel, **extra: Any) -> dict[str, Any]:
    """This rank's memory by kind from theory/parallel_memory.py (the probe step's shapes); `extra`:
    more arguments for memory_per_rank (ep: experts, top-k, the probe step's routing)."""
    return memory_per_rank(run.parts.kind, run.probe_shape[0], GPT_SEQ, run.hidden, run.heads, run.layers, VOCAB, run.t,
                           **extra)
