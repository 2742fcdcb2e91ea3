"""The planner's time model on the learner's own machine: the kit's ddp, fsdp, tp, pp and cp runs on CPU ranks.
Pure Python, never imports torch; every number it returns is predicted.

Not a second model: `layout_time.step_time` prices the kit's own runs, fed this machine's measured numbers
instead of a GPU preset (a `LocalMachine`, measured by kit/experiments/measure/calibrate.py and the
collective benchmark):
- the accelerator is "this CPU, one rank": its dense peak is the matmul rate measured with every rank
  computing at once (each rank's fair share of the cores), and the utilisation is 1 (the rate is what the
  matmuls reached, not a datasheet peak); its memory bandwidth is a measured copy's;
- the link inside the "node" (all ranks of one machine) is gloo on loopback: the collective benchmark's
  all_reduce alpha-beta fit, alpha per ring step as the hop latency and beta as the bandwidth.
The kit's `gpt` workload (kit/experiments/models.py) is a ModelSpec (GPT shapes, learned
positions, biases, fused attention: torch's SDPA); each strategy is a ParallelConfig over the ranks.

Two mechanisms of CPU ranks on shared cores, measured and put into step_time's own terms
(bench/bench_predict_local.py measures each piece of the step against the model's):
- **Each collective blocks the rank.** On CPU a gloo collective called without async_op blocks the rank's
  one thread: tp's all-reduces by design, FSDP2's gathers and reduce-scatters because FSDP2 calls them so by
  default (`unshard_async_op = False`, torch/distributed/fsdp/_fully_shard/_fsdp_param_group.py; on a GPU
  that only orders a side stream), DDP's all-reduce because the gpt model's 2.6 MB of gradients fill one
  25 MiB bucket, ready when backward ends. So nothing hides behind compute: the accelerator's overlap
  slowdown is infinite (overlap.py), and every collective's time is on the critical path. Measured, 2 ranks:
  the gathers FSDP2's timeline shows ran inside forward and backward, end to end.
- **Each blocking call costs a wake-up, not the wire.** The link's fixed cost per collective (`base_us`,
  NCCL's baseLat in the GPU presets) is what one blocking call costs beyond gloo's alpha-beta as a step meets
  it: after every rank computed (`call_us`, measure/calibrate.blocked_call_rank) for the collectives, which
  wait for every rank; a ring exchange with the two neighbours after compute (`exchange_us`) for cp's hops;
  to a rank idle in recv (`handoff_us`, handoff_rank) for the pipeline's sends. Measured on 2 ranks at load
  8-10: tp's 12 all-reduces and FSDP2's 15 collectives cost 4.8-10.6 ms each inside the step, the probe
  after compute 4.9-11.2 ms in the same repeats, the collective benchmark's back-to-back loop 0.2-2.9 ms;
  at load 4-5 tp's fell to 1.7-2.7 ms against a probe of 4.3-4.9 (docs/predicting.md: a noisy measure).
What the model still leaves out (the bench prints each beside the measurement): a fixed cost per op call
(Python and dispatch: `op_us`), so compute that does not shrink with the FLOPs (tp and cp on 2 ranks
computed 0.4-1.5x ddp's time per rank where the FLOPs halve; cp's ring attention runs its K/V chunks op by
op in Python), FSDP2's own work around each collective (copy-in and copy-out of the flat buffers, hooks),
data loading and the step's bookkeeping.

`modelled_bubble`: the pipeline bubble of lesson 05 with each message's measured cost, the pipeline part of
step_time (the step is m + p - 1 micro-batch slots, each slot the stage's compute plus its sends) with
unequal stages (theory/bubble.py's ideal span) and a fixed per-op cost, beside the formula's ideal.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Callable

from kit.experiments.choices import GPT_HEADS_HIDDEN, GPT_LAYERS, GPT_SEQ, KNOB_OWNERS
from kit.experiments.theory.accelerators import Accelerator
from kit.experiments.theory.bubble import split_min_max
from kit.experiments.theory.cluster import ClusterSpec
from kit.experiments.theory.layout_memory import ParallelConfig
from kit.experiments.theory.layout_time import TimeBreakdown, step_time
from kit.experiments.theory.links import LinkPreset, alpha_beta_allreduce_s, ring_steps
from kit.experiments.theory.models import ModelSpec

__all__ = ["LocalMachine", "LOCAL_STRATEGIES", "local_cluster", "kit_gpt_spec", "kit_layout", "predict_local",
           "modelled_bubble", "mlp_stage_ms", "linear_ms", "mlp_pipeline_bubble"]

GPT_VOCAB = 256   # models.py's VOCAB (a test keeps the two in step)
PROBE_BYTES = 4096   # the blocking-call and hand-off probes' message (measure/calibrate.py): latency, not bytes
FSDP_EXTRA_UNITS = 2   # the kit's FSDP2 units beyond one per layer: the embedding and the head (predict_local)
# The point-to-point strategies' fixed cost per call (local_cluster), the measured blocking call it is and
# the words for it; the others' collectives wait for every rank after compute (call_us).
POINT_TO_POINT: dict[str, tuple[Callable[["LocalMachine"], float], str]] = {
    "pipeline": (lambda m: m.handoff_us, "a blocked rank's hand-off"),
    "cp": (lambda m: m.exchange_us, "a ring exchange after compute"),
}
_ONE = dict(precision="fp32", recompute="none", sp=False)
# strategy -> its ParallelConfig over (world_size, batch_size, micro_batches); kit_layout's docstring says why
_LAYOUTS: dict[str, Callable[[int, int, int], ParallelConfig]] = {
    "ddp": lambda w, b, m: ParallelConfig(dp=w, micro_batch=b, **_ONE),
    "fsdp": lambda w, b, m: ParallelConfig(dp=w, zero=3, micro_batch=b, **_ONE),
    "tp": lambda w, b, m: ParallelConfig(tp=w, micro_batch=b, **_ONE),
    "pipeline": lambda w, b, m: ParallelConfig(pp=w, micro_batch=b // m, micro_batches=m, **_ONE),
    "cp": lambda w, b, m: ParallelConfig(cp=w, micro_batch=b, **_ONE),
}
LOCAL_STRATEGIES = tuple(_LAYOUTS)


@dataclass(frozen=True)
class LocalMachine:
    """This machine's measured numbers (measured; `source` says how and when)."""
    matmul_gflops: float     # one rank's matmul rate with every rank computing (fit's slope)
    op_us: float             # fixed cost of one op call (fit's intercept): Python and dispatch
    alpha_us: float          # gloo all_reduce fit: latency per ring step
    gbps: float              # gloo all_reduce fit: bandwidth (GB/s)
    mem_gbps: float          # one rank's copy bandwidth (read + write bytes per second)
    call_us: float = 0.0     # one blocking collective after every rank computed, waits included (blocked_call_rank)
    handoff_us: float = 0.0  # one send to a rank idle in recv (handoff_rank): a pipeline stage's hand-off
    exchange_us: float = 0.0  # one ring exchange after compute, with both neighbours (blocked_call_rank "ring")
    source: str = ""

    def __post_init__(self) -> None:
        bad = [f"{k}={v!r}" for k, v in (("matmul_gflops", self.matmul_gflops), ("gbps", self.gbps),
                                           ("mem_gbps", self.mem_gbps)) if not v > 0]
        bad += [f"{k}={v!r}" for k, v in (("op_us", self.op_us), ("alpha_us", self.alpha_us),
                                           ("call_us", self.call_us), ("handoff_us", self.handoff_us),
                                           ("exchange_us", self.exchange_us)) if not v >= 0]
        if bad:
            raise ValueError(f"LocalMachine: {', '.join(bad)}: rates must be positive and latencies at least 0 "
                             f"(NaN included); measure them again with kit.experiments.measure.calibrate")


