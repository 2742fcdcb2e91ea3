"""The pipeline bubble on a workload built to show it: balanced stages, compute-bound micro-batches.

GPipe's bubble (p-1)/(m+p-1) (Huang et al. 2018, arXiv:1811.06965) assumes equal stages and free
communication. The kit's mlp and gpt cut into uneven stages, and their micro-batches shrink as m
grows (the batch is fixed), so per-micro-batch overhead grows with m and the measured bubble can
rise with m. Here every stage is the same stack of square Linear layers and every micro-batch has
the same rows, so each one costs the same compute whatever m is.

The order is the pipeline strategy's own (theory/pipeline_schedule.py): 1F1B with v = 1, and with
v > 1 virtual stages per rank Megatron-LM's interleaved 1F1B (Narayanan et al., SC 2021,
arXiv:2104.04473): chunk c of rank r is stage c*p + r of p*v, the pipe fills in p-1 chunk-slots
of 1/v the size, bubble (p-1)/(v m + p-1). Like Megatron it needs m to be a multiple of p.

Measured two ways, on `time.perf_counter` (one host: CLOCK_MONOTONIC is shared by processes):
`measured` as the run loop measures it (theory/bubble.py), 1 - sum of each rank's compute time /
(p x the global span): every moment a rank is not computing, including per-op overhead (send,
Python, being descheduled on a busy machine); and `waiting`, the time ranks sit in a blocking
recv (plus before their first and after their last op): the schedule's bubble plus each
message's transfer. Beside them `descheduled`: the share of the ranks' time they were runnable
but not running (the kernel's schedstat run_delay), i.e. other processes held the cores; a rank
descheduled while its neighbour waits for its message adds to both bubbles. `p2p_overhead`
measures what one message and one op cost on their own.
"""
from __future__ import annotations

import statistics
import time
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from kit.experiments.measure.group_device import group_device
from kit.experiments.theory.bubble import predicted_bubble
from kit.experiments.theory.pipeline_schedule import BACKWARD_TAG, FORWARD_TAG, schedule

__all__ = ["pipeline_bubble", "p2p_overhead"]


def _refuse_nccl(name: str) -> None:
    """These benches time CPU layers between gloo sends (one thread per rank): on NCCL ranks their CPU
    tensors cannot be sent, so say so before torch's "No backend type associated with device type cpu"."""
    if dist.is_initialized() and group_device().type == "cuda":  # "nccl" or "cuda:nccl": one rule, group_device's
        raise RuntimeError(f"{name} measures a pipeline of CPU layers on CPU ranks (gloo); these ranks run NCCL "
                           "on GPUs. Run it on CPU ranks (%%distributed --cpus 2, or world_size=2 with device='cpu'); "
                           "strategy='pipeline' runs a pipeline on GPUs.")


def _chunks(p: int, v: int, layers: int, width: int, seed: int) -> list[nn.Sequential]:
    """This rank's v chunks, each `layers` square Linear+Tanh layers (the same on every rank)."""
    torch.manual_seed(seed)
    every = [nn.Sequential(*[m for _ in range(layers) for m in (nn.Linear(width, width), nn.Tanh())])
             for _ in range(p * v)]
    r = dist.get_rank()
    return [every[c * p + r] for c in range(v)]


class _Sleep(torch.autograd.Function):
    """Emulated compute: forward sleeps `ms`, backward twice that (a Linear's backward is two
    matmuls), passing the tensor through. A sleeping rank needs no CPU, so other processes on
    the machine cannot stretch it: what is left is the schedule and the real messages."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, ms: float) -> torch.Tensor:
        ctx.ms = ms
        time.sleep(ms / 1e3)
        return x.clone()

    @staticmethod
    def backward(ctx: Any, g: torch.Tensor) -> tuple[torch.Tensor, None]:
        time.sleep(2 * ctx.ms / 1e3)
        return g, None


class _Emulated(nn.Module):
    def __init__(self, ms: float):
        super().__init__()
        self.ms = ms

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return _Sleep.apply(x, self.ms)


def _run_delay_ms() -> float:
    """ms this thread has spent runnable but not running (waiting for a CPU), from the kernel's
    schedstat (Linux; 0 elsewhere): the time other processes took this rank's core."""
    try:
        with open("/proc/thread-self/schedstat") as f:
            return int(f.read().split()[1]) / 1e6
    except (OSError, IndexError, ValueError):
        return 0.0


