"""Gradient compression on DDP: torch's fp16/bf16 and PowerSGD comm hooks, timed, counted,
and composed with the virtual interconnect.

Why one hook: DDP accepts exactly one comm hook, and the kit's link emulation is itself a comm
hook. So `compressed_hook` calls torch's compression hook on the bucket, then delays the
future it returns by the *compressed* bytes on the emulated link, then stamps completion for
the step clock. The compressed payload is computed from the bucket and the rule:

    none      S                      (fp32 bucket)
    fp16/bf16 S / 2                  (default_hooks.fp16_compress_hook casts, all-reduces, casts back)
    powersgd  4 * sum over matrices of r(n + m), other tensors as is   (powerSGD_hook.py; Vogels
              et al. 2019) after start_powerSGD_iter steps of plain all-reduce (the warm-up)

"Compression time" is the hook's synchronous part (fp16: cast + divide; PowerSGD: error
feedback, the first matmul, launching the all-reduces); PowerSGD's orthogonalisation and
decompression run later in the futures' callbacks and show up as communication time.
"""
from __future__ import annotations

import time
from typing import Any

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.algorithms.ddp_comm_hooks import default_hooks, powerSGD_hook as psgd
from torch.nn.parallel import DistributedDataParallel as DDP

from kit.experiments.config_rules import check_backend
from kit.experiments.strategies.ddp import DDPStrategy, make_link
from kit.experiments.measure.memory import tensor_bytes
from kit.experiments.measure.callbacks import then
from kit.experiments.theory.sharding_theory import powersgd_elements, wire_prediction
from kit.units import MIB

__all__ = ["CompressedDDP", "compressed_hook"]


class _CompressState:
    """What the hook needs (never the model: DDP's C++ reducer holds this state, see ddp.py)."""

    def __init__(self, mode: str, link: Any, clock: Any, psgd_state: Any):
        self.mode, self.link, self.clock, self.psgd = mode, link, clock, psgd_state
        self.full: dict[int, int] = {}      # bucket index -> uncompressed bytes
        self.payload: dict[int, int] = {}   # bucket index -> bytes actually all-reduced
        self.step_payload: list[int] = []   # per step (closed by the last bucket)
        self.step_compressed: list[bool] = []
        self.hook_ms: list[float] = []      # per step, the hooks' synchronous time
        self._acc_bytes, self._acc_ms = 0, 0.0


def compressed_hook(state, bucket):  # type: ignore[no-untyped-def]
    """DDP comm hook: compress (torch's hook) -> virtual link delay -> completion stamp.

    No annotations on purpose: DDP inspects them at registration (see ddp.timed_allreduce_hook).
    """
    t0 = time.perf_counter() * 1e3
    buf = bucket.buffer()
    full = buf.numel() * buf.element_size()
    compressed = True
    if state.mode == "fp16":
        fut, payload = default_hooks.fp16_compress_hook(None, bucket), full // 2
    elif state.mode == "bf16":
        fut, payload = default_hooks.bf16_compress_hook(None, bucket), full // 2
    else:
        # Before start_powerSGD_iter the hook all-reduces the bucket uncompressed (warm-up).
        compressed = state.psgd.iter >= state.psgd.start_powerSGD_iter
        payload = full
        if compressed:
            el = powersgd_elements([tuple(g.shape) for g in bucket.gradients()],
                                   state.psgd.matrix_approximation_rank, state.psgd.min_compression_rate)
            payload = el["numel_after"] * buf.element_size()
        fut = psgd.powerSGD_hook(state.psgd, bucket)
    state.hook_ms_now = time.perf_counter() * 1e3 - t0
    state._acc_ms += state.hook_ms_now
    state._acc_bytes += payload
    state.full[bucket.index()], state.payload[bucket.index()] = full, payload
    if bucket.is_last():  # bucket 0 goes last: one optimizer step's worth is complete
        state.step_payload.append(state._acc_bytes)
        state.step_compressed.append(compressed)
        state.hook_ms.append(state._acc_ms)
        state._acc_bytes, state._acc_ms = 0, 0.0
    if state.link:
        fut = state.link.delay(fut, payload)  # the link carries the compressed bytes
    clock = state.clock

    def done(f: torch.futures.Future) -> torch.Tensor:
        if clock.enabled:
            clock.comm_interval(t0, time.perf_counter() * 1e3)
        v = f.value()  # torch's hooks already divided by world size
        return v[0] if isinstance(v, list) else v

    return then(fut, done)  # released before the run returns (measure/callbacks.py)


