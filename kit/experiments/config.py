"""ExperimentConfig: one run = one strategy, one workload, one set of knobs.

Pure Python (no torch): the kernel builds and validates configs, workers rebuild them from
`to_dict()`. Every error names the bad value, the allowed range and a fix.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

from kit.experiments.theory.links import LINKS

__all__ = ["ExperimentConfig", "ExperimentConfigError", "STRATEGIES", "WORKLOADS", "INTERCONNECTS"]

STRATEGIES = ("single", "ddp", "naive_dp", "dp", "model_parallel", "pipeline", "zero1", "fsdp", "param_server",
              "accelerate")
WORKLOADS = ("mlp", "cnn", "gpt")
PRECISIONS = ("fp32", "fp16", "bf16")
SCHEDULES = ("gpipe", "1f1b")
MODEL_SIZES = ("tiny", "small", "base")
DATASETS = ("synthetic", "memmap")
# Preset links: (per-step latency alpha_us, peak per-direction GB/s), from links.LINKS, which
# also holds each link's fixed latency and message-size efficiency; sources in docs/hardware.md.
INTERCONNECTS: dict[str, tuple[float, float]] = {k: (v.hop_us, v.gbps) for k, v in LINKS.items()}


class ExperimentConfigError(ValueError):
    """A config value out of range or an impossible combination; the message says the fix."""


def _choice(name: str, value: Any, allowed: tuple[str, ...]) -> None:
    if value not in allowed:
        raise ExperimentConfigError(
            f"{name}={value!r} is not supported; choose one of {', '.join(map(repr, allowed))}")


def _at_least(name: str, value: Any, low: float, kind: type = int) -> None:
    ok = (int, float) if kind is float else (int,)
    if isinstance(value, bool) or not isinstance(value, ok):
        what = "a number" if kind is float else "an integer"
        raise ExperimentConfigError(f"{name}={value!r} must be {what} >= {low}")
    if value < low:
        raise ExperimentConfigError(f"{name}={value!r} is too small; it must be >= {low}")


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
    steps: int = 20
    warmup_steps: int = 3
    interconnect: str | None = None
    link_alpha_us: float | None = None
    link_gbps: float | None = None
    model_size: str = "small"
    seed: int = 0
    instrument: bool = True
    dataset: str = "synthetic"
    # sharding / compression (validated in beyond_config.py)
    reshard_after_forward: bool = True
    compression: str = "none"
    powersgd_rank: int = 1
    start_powerSGD_iter: int = 10
    ps_mode: str = "sync"
    straggler_ms: float = 0.0

    def __post_init__(self) -> None:
        _choice("strategy", self.strategy, STRATEGIES)
        _choice("workload", self.workload, WORKLOADS)
        _choice("precision", self.precision, PRECISIONS)
        _choice("schedule", self.schedule, SCHEDULES)
        _choice("model_size", self.model_size, MODEL_SIZES)
        _choice("dataset", self.dataset, DATASETS)
        from kit.experiments.beyond_config import check_beyond  # here: merges stay local
        check_beyond(self, ExperimentConfigError)
        for name in ("world_size", "batch_size", "grad_accum_steps", "micro_batches", "steps"):
            _at_least(name, getattr(self, name), 1)
        _at_least("warmup_steps", self.warmup_steps, 0)
        _at_least("seed", self.seed, 0)
        _at_least("bucket_cap_mb", self.bucket_cap_mb, 0.0, float)
        if self.bucket_cap_mb <= 0:
            raise ExperimentConfigError(f"bucket_cap_mb={self.bucket_cap_mb} must be > 0 "
                                        "(torch's default is 25; try 1, 5 or 25)")
        if self.strategy == "single" and self.world_size != 1:
            raise ExperimentConfigError(f"strategy='single' runs one process but world_size="
                                        f"{self.world_size}; set world_size=1")
        if self.strategy in ("ddp", "naive_dp", "dp", "model_parallel", "pipeline") \
                and self.world_size < 2:
            raise ExperimentConfigError(
                f"strategy={self.strategy!r} needs world_size >= 2 (got {self.world_size}); "
                "use strategy='single' for one process")
        if self.strategy == "pipeline" and self.batch_size % self.micro_batches:
            divs = [d for d in range(1, self.batch_size + 1) if self.batch_size % d == 0 and d > 1]
            some = divs[:2] + divs[-1:] if len(divs) > 2 else divs
            hint = ", ".join(map(str, some[:-1])) + (" or " if len(some) > 1 else "") + str(some[-1])
            raise ExperimentConfigError(
                f"micro_batches={self.micro_batches} does not divide batch_size={self.batch_size}; "
                f"choose a divisor such as {hint}")
        if self.strategy == "dp" and self.batch_size < self.world_size:
            raise ExperimentConfigError(
                f"dp scatters batch_size={self.batch_size} over {self.world_size} replicas; "
                f"use batch_size >= {self.world_size}")
        if self.grad_accum_steps > 1 and self.strategy not in ("single", "ddp", "naive_dp"):
            raise ExperimentConfigError(
                f"grad_accum_steps={self.grad_accum_steps} is implemented for single, ddp and "
                f"naive_dp, not {self.strategy!r}; set grad_accum_steps=1 (pipeline: use micro_batches)")
        if self.find_unused_parameters and self.strategy != "ddp":
            raise ExperimentConfigError("find_unused_parameters is a DDP knob; set it only with "
                                        f"strategy='ddp' (got {self.strategy!r})")
        if self.interconnect is not None:
            _choice("interconnect", self.interconnect, tuple(INTERCONNECTS) + ("custom",))
            if self.strategy not in ("ddp", "naive_dp"):
                raise ExperimentConfigError(
                    f"interconnect={self.interconnect!r} delays DDP gradient buckets; it applies to "
                    f"strategy 'ddp' or 'naive_dp', not {self.strategy!r}")
            if self.interconnect == "custom":
                if self.link_alpha_us is None or self.link_gbps is None:
                    raise ExperimentConfigError("interconnect='custom' needs link_alpha_us and "
                                                "link_gbps, e.g. link_alpha_us=20, link_gbps=12.5")
        if self.link_alpha_us is not None:
            _at_least("link_alpha_us", self.link_alpha_us, 0.0, float)
        if self.link_gbps is not None:
            _at_least("link_gbps", self.link_gbps, 0.0, float)
            if self.link_gbps <= 0:
                raise ExperimentConfigError(f"link_gbps={self.link_gbps} must be > 0 (GB/s, e.g. 12.5)")
        if (self.link_alpha_us is not None or self.link_gbps is not None) \
                and self.interconnect not in (None, "custom"):
            raise ExperimentConfigError(
                f"link_alpha_us/link_gbps only apply with interconnect='custom' "
                f"(got interconnect={self.interconnect!r}); drop them or set interconnect='custom'")
        if (self.link_alpha_us is not None or self.link_gbps is not None) and self.interconnect is None:
            raise ExperimentConfigError("link_alpha_us/link_gbps given without interconnect; "
                                        "set interconnect='custom'")
        if self.workload == "cnn" and self.strategy in ("model_parallel", "pipeline") \
                and self.world_size > 4:
            raise ExperimentConfigError(f"the cnn has 4 stages to split; world_size={self.world_size} "
                                        "is too many for model_parallel/pipeline (use <= 4)")

    # -- derived ---------------------------------------------------------------------------
    @property
    def global_batch_size(self) -> int:
        """Samples per optimizer step over all ranks (the single-process reference batch)."""
        if self.strategy in ("model_parallel", "pipeline", "dp"):
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
            parts.append(f"{self.schedule} m{self.micro_batches}")
        if self.activation_checkpointing:
            parts.append("ckpt")
        if self.model_size != "small":
            parts.append(self.model_size)
        if self.interconnect:
            parts.append(f"@{self.interconnect}")
        return " ".join(parts)