def _step(chunks: list[nn.Sequential], m: int, rows: int, width: int) -> dict[str, float]:
    """One step in the strategy's order; compute ms, ms waiting in recv, first compute start and
    last compute end (ms), the median forward and backward chunk op (ms), and ms descheduled."""
    p, r, v = dist.get_world_size(), dist.get_rank(), len(chunks)
    delay0 = _run_delay_ms()
    n = p * v
    prev, nxt = (r - 1) % p, (r + 1) % p
    t: dict[str, Any] = {"busy": 0.0, "first": float("inf"), "last": 0.0, "waited": 0.0, "F": [], "B": []}
    held: dict[tuple[int, int], tuple[torch.Tensor, torch.Tensor]] = {}
    sends: list[Any] = []

    def compute(kind: str, fn: Any) -> Any:
        t0 = time.perf_counter()
        out = fn()
        t1 = time.perf_counter()
        t["busy"] += t1 - t0
        t["first"], t["last"] = min(t["first"], t0), max(t["last"], t1)
        t[kind].append(t1 - t0)
        return out

    def recv(buf: torch.Tensor, src: int, tag: int) -> None:
        t0 = time.perf_counter()
        dist.recv(buf, src, tag=tag)
        if t["first"] < float("inf"):  # waits before this rank's first op are the previous step's skew
            t["waited"] += time.perf_counter() - t0

    for op, c, i in schedule("interleaved_1f1b" if v > 1 else "1f1b", r, p, m, v):
        s = c * p + r
        if op == "F":
            x = torch.randn(rows, width) if s == 0 else torch.empty(rows, width)
            if s:
                recv(x, prev, FORWARD_TAG)
            x.requires_grad_()
            out = compute("F", lambda: chunks[c](x))
            if s == n - 1:
                out = compute("F", lambda: (out ** 2).mean() / m)
            else:
                sends.append(dist.isend(out.detach().contiguous(), nxt, tag=FORWARD_TAG))
            held[c, i] = (x, out)
        else:
            x, out = held.pop((c, i))
            if s == n - 1:
                compute("B", lambda: out.backward())
            else:
                g = torch.empty_like(out)
                recv(g, nxt, BACKWARD_TAG)
                compute("B", lambda: out.backward(g))
            if s:
                sends.append(dist.isend(x.grad.contiguous(), prev, tag=BACKWARD_TAG))
    for w in sends:
        w.wait()
    return {"busy": t["busy"] * 1e3, "waited": t["waited"] * 1e3, "first": t["first"] * 1e3,
            "last": t["last"] * 1e3, "fwd_op": statistics.median(t["F"]) * 1e3,
            "bwd_op": statistics.median(t["B"]) * 1e3, "descheduled": _run_delay_ms() - delay0}