class CompressedDDP(DDPStrategy):
    """DDP whose gradient buckets travel compressed (compression = fp16 | bf16 | powersgd)."""

    def wrap(self, model: nn.Module) -> nn.Module:
        check_backend(self.cfg, dist.get_backend())  # bf16 needs NCCL: refuse with the reason
        self.buckets: dict[int, int] = {}
        self.world_size = dist.get_world_size()
        self.link = make_link(self.cfg, self.world_size, self.device)  # as DDPStrategy builds it
        dev = [self.device.index] if self.device.type == "cuda" else None
        ddp = DDP(model, device_ids=dev, bucket_cap_mb=self.cfg.bucket_cap_mb,
                  gradient_as_bucket_view=self.cfg.gradient_as_bucket_view,
                  find_unused_parameters=self.cfg.find_unused_parameters)
        ps = None
        if self.cfg.compression == "powersgd":
            # Error feedback and warm start on (torch's defaults): the error is added back next
            # step, which is what keeps low-rank training converging (Vogels et al. 2019, Sec. 3).
            ps = psgd.PowerSGDState(None, matrix_approximation_rank=self.cfg.powersgd_rank,
                                    start_powerSGD_iter=self.cfg.start_powerSGD_iter,
                                    random_seed=self.cfg.seed)
        self.cstate = _CompressState(self.cfg.compression, self.link, self.clock, ps)
        self.buckets = self.cstate.payload  # runner/records read compressed bucket sizes here
        ddp.register_comm_hook(self.cstate, compressed_hook)
        self.notes.append(f"compression={self.cfg.compression}: torch's DDP comm hook; bytes per "
                          "step are the compressed payload" + (
                              f" (PowerSGD rank {self.cfg.powersgd_rank} after "
                              f"{self.cfg.start_powerSGD_iter} uncompressed warm-up steps)"
                              if ps else ""))
        return ddp

    def extra_grad_bytes(self) -> int:
        """DDP's flat bucket buffers (uncompressed) beside .grad, as in DDPStrategy."""
        return 0 if self.cfg.gradient_as_bucket_view else sum(self.cstate.full.values())

    def adjust_memory(self, memory: dict[str, Any]) -> None:
        ps = self.cstate.psgd
        if ps is not None:
            # PowerSGD keeps one more gradient-sized tensor (error feedback) and P, Q (warm start).
            memory["compression_state_mib"] = tensor_bytes(
                [*ps.error_dict.values(), *ps.p_memory_dict.values(), *ps.q_memory_dict.values()]) / MIB

    def comm_report(self) -> dict[str, Any]:
        st = self.cstate
        full = sum(st.full.values())
        last = st.step_payload[-1] if st.step_payload else full
        out = wire_prediction([("all_reduce", last)], self.world_size)
        out.update({
            "compression": self.cfg.compression, "uncompressed_bytes_per_step": full,
            "payload_bytes_per_step": last, "compression_ratio": full / last if last else None,
            "payload_bytes_by_step": list(st.step_payload),
            "compressed_by_step": list(st.step_compressed),
            "hook_sync_ms_by_step": [round(x, 4) for x in st.hook_ms],
            "note": "payload computed from bucket sizes and the compression rule (fp16/bf16: S/2; "
                    "PowerSGD: r(n+m) per matrix, vectors as is); hook_sync_ms = the hook's "
                    "synchronous part (compression + launch)"})
        if st.psgd is not None:
            rate, before, after = st.psgd.compression_stats()  # torch's own count, cumulative
            out["torch_compression_stats"] = {"compress_rate": rate, "numel_before": before,
                                              "numel_after": after}
        return out
