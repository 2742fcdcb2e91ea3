"""Pipeline parallelism by hand: the model cut into stages, one per rank of a group, fed micro-batches.

Stage r of p holds a contiguous run of the model's blocks (cut so the largest stage has the fewest
parameters, measure/workloads.split_stages). A step cuts the batch into m micro-batches and runs each
rank's operations in the schedule's order (theory/pipeline_schedule.py: GPipe, every forward then
every backward, or 1F1B, which starts backward early so a stage holds at most p micro-batches):

- forward of micro-batch i: receive its activation from stage r-1 (the first stage reads the tokens),
  run the stage, send the output to stage r+1 (the last stage computes the loss, divided by m: the mean
  of the micro-batches' means is the batch's mean);
- backward of micro-batch i: receive the gradient of the output from stage r+1 (the last stage starts
  from its loss), backpropagate through the stage, send the input's gradient to stage r-1.

Sends are non-blocking (waited at the end of the step), receives blocking: a stage waits for its
neighbour, which is the pipeline's bubble, (p-1)/(m+p-1) of the step (Huang et al. 2018,
arXiv:1811.06965). Every send is counted and timed under "pp" (wire.py). mesh.py composes this with
data parallelism over a second dimension (`pp_dp`, checked by `check_mesh({"pp": p, "dp": d})`).

The run loop's `strategy="pipeline"` (strategies/pipeline.py) runs the same schedules with its own
instruments: stages cut on measured block costs, clock phases for the timeline, the activations in
flight, interleaved virtual stages.
"""
from __future__ import annotations

from typing import Any, Callable

import torch
import torch.distributed as dist
from torch import nn

import kit.experiments.parallel.wire as wire
from kit.experiments.measure.workloads import split_stages
from kit.experiments.parallel.reference import lm_loss
from kit.experiments.theory.pipeline_schedule import BACKWARD_TAG, FORWARD_TAG, schedule

__all__ = ["pipeline_stage", "pipeline_step", "stages_full_state"]


def pipeline_stage(model: nn.Sequential, group: Any = None) -> tuple[nn.Sequential, list[int]]:
    """This rank's stage of `model` on `group` (None: every rank): the stage and its blocks' indices."""
    blocks = split_stages(model, dist.get_world_size(group))[dist.get_rank(group)]
    return nn.Sequential(*[model[i] for i in blocks]), blocks


def pipeline_step(stage: nn.Module, x: torch.Tensor, y: torch.Tensor, micro_batches: int,
                  activation: tuple[int, ...], group: Any = None, kind: str = "1f1b",
                  loss_fn: Callable[[torch.Tensor, torch.Tensor], torch.Tensor] = lm_loss) -> float:
    """Forward and backward of one batch through the stages, in `kind`'s order; the gradients are left in
    the stage's parameters for the optimizer. `activation`: the shape of what a stage sends on for one
    micro-batch (a small GPT: rows, sequence, hidden). Returns the batch's loss on the last stage, 0 elsewhere."""
    p, r = dist.get_world_size(group), dist.get_rank(group)
    first, last = r == 0, r == p - 1
    prev = -1 if first else _global_rank(group, r - 1)  # -1: no neighbour on that side
    nxt = -1 if last else _global_rank(group, r + 1)
    micro = list(zip(x.chunk(micro_batches), y.chunk(micro_batches)))
    held: dict[int, tuple[torch.Tensor | None, torch.Tensor]] = {}  # micro-batch -> (its input, output or loss)
    sends: list[tuple[Any, torch.Tensor]] = []  # each send's work and tensor, kept alive until waited
    loss = 0.0
    for op, _chunk, i in schedule(kind, r, p, micro_batches):
        if op == "F":
            inp = None if first else _recv(activation, prev, group, FORWARD_TAG).requires_grad_()
            out = stage(micro[i][0] if first else inp)
            if last:
                out = loss_fn(out, micro[i][1]) / micro_batches
                loss += float(out.detach())
            else:
                sends.append(_send(out.detach().contiguous(), nxt, group, FORWARD_TAG))
            held[i] = (inp, out)
        else:
            inp, out = held.pop(i)  # dropping them frees the micro-batch's saved activations
            torch.autograd.backward(out, None if last else _recv(tuple(out.shape), nxt, group, BACKWARD_TAG))
            if inp is not None:
                sends.append(_send(inp.grad.contiguous(), prev, group, BACKWARD_TAG))
    for work, _t in sends:
        work.wait()
    return loss


def _global_rank(group: Any, r: int) -> int:
    return r if group is None else dist.get_global_rank(group, r)


def _send(t: torch.Tensor, dst: int, group: Any, tag: int) -> tuple[Any, torch.Tensor]:
    return wire.isend(t, dst, group, "pp", tag), t


def _recv(shape: tuple[int, ...], src: int, group: Any, tag: int) -> torch.Tensor:
    buf = torch.empty(shape)
    dist.recv(buf, src, group=group, tag=tag)  # blocks until the neighbour stage has sent: the bubble
    return buf


def stages_full_state(stage: nn.Module, blocks: list[int], group: Any = None) -> dict[str, torch.Tensor]:
    """Every stage's parameters, gathered over `group`, by the full model's names ("3.qkv.weight")."""
    mine = {f"{blocks[int(n.split('.', 1)[0])]}.{n.split('.', 1)[1]}": p.detach()
            for n, p in stage.named_parameters()}
    states: list[Any] = [None] * dist.get_world_size(group)
    dist.all_gather_object(states, mine, group=group)
    return {k: v for s in states for k, v in s.items()}