def local_cluster(machine: LocalMachine, ranks: int, strategy: str = "ddp", blocking: bool = True) -> ClusterSpec:
    """One 'node' of `ranks` CPU ranks joined by gloo on loopback, as ClusterSpec describes a GPU node.

    The link's fixed cost per collective is the measured blocking call less what alpha-beta already charges
    for its 4 KiB (the module's docstring): the hand-off for the pipeline, whose sends wake a stage idle in
    recv; the ring exchange after compute for cp, whose hops wait for one neighbour; the all-reduce after
    compute for the others, which wait for every rank. `blocking` False: collectives overlap compute as on a GPU
    with no slowdown, and no fixed cost: the GPU model without these two mechanisms (the bench compares both)."""
    cpu = Accelerator("this CPU (one rank)", {"fp32": machine.matmul_gflops / 1e3}, hbm_gbps=machine.mem_gbps,
                      memory_gib=0.0, source=machine.source, overlap_slowdown=math.inf if blocking else 0.0)
    one_hop, per_call = POINT_TO_POINT.get(strategy, (None, "a blocking all-reduce after compute"))
    if not blocking:
        base_us = 0.0
    elif one_hop is not None:   # point to point: one hop, one neighbour
        base_us = one_hop(machine) - machine.alpha_us - PROBE_BYTES / (machine.gbps * 1e3)
    else:
        base_us = machine.call_us - 1e6 * alpha_beta_allreduce_s(PROBE_BYTES, ranks, machine.alpha_us, machine.gbps)
    gloo = LinkPreset(hop_us=machine.alpha_us, gbps=machine.gbps, base_us=max(base_us, 0.0), efficiency=1.0,
                      source="gloo all_reduce alpha-beta fit (collective benchmark); per call: " + per_call)
    return ClusterSpec(1, ranks, cpu, gloo, gloo, 1, source=machine.source)


