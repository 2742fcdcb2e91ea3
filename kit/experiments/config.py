"""ExperimentConfig: one run = one strategy, one workload, one set of knobs.

Pure Python (no torch): the kernel builds and validates configs, workers rebuild them from
`to_dict()`. Every error names the bad value, the allowed range and a fix.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

from kit.experiments.choices import (  # the vocabulary, re-exported: modules read it from here
    COMPRESSIONS, DATASETS, DDP_BUCKETS, GRAD_ACCUM, MESH_DIMS, MESHES, MODEL_SIZES, MODEL_SPLIT, NEEDS_TWO_RANKS,
    ONE_PROCESS, PRECISIONS, PS_MODES, SCHEDULES, SHARDED, SHARDS_DATA, STAGED, STRATEGIES, VIRTUAL_LINK, WORKLOADS,
)
from kit.experiments.config_rules import INTERCONNECTS, check

__all__ = ["ExperimentConfig", "ExperimentConfigError", "STRATEGIES", "WORKLOADS", "PRECISIONS", "SCHEDULES",
           "MODEL_SIZES", "DATASETS", "COMPRESSIONS", "PS_MODES", "INTERCONNECTS", "ONE_PROCESS", "SHARDS_DATA",
           "STAGED", "SHARDED", "NEEDS_TWO_RANKS", "GRAD_ACCUM", "VIRTUAL_LINK", "DDP_BUCKETS", "MESH_DIMS", "MESHES"]


class ExperimentConfigError(ValueError):
    """A config value out of range or an impossible combination; the message says the fix."""


@dataclass(frozen=True)
class ExperimentConfig:
    """What to run and how. `batch_size` is per rank (per replica for dp, global for pipeline/mp)."""

    strategy: str = "ddp"
    workload: str = "mlp"
    world_size: int = 2
    batch_size: int = 32
    precision: str = "fp32"
    bucket_cap_mb: float = 25.0
    gradient_as_bucket_view: bool = False
    grad_accum_steps: int = 1
    find_unused_parameters: bool = False
    activation_checkpointing: bool = False
    micro_batches: int = 4
    schedule: str = "gpipe"
    virtual_stages: int = 1  # chunks per rank with schedule="interleaved_1f1b" (Megatron's virtual pipeline)
    steps: int = 20
    warmup_steps: int = 3
    interconnect: str | None = None
    link_alpha_us: float | None = None
    link_gbps: float | None = None
    model_size: str = "small"
    seed: int = 0
    instrument: bool = True
    dataset: str = "synthetic"
    # sharding / compression / parameter server
    reshard_after_forward: bool = True
    compression: str = "none"
    powersgd_rank: int = 1
    start_powerSGD_iter: int = 10
    ps_mode: str = "sync"
    straggler_ms: float = 0.0
    # tensor / sequence / context / expert parallel and meshes (config_parallel.py)
    mesh: dict[str, int] | None = None
    zigzag: bool = True
    experts: int = 4
    top_k: int = 2
    capacity_factor: float | None = None

    def __post_init__(self) -> None:
        check(self, ExperimentConfigError)  # every refusal: config_rules.py

    # -- derived ---------------------------------------------------------------------------
    @property
    def global_batch_size(self) -> int:
        """Samples per optimizer step over all ranks (the single-process reference batch)."""
        if self.strategy in MODEL_SPLIT:  # every rank reads the same batch (a mesh's dp splits it)
            return self.batch_size
        if self.strategy in STAGED + ("dp",):
            return self.batch_size * (self.world_size if self.strategy == "dp" else 1) \
                * self.grad_accum_steps
        if self.strategy == "param_server":  # rank 0 serves; the workers' batches make a step
            return self.batch_size * (self.world_size - 1)
        return self.batch_size * self.world_size * self.grad_accum_steps

    @property
    def link(self) -> tuple[float, float] | None:
        """(alpha_us, gbps) of the virtual interconnect, or None for the real one."""
        if self.interconnect is None:
            return None
        if self.interconnect == "custom":
            return float(self.link_alpha_us or 0.0), float(self.link_gbps or 0.0)
        return INTERCONNECTS[self.interconnect]

    # -- conversions -----------------------------------------------------------------------
    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> "ExperimentConfig":
        names = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(d) - names)
        if unknown:
            raise ExperimentConfigError(f"unknown config keys {unknown}; valid keys: {sorted(names)}")
        return cls(**d)

    def replace(self, **kw: Any) -> "ExperimentConfig":
        names = {f.name for f in dataclasses.fields(self)}
        unknown = sorted(set(kw) - names)
        if unknown:
            raise ExperimentConfigError(f"unknown config keys {unknown}; valid keys: {sorted(names)}")
        return dataclasses.replace(self, **kw)

    def label(self) -> str:
        """Short human label, e.g. 'ddp mlp bs32 fp32 bucket25MB'."""
        parts = [self.strategy, self.workload, f"bs{self.batch_size}", self.precision]
        if self.world_size != 2 and self.strategy != "single":
            parts.insert(1, f"x{self.world_size}")
        if self.strategy == "ddp":
            parts.append(f"bucket{self.bucket_cap_mb:g}MB")
            if self.gradient_as_bucket_view:
                parts.append("view")
            if self.compression != "none":
                parts.append(self.compression + (f"r{self.powersgd_rank}" if self.compression == "powersgd" else ""))
        if self.strategy == "fsdp":
            parts.append("zero3" if self.reshard_after_forward else "zero2-like")
        if self.strategy == "param_server":
            parts.append(self.ps_mode + (f" straggler{self.straggler_ms:g}ms" if self.straggler_ms else ""))
        if self.grad_accum_steps > 1:
            parts.append(f"accum{self.grad_accum_steps}")
        if self.strategy == "pipeline":
            parts.append(f"{self.schedule} m{self.micro_batches}"
                         + (f" v{self.virtual_stages}" if self.virtual_stages > 1 else ""))
        if self.mesh:
            parts.append("x".join(f"{k}{v}" for k, v in self.mesh.items()))
        if self.strategy == "cp":
            parts.append("zigzag" if self.zigzag else "contiguous")
        if self.strategy == "ep":
            parts.append(f"E{self.experts} top{self.top_k}" + (f" cf{self.capacity_factor:g}" if self.capacity_factor else ""))
        if self.activation_checkpointing:
            parts.append("ckpt")
        if self.model_size != "small":
            parts.append(self.model_size)
        if self.interconnect:
            parts.append(f"@{self.interconnect}")
        return " ".join(parts)
