"""Pipeline schedules as lists of operations, and a simulation that checks them (pure Python).

An operation is ("F" or "B", chunk, micro-batch). With p ranks and v virtual stages per rank
(chunks) the model is cut into p*v stages; chunk c of rank r is stage c*p + r (Megatron-LM's
interleaving, Narayanan et al., SC 2021, arXiv:2104.04473). Stage s sends its forward output to
stage s+1 (rank (r+1) % p) and its input's gradient to stage s-1 (rank (r-1) % p).

- gpipe: every forward, then every backward (Huang et al. 2018, arXiv:1811.06965).
- 1f1b: p-r-1 warm-up forwards, then one forward one backward, then drain (PipeDream-Flush).
- interleaved_1f1b: Megatron-LM's interleaved 1F1B (megatron/core/pipeline_parallel/schedules.py,
  forward_backward_pipelining_with_interleaving). Virtual micro-batch k (of m*v) runs chunk
  (k % (p v)) // p (backward: v-1 minus that) on micro-batch (k // (p v)) p + k % p: groups of p
  micro-batches go through chunk 0, then chunk 1, ... Warm-up: (p-r-1)*2 + (v-1)*p forwards
  (all m*v when m == p), then 1F1B, then drain. Megatron requires m to be a multiple of p.
  With v = 1 it is plain 1f1b.

`simulate` runs the ranks' lists against each other the way the strategy does (a send never
blocks: isend; a receive blocks until its message was sent: recv; messages on one (sender,
receiver, tag) channel are matched in the order sent, as gloo and NCCL do) and raises if a receive
could match the wrong message or if no rank can move (deadlock). With every chunk op costing
the same it also gives the schedule's bubble, to hold beside (p-1)/(v m + p-1).
"""
from __future__ import annotations

from typing import Any

__all__ = ["Op", "schedule", "simulate", "ScheduleError", "FORWARD_TAG", "BACKWARD_TAG"]

Op = tuple[str, int, int]  # ("F" | "B", chunk, micro-batch)
FORWARD_TAG, BACKWARD_TAG = 0, 1  # activations and gradients on separate tags: with p = 2 the
# ring's wrap-around makes rank 1 send rank 0 both


class ScheduleError(RuntimeError):
    """A schedule that would deadlock or match a message to the wrong operation."""


def schedule(kind: str, rank: int, stages: int, micro_batches: int, virtual: int = 1) -> list[Op]:
    """The order of one rank's operations; `stages` is p (ranks), `virtual` is v (chunks per rank)."""
    p, m = stages, micro_batches
    if kind == "gpipe":
        return [("F", 0, i) for i in range(m)] + [("B", 0, i) for i in range(m)]
    if kind == "1f1b" or (kind == "interleaved_1f1b" and virtual == 1):
        warm = min(p - rank - 1, m)
        ops = [("F", 0, i) for i in range(warm)]
        for i in range(m - warm):
            ops += [("F", 0, warm + i), ("B", 0, i)]
        return ops + [("B", 0, i) for i in range(m - warm, m)]
    if kind == "interleaved_1f1b":
        return _interleaved(rank, p, m, virtual)
    raise ValueError(f"unknown schedule {kind!r}; choose 'gpipe', '1f1b' or 'interleaved_1f1b'")


def _interleaved(rank: int, p: int, m: int, v: int) -> list[Op]:
    if m % p:
        raise ValueError(f"interleaved 1F1B needs micro_batches ({m}) to be a multiple of the stages ({p})")
    total = m * v

    def op(kind: str, k: int) -> Op:
        chunk = (k % (p * v)) // p
        return (kind, chunk if kind == "F" else v - 1 - chunk, (k // (p * v)) * p + k % p)

    warm = total if m == p else min((p - rank - 1) * 2 + (v - 1) * p, total)
    ops = [op("F", k) for k in range(warm)]
    for k in range(total - warm):  # steady state: forward k + warm, backward k
        ops += [op("F", k + warm), op("B", k)]
    return ops + [op("B", k) for k in range(total - warm, total)]


def _messages(op: Op, rank: int, p: int, v: int) -> tuple[Any, Any]:
    """(the message this op receives or None, the message it sends or None); a message is
    ((src, dst, tag), payload id)."""
    kind, c, i = op
    s, n = c * p + rank, p * v
    if kind == "F":
        got = None if s == 0 else (((rank - 1) % p, rank, FORWARD_TAG), ("act", s - 1, i))
        sent = None if s == n - 1 else ((rank, (rank + 1) % p, FORWARD_TAG), ("act", s, i))
    else:
        got = None if s == n - 1 else (((rank + 1) % p, rank, BACKWARD_TAG), ("grad", s + 1, i))
        sent = None if s == 0 else ((rank, (rank - 1) % p, BACKWARD_TAG), ("grad", s, i))
    return got, sent


def simulate(kind: str, stages: int, micro_batches: int, virtual: int = 1, backward_cost: float = 2.0,
             plans: list[list[Op]] | None = None) -> dict[str, Any]:
    """Run every rank's schedule (or the given `plans`, one list per rank) against the others.
    Each chunk op costs 1/v (forward) or backward_cost/v; messages are free. Returns the span,
    each rank's busy time and the bubble 1 - sum busy / (p span); raises ScheduleError on a
    deadlock or a mismatched message."""
    p, v = stages, virtual
    plans = plans or [schedule(kind, r, p, micro_batches, v) for r in range(p)]
    for r, ops in enumerate(plans):
        want = {(k, c, i) for k in "FB" for c in range(v) for i in range(micro_batches)}
        if sorted(ops) != sorted(want):
            raise ScheduleError(f"rank {r} does not run every (op, chunk, micro-batch) exactly once")
    queues: dict[Any, list[tuple[Any, float]]] = {}  # channel -> [(payload, time sent)] in send order
    at, clock, busy = [0] * p, [0.0] * p, [0.0] * p
    while any(at[r] < len(plans[r]) for r in range(p)):
        moved = False
        for r in range(p):
            while at[r] < len(plans[r]):
                op = plans[r][at[r]]
                got, sent = _messages(op, r, p, v)
                ready = clock[r]
                if got is not None:
                    q = queues.get(got[0], [])
                    if not q:
                        break  # blocked in recv until the sender gets there
                    payload, t_sent = q.pop(0)
                    if payload != got[1]:
                        raise ScheduleError(f"rank {r} {op} receives {payload} on channel {got[0]}, "
                                            f"expected {got[1]}: sends and receives out of order")
                    ready = max(ready, t_sent)
                cost = (1.0 if op[0] == "F" else backward_cost) / v
                clock[r] = ready + cost
                busy[r] += cost
                if sent is not None:
                    queues.setdefault(sent[0], []).append((sent[1], clock[r]))
                at[r] += 1
                moved = True
        if not moved:
            stuck = {r: plans[r][at[r]] for r in range(p) if at[r] < len(plans[r])}
            raise ScheduleError(f"deadlock: every unfinished rank waits in recv: {stuck}")
    span = max(clock)
    return {"span": span, "busy": busy, "bubble": 1 - sum(busy) / (p * span)}