def kit_gpt_spec(model_size: str = "small") -> ModelSpec:
    """The kit's gpt workload as the planner sees it: GeLU MLP (4h), learned positions, biases, an untied
    head with a bias, no dropout, SDPA (fused: no s x s scores stored)."""
    heads, hidden = GPT_HEADS_HIDDEN[model_size]
    return ModelSpec(f"kit gpt {model_size}", GPT_LAYERS[model_size], hidden, heads, heads, 4 * hidden, GPT_VOCAB,
                     seq_len=GPT_SEQ, gated_mlp=False, positions=GPT_SEQ, bias=True, head_bias=True,
                     source="kit/experiments/models.py")


def kit_layout(strategy: str, world_size: int, batch_size: int = 32, micro_batches: int = 4) -> ParallelConfig:
    """The ParallelConfig of one kit run. ddp and fsdp: `batch_size` per rank (fsdp is FSDP2, ZeRO-3); tp and
    cp: every rank reads the same `batch_size` sequences (tp without sequence parallelism: the kit's tp
    all-reduces); pipeline: `batch_size` split into `micro_batches`, one stage per rank (GPipe's order)."""
    if strategy not in _LAYOUTS:
        raise ValueError(f"strategy {strategy!r}: the local model predicts {', '.join(LOCAL_STRATEGIES)}")
    if strategy in KNOB_OWNERS["micro_batches"] and batch_size % micro_batches:
        raise ValueError(f"batch_size={batch_size} does not split into micro_batches={micro_batches}")
    return _LAYOUTS[strategy](world_size, batch_size, micro_batches)


def predict_local(machine: LocalMachine, strategy: str, world_size: int, batch_size: int = 32,
                  micro_batches: int = 4, model_size: str = "small", blocking: bool = True) -> dict[str, Any]:
    """Predicted step of one kit gpt run: step_time's parts in ms, labelled predicted. `blocking`: see
    local_cluster (False: the model without the two CPU mechanisms, for comparison)."""
    spec = kit_gpt_spec(model_size)
    pc = kit_layout(strategy, world_size, batch_size, micro_batches)
    c = local_cluster(machine, world_size, strategy, blocking)
    t: TimeBreakdown = step_time(spec, pc, c, GPT_SEQ, utilisation=1.0)
    ms = lambda s: 1e3 * s  # noqa: E731
    # The kit's FSDP2 shards every child of its Sequential that has parameters (strategies/sharding.py): the
    # embedding and the head are units of their own beside step_time's one unit per layer. Each unit pays 3
    # blocking calls a step (its gather before forward, again before backward, its reduce-scatter; 15 on
    # the 3-layer gpt, as its timeline shows): their fixed cost, the bytes being in step_time's calls already.
    extra_s = 0.0
    if strategy == "fsdp" and blocking and world_size > 1:
        extra_s = FSDP_EXTRA_UNITS * 3 * (c.intra.base_us + ring_steps("all_gather", world_size) * c.intra.hop_us) * 1e-6
    comm = t.tp_s + t.cp_exposed_s + t.pp_p2p_s + t.dp_exposed_s + extra_s
    return {"predicted": True, "strategy": strategy, "world_size": world_size, "layout": pc,
            "per_call_ms": c.intra.base_us / 1e3, "blocking": blocking,
            "step_ms": ms(t.step_s + extra_s), "compute_ms": ms(t.compute_s), "comm_exposed_ms": ms(comm),
            "tp_ms": ms(t.tp_s), "cp_exposed_ms": ms(t.cp_exposed_s), "pp_send_ms": ms(t.pp_p2p_s),
            "bubble_ms": ms(t.bubble_s), "dp_ms": ms(t.dp_s + extra_s), "dp_exposed_ms": ms(t.dp_exposed_s + extra_s),
            "opt_ms": ms(t.optimizer_s)}


