"""Memory: parameters, gradients, optimizer state and activations, measured and predicted.

- params/grads/optimizer: bytes of the tensors themselves (exact, any device).
- activations: `torch.autograd.graph.saved_tensors_hooks` sees every tensor autograd saves
  for backward during forward; we sum the bytes of each distinct storage once, leaving out
  parameters (they are counted as params). This is exact for what backward keeps alive.
- peak: the CUDA caching allocator's `max_memory_allocated` on GPU, reset at the start of each
  run (`reset_peak`): the ranks are persistent, and an unreset peak is the process's lifetime
  maximum, i.e. the largest run so far. None on CPU, where the process RSS mixes in the
  interpreter and torch's own libraries and would mislead.
"""
from __future__ import annotations

from contextlib import contextmanager
from typing import Any, Iterable, Iterator

import torch

from kit.experiments.theory.parallel_memory import state_mib
from kit.units import MIB

__all__ = ["reset_peak", "tensor_bytes", "optimizer_bytes", "ActivationMeter", "ShardAwareMeter", "local_bytes",
           "sharded_memory", "predict_memory",
           "measure_memory", "MEMORY_KINDS", "beside_formula"]



def tensor_bytes(tensors: Iterable[torch.Tensor | None]) -> int:
    return sum(t.numel() * t.element_size() for t in tensors if t is not None)


def optimizer_bytes(opt: torch.optim.Optimizer | None) -> int:
    if opt is None:
        return 0
    return sum(tensor_bytes(v for v in st.values() if isinstance(v, torch.Tensor)) for st in opt.state.values())


class ActivationMeter:
    """Counts bytes saved for backward inside `with meter.record():` (distinct storages, params excluded)."""

    def __init__(self, params: Iterable[torch.Tensor] = ()):
        self.param_ptrs = {p.untyped_storage().data_ptr() for p in params}
        self.seen: set[int] = set()
        self.bytes = 0

    def _pack(self, t: torch.Tensor) -> torch.Tensor:
        if t.layout == torch.strided and t.device.type != "meta":
            st = t.untyped_storage()
            ptr = st.data_ptr()
            if ptr not in self.param_ptrs and ptr not in self.seen:
                self.seen.add(ptr)
                self.bytes += st.nbytes()
        return t  # keep the tensor itself: measuring must not change what is stored

    @contextmanager
    def record(self) -> Iterator["ActivationMeter"]:
        self.seen, self.bytes = set(), 0
        with torch.autograd.graph.saved_tensors_hooks(self._pack, lambda t: t):
            yield self


class ShardAwareMeter(ActivationMeter):
    """Activation bytes without the gathered (unsharded) parameters autograd saves.

    FSDP swaps a module's parameters for freshly gathered ones during its forward, so the
    parameter storages change every step; we skip whatever storage is a registered parameter
    at the moment the tensor is saved."""

    def __init__(self, model: torch.nn.Module):
        super().__init__(())
        self.model = model

    def _pack(self, t: torch.Tensor) -> torch.Tensor:
        if t.layout == torch.strided and not hasattr(t, "to_local"):
            live = {q.untyped_storage().data_ptr() for q in self.model.parameters()
                    if not hasattr(q, "to_local")}
            if t.untyped_storage().data_ptr() in live:
                return t
        return super()._pack(t)


def local_bytes(t: torch.Tensor | None) -> int:
    """Bytes this rank really stores for `t`: a DTensor's local shard, else the tensor itself."""
    if t is None:
        return 0
    local = t.to_local() if hasattr(t, "to_local") else t
    return local.numel() * local.element_size()


def sharded_memory(memory: dict[str, Any], params: list[torch.Tensor], opt: torch.optim.Optimizer) -> None:
    """Parameters, gradients and optimizer state as this rank stores them (a DTensor's numel is the
    whole tensor's: count the local shards)."""
    memory["params_mib"] = sum(local_bytes(p) for p in params) / MIB
    memory["grads_mib"] = sum(local_bytes(p.grad) for p in params) / MIB
    memory["optimizer_mib"] = sum(local_bytes(v) for st in opt.state.values() for v in st.values()
                                  if isinstance(v, torch.Tensor)) / MIB


def predict_memory(n_params: int, n_tensors: int, activations_mib: float | None = None) -> dict[str, Any]:
    """The textbook formula, held whole (theory/parallel_memory.state_mib): params 4P, grads 4P, Adam's
    two fp32 states 8P plus its fp32 `step`, 4 bytes per parameter tensor.

    Under autocast the parameters stay fp32 (they are the only copy: autocast casts per op and keeps
    no separate master copy) and so do their grads, so b stays 4;
    the 16-bytes-per-parameter ZeRO figure (Rajbhandari et al., arXiv:1910.02054) holds fp32 Adam too.
    """
    state = state_mib(n_params, n_tensors)
    return {"params_mib": state["params_mib"], "grads_mib": state["grads_mib"],
            "optimizer_mib": state["optimizer_mib"], "activations_mib": activations_mib}


def reset_peak(device_type: str) -> bool:
    """Start a fresh peak for this run; True when there is a peak to reset (CUDA)."""
    if device_type != "cuda":
        return False
    torch.cuda.reset_peak_memory_stats()
    return True


def measure_memory(rank: int, params: list[torch.Tensor], opt: torch.optim.Optimizer | None,
                   activation_bytes: int, device_type: str, extra_grads: Iterable[torch.Tensor] = (),
                   predicted_activations_mib: float | None = None) -> dict[str, Any]:
    """One `memory` row of the record for this rank."""
    grads = [p.grad for p in params] + list(extra_grads)
    peak = torch.cuda.max_memory_allocated() / MIB if device_type == "cuda" else None
    n = sum(p.numel() for p in params)
    return {"rank": rank, "params_mib": tensor_bytes(params) / MIB, "grads_mib": tensor_bytes(grads) / MIB,
            "optimizer_mib": optimizer_bytes(opt) / MIB, "activations_mib": activation_bytes / MIB,
            "peak_mib": peak, "predicted": predict_memory(n, len(params), activations_mib=predicted_activations_mib)}


MEMORY_KINDS = ("params_mib", "grads_mib", "optimizer_mib", "activations_mib")


def beside_formula(memory: dict[str, Any], predicted: dict[str, Any]) -> None:
    """Put a strategy's formula into a measured `memory` row: the plot's 'predicted' bars, and
    per kind measured, predicted, their ratio and the formula (`by_kind`)."""
    memory["predicted"] = {k: predicted[k] for k in MEMORY_KINDS}
    formulas = predicted.get("formula", {})
    memory["by_kind"] = {
        k: {"measured_mib": memory[k], "predicted_mib": predicted[k],
            "measured_over_predicted": memory[k] / predicted[k] if predicted[k] else None,
            "formula": formulas.get(k.removesuffix("_mib"), "")}
        for k in MEMORY_KINDS}