def pipeline_bubble(micro_batches: int, virtual: int = 1, steps: int = 3, rows: int = 256, width: int = 512,
                    layers_per_rank: int = 8, threads: int = 1, emulate_ms: float | None = None) -> dict[str, Any]:
    """Measured bubble of a balanced, compute-bound pipeline over every rank (all ranks call this).

    Each rank holds `layers_per_rank` layers in `virtual` chunks; each micro-batch has `rows` rows.
    `emulate_ms`: instead of the layers, each rank's stage *sleeps* that long per micro-batch
    forward (emulate_ms / v per chunk, twice that backward), messages unchanged: the result is
    labelled `emulated` and shows the schedule without CPU contention.
    Returns the formula, the bubble of every timed step and their median (fractions, 0..1), and
    the median forward and backward chunk op (ms) on this rank."""
    _refuse_nccl("pipeline_bubble")
    p = dist.get_world_size()
    if layers_per_rank % virtual:
        raise ValueError(f"layers_per_rank={layers_per_rank} does not split into virtual={virtual} chunks")
    if virtual > 1 and micro_batches % p:
        raise ValueError(f"interleaved 1F1B needs micro_batches ({micro_batches}) to be a multiple of the "
                         f"{p} ranks (as Megatron-LM requires); try micro_batches={p * max(1, micro_batches // p)}")
    before = torch.get_num_threads()
    torch.set_num_threads(threads)  # one thread per rank: compute-bound and not fighting the other rank
    try:
        chunks = _chunks(p, virtual, layers_per_rank // virtual, width, seed=0) if emulate_ms is None \
            else [nn.Sequential(_Emulated(emulate_ms / virtual)) for _ in range(virtual)]
        bubbles, waits, ops, spans, desched = [], [], [], [], []
        for s in range(steps + 1):  # +1: the first step pays allocation
            got = _step(chunks, micro_batches, rows, width)
            every = [torch.zeros(5, dtype=torch.float64) for _ in range(p)]
            dist.all_gather(every, torch.tensor([got["busy"], got["waited"], got["first"], got["last"],
                                                 got["descheduled"]], dtype=torch.float64))
            span = max(float(t[3]) for t in every) - min(float(t[2]) for t in every)
            if s:
                spans.append(span)
                bubbles.append(1 - sum(float(t[0]) for t in every) / (p * span))
                # the first rank idles before its first op and the last after its last: count them too
                edges = sum(float(t[2]) - min(float(u[2]) for u in every) + max(float(u[3]) for u in every)
                            - float(t[3]) for t in every)
                waits.append((sum(float(t[1]) for t in every) + edges) / (p * span))
                ops.append((got["fwd_op"], got["bwd_op"]))
                desched.append(sum(float(t[4]) for t in every) / (p * span))
    finally:
        torch.set_num_threads(before)
    return {"stages": p, "micro_batches": micro_batches, "virtual": virtual, "emulated": emulate_ms is not None,
            "formula": predicted_bubble(p, micro_batches, virtual),
            "measured": statistics.median(bubbles), "measured_per_step": bubbles,
            # descheduling only adds time: the shortest step is the one the machine disturbed least
            "quietest": bubbles[spans.index(min(spans))], "span_ms_per_step": spans,
            "waiting": statistics.median(waits), "waiting_per_step": waits,
            "fwd_op_ms": statistics.median(f for f, _ in ops), "bwd_op_ms": statistics.median(b for _, b in ops),
            # share of the ranks' time runnable but not running: other processes held the cores
            "descheduled": statistics.median(desched)}


def p2p_overhead(rows: int = 256, width: int = 512, layers: int = 4, reps: int = 7,
                 threads: int = 1) -> dict[str, float]:
    """What the bubble's overhead is made of, on 2 ranks (all ranks call this; ranks > 1 idle):
    one chunk op (forward + backward of `layers` layers) on rank 0 alone and on both ranks at
    once (is the second core free?), the cost of the isend call, and a recv of a message that was
    sent 20 ms earlier (gloo moves the bytes only once the receiver posts its recv). Medians, ms."""
    _refuse_nccl("p2p_overhead")
    r = dist.get_rank()
    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        torch.manual_seed(0)
        net = nn.Sequential(*[m for _ in range(layers) for m in (nn.Linear(width, width), nn.Tanh())])
        x = torch.randn(rows, width, requires_grad=True)

        def op() -> float:
            t0 = time.perf_counter()
            net(x).sum().backward()
            return (time.perf_counter() - t0) * 1e3
        op()
        alone, both, isend_ms, recv_ms = [], [], [], []
        buf = torch.empty(rows, width)
        for _ in range(reps):
            dist.barrier()
            if r == 0:
                alone.append(op())
            dist.barrier()
            both.append(op())
            dist.barrier()
            if r == 0:
                msg = torch.randn(rows, width)
                t0 = time.perf_counter()
                w = dist.isend(msg, 1)
                isend_ms.append((time.perf_counter() - t0) * 1e3)
                w.wait()
            elif r == 1:
                time.sleep(0.02)
                t0 = time.perf_counter()
                dist.recv(buf, 0)
                recv_ms.append((time.perf_counter() - t0) * 1e3)
        med = statistics.median
        mine = [med(alone) if alone else 0.0, med(both), med(isend_ms) if isend_ms else 0.0,
                med(recv_ms) if recv_ms else 0.0]
        every = [torch.zeros(4, dtype=torch.float64) for _ in range(dist.get_world_size())]
        dist.all_gather(every, torch.tensor(mine, dtype=torch.float64))
    finally:
        torch.set_num_threads(before)
    return {"op_alone_ms": float(every[0][0]), "op_both_ms": float(every[0][1]),
            "isend_call_ms": float(every[0][2]), "recv_ready_ms": float(every[1][3]),
            "message_kib": rows * width * 4 / 1024}