def linear_ms(layer_shapes: list[tuple[int, int]], rows: int, matmul_gflops: float,
              op_us: float) -> tuple[float, float]:
    """(forward, backward) ms of one micro-batch of `rows` through Linear layers (in, out): each matmul one op
    call plus its FLOPs at the measured rate; backward two matmuls (input and weight gradients)."""
    fwd = sum(op_us * 1e-3 + 2 * rows * a * b / (matmul_gflops * 1e6) for a, b in layer_shapes)
    bwd = sum(2 * op_us * 1e-3 + 4 * rows * a * b / (matmul_gflops * 1e6) for a, b in layer_shapes)
    return fwd, bwd


def mlp_stage_ms(layer_shapes: list[tuple[int, int]], rows: int, machine: LocalMachine) -> tuple[float, float]:
    """linear_ms at a LocalMachine's measured matmul rate and per-op cost."""
    return linear_ms(layer_shapes, rows, machine.matmul_gflops, machine.op_us)


def mlp_pipeline_bubble(blocks: list[list[tuple[int, int]]], batch_size: int, micro_batches: int,
                        matmul_gflops: float, op_us: float, message_ms: float, stages: int = 2) -> float:
    """The bubble the kit's `pipeline` strategy (GPipe) would measure on an MLP, predicted: `blocks` are the
    model's blocks, each its Linear shapes (in, out); each block costs linear_ms at batch_size / m rows; the
    blocks are cut as the strategy cuts them (min-max, theory/bubble.split_min_max) and modelled_bubble
    prices the step with `message_ms` per hand-off. Inputs measured (measure/calibrate.py), result
    predicted."""
    rows = batch_size // micro_batches
    block_ms = [sum(linear_ms(b, rows, matmul_gflops, op_us)) for b in blocks]
    stage_ms = [sum(block_ms[i] for i in part) for part in split_min_max(block_ms, stages)]
    return modelled_bubble(stage_ms, micro_batches, message_ms)


def modelled_bubble(stage_ms: list[float], micro_batches: int, message_ms: float, virtual: int = 1) -> float:
    """The bubble 1 - busy / (p x span) a pipeline of p stages measures, predicted. `stage_ms[r]`: stage r's
    forward + backward of ONE micro-batch (compute only); `message_ms`: one hand-off (a send and its recv),
    paid twice per micro-batch (activation forward, gradient backward), on the critical path, as
    layout_time.step_time charges it. Slots are the stage's compute plus its sends; the first micro-batch
    passes every stage, the other m-1 follow at the slowest slot's pace (theory/bubble.py's ideal span); for
    equal stages the span is (v m + p - 1) slots of (compute + sends) / v, step_time's pipeline term exactly.
    With message_ms = 0 and equal stages this is the formula (p-1)/(v m + p-1)."""
    p, n = len(stage_ms), virtual * micro_batches
    slots = [(c + 2 * message_ms) / virtual for c in stage_ms]
    span = sum(slots) + (n - 1) * max(slots)
    busy = sum(c * micro_batches for c in stage_ms)
    return 1 - busy / (p * span)
