"""Parameter server (Dean et al. 2012, Li et al. 2014): rank 0 holds the weights and the
optimizer; ranks 1..N-1 are workers that compute gradients, push them and pull weights.

Point-to-point with torch.distributed send/recv (the RPC framework would hide the bytes).
Protocol, per worker step: forward/backward on the weights it holds -> send [grad, loss,
version] to rank 0 -> receive [weights, version]. Every gradient gets exactly one reply, so
counts always match and nothing is left waiting.

- sync: per server step, rank 0 receives one gradient from *every* worker, averages them, takes
  one Adam step and sends the new weights back: the same update as single-process training on
  the workers' batches together (checked in the tests).
- async: rank 0 applies each gradient as soon as it arrives (receive from any source) and
  replies to that worker alone. Fast workers do not wait for slow ones, but their gradients
  were computed on weights that are `staleness` updates old (Recht et al. 2011, Dean et al. 2012).

`straggler_ms` slows rank 1 by that much per step. The server's ingress grows with the number
of workers, (N-1) * S per round, where a ring all-reduce sends 2(N-1)/N * S per rank.
"""
from __future__ import annotations

import time
from collections import Counter
from contextlib import nullcontext
from typing import Any, Callable

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.utils import parameters_to_vector, vector_to_parameters

from kit.experiments.strategies.common import make_optimizer
from kit.experiments.measure.memory import ActivationMeter
from kit.experiments.strategies.base import Strategy
from kit.experiments.theory.links import ring_factor

__all__ = ["ParamServer"]


class ParamServer(Strategy):
    """One class for both roles; `self.server` says which this rank plays."""

    def __init__(self, cfg: Any, model: nn.Module, loss_fn: Callable[..., torch.Tensor],
                 device: torch.device, clock: Any):
        if device.type != "cpu":
            raise RuntimeError("param_server runs on CPU ranks (gloo send/recv from any source)")
        self.cfg, self.device, self.clock, self.loss_fn = cfg, device, clock, loss_fn
        self.notes: list[str] = [f"param_server ({cfg.ps_mode}): rank 0 is the server; "
                                 f"{cfg.world_size - 1} worker(s) compute" +
                                 (f"; rank 1 is slowed by {cfg.straggler_ms:g} ms per step"
                                  if cfg.straggler_ms else "")]
        self.bucket_bytes: list[int] = []
        self.base = self.model = model.to(device)
        self.params = [p for p in model.parameters() if p.requires_grad]
        self.rank, self.world = dist.get_rank(), dist.get_world_size()
        self.server = self.rank == 0
        self.n = sum(p.numel() for p in self.params)
        for p in self.params:  # same starting weights everywhere (seeded, but make it a rule)
            dist.broadcast(p.data, src=0)
        self.opt = make_optimizer(self.params) if self.server else None
        self.scaler = None
        self.meter = ActivationMeter(self.params)
        clock.watch_grads(self.params)
        self.version = 0  # server: updates applied; worker: version of the weights it holds
        self.staleness: Counter[int] = Counter()
        self.bytes_in = self.bytes_out = 0
        self.t_start = time.perf_counter()
        self.loss_vs_time: list[tuple[float, float]] = []
        self.updates = 0
        self.update_times_s: list[float] = []

    # -- the worker ------------------------------------------------------------------------
    def _worker_step(self, x: torch.Tensor, y: torch.Tensor, probe: Callable[[], None] | None) -> float:
        with self.clock.phase("forward"), (self.meter.record() if probe else nullcontext()):
            loss = self.loss_fn(self.model(x), y)
        with self.clock.phase("backward"):
            loss.backward()
        if self.cfg.straggler_ms and self.rank == 1:
            with self.clock.phase("straggler delay", "idle"):
                time.sleep(self.cfg.straggler_ms / 1e3)
        if probe:
            probe()
        msg = torch.cat([parameters_to_vector([p.grad for p in self.params]),
                         torch.tensor([loss.item(), float(self.version)])])
        back = torch.empty(self.n + 1)
        with self.clock.phase("push grads + pull weights", "comm"):
            dist.send(msg, dst=0)
            dist.recv(back, src=0)
        self.bytes_out += msg.numel() * 4
        self.bytes_in += back.numel() * 4
        vector_to_parameters(back[:-1], self.params)
        self.version = int(back[-1].item())
        for p in self.params:
            p.grad = None
        return float(loss.item())

    # -- the server ------------------------------------------------------------------------
    def _apply(self, grad: torch.Tensor) -> None:
        offset = 0
        for p in self.params:  # unflatten into .grad (vector_to_parameters would write .data)
            p.grad = grad[offset:offset + p.numel()].view_as(p).clone()
            offset += p.numel()
        self.opt.step()
        self.version += 1
        self.updates += 1
        self.update_times_s.append(time.perf_counter() - self.t_start)

    def _reply(self, dst: int) -> None:
        out = torch.cat([parameters_to_vector(self.params).detach(), torch.tensor([float(self.version)])])
        dist.send(out, dst=dst)
        self.bytes_out += out.numel() * 4

    def _server_step(self, probe: Callable[[], None] | None) -> float:
        workers = list(range(1, self.world))
        buf = torch.empty(self.n + 2)
        losses = []
        if self.cfg.ps_mode == "sync":
            total = torch.zeros(self.n)
            with self.clock.phase("receive grads", "comm"):
                for src in workers:
                    dist.recv(buf, src=src)
                    self.bytes_in += buf.numel() * 4
                    total += buf[:-2]
                    losses.append(float(buf[-2]))
                    self.staleness[self.version - int(buf[-1])] += 1
            with self.clock.phase("optimizer"):
                self._apply(total / len(workers))  # mean of the workers' mean losses' gradients
            if probe:
                probe()
            with self.clock.phase("send weights", "comm"):
                for dst in workers:
                    self._reply(dst)
        else:
            # Async: one update per arriving gradient; N-1 arrivals make one "step" here so the
            # counts match the workers' steps over the run (a straggler's share goes to others).
            for _ in workers:
                with self.clock.phase("receive grads", "comm"):
                    src = dist.recv(buf)
                self.bytes_in += buf.numel() * 4
                losses.append(float(buf[-2]))
                self.staleness[self.version - int(buf[-1])] += 1
                with self.clock.phase("optimizer"):
                    self._apply(buf[:-2].clone())
                with self.clock.phase("send weights", "comm"):
                    self._reply(src)
            if probe:
                probe()
        for p in self.params:
            p.grad = None
        loss = sum(losses) / len(losses)
        self.loss_vs_time.append((time.perf_counter() - self.t_start, loss))
        return loss

    def train_step(self, x: torch.Tensor, y: torch.Tensor, probe: Callable[[], None] | None = None) -> float:
        if self.server:
            return self._server_step(probe)
        return self._worker_step(x.to(self.device), y.to(self.device), probe)

    def extra_grad_bytes(self) -> int:
        return 0

    def comm_report(self) -> dict[str, Any]:
        """Server's view (rank 0 is parts[0] in the record): bytes counted at send/recv."""
        s = 4 * self.n
        ts = self.update_times_s
        # Updates per second between the first and the last update (start-up excluded).
        ups = (len(ts) - 1) / (ts[-1] - ts[0]) if len(ts) > 1 and ts[-1] > ts[0] else 0.0
        rounds = max(1, len(self.loss_vs_time))
        w = self.world - 1
        return {
            "kind": "measured: bytes counted at the server's send/recv (payload incl. 1-2 tag floats)",
            "mode": self.cfg.ps_mode, "workers": w,
            "server_ingress_bytes_per_step": self.bytes_in / rounds,
            "server_egress_bytes_per_step": self.bytes_out / rounds,
            "payload_bytes_per_step": int((self.bytes_in + self.bytes_out) / rounds),
            "predicted": {"server_ingress_bytes_per_step": w * s,
                          "ring_all_reduce_bytes_per_rank": ring_factor("all_reduce", self.world) * s,
                          "formula": "server ingress (N-1)*S grows with workers; a ring sends 2(N-1)/N*S per rank"},
            "updates": self.updates, "updates_per_s": ups,
            "note": "every worker computes the same number of gradients (the run's step count): "
                    "async removes the per-round wait (fast workers run ahead, their updates land "
                    "earlier, the straggler's arrive stale) but the run still ends with the "
                    "straggler's last gradient",
            "staleness_histogram": {str(k): v for k, v in sorted(self.staleness.items())},
            "loss_vs_time_s": [[round(t, 4), round(v, 6)] for t, v in self.loss_vs_time],
        }
