"""ExperimentConfig: one run = one strategy, one workload, one set of knobs.

Pure Python (no torch): the kernel builds and validates configs, workers rebuild them from
`to_dict()`. Every error names the bad value, the allowed range and a fix.
"""
from __future__ import annotations

import dataclasses
import inspect
from dataclasses import dataclass
from typing import Any, Callable

from kit.experiments.choices import (  # the vocabulary, re-exported for `from kit.experiments.config import ...`; kit reads choices
    COMPRESSIONS, DATASETS, DDP_BUCKETS, DEFAULT_STRATEGY, GLOBAL_BATCH, GRAD_ACCUM, HAND_WRITTEN, KNOB_OWNERS,
    MESH_DIMS, MESHES, MODEL_SIZES, MODEL_SPLIT, NEEDS_TWO_RANKS, ONE_PROCESS, PRECISIONS, PS_MODES, RANK0_SERVES,
    SCHEDULES, SHARDED, SHARDS_DATA, STAGED, STRATEGIES, VIRTUAL_LINK, WORKLOADS,
)
from kit.experiments.config_rules import INTERCONNECTS, check
from kit.keywords import closest

__all__ = ["ExperimentConfig", "ExperimentConfigError", "STRATEGIES", "WORKLOADS", "PRECISIONS", "SCHEDULES",
           "MODEL_SIZES", "DATASETS", "COMPRESSIONS", "PS_MODES", "INTERCONNECTS", "ONE_PROCESS", "SHARDS_DATA",
           "STAGED", "SHARDED", "NEEDS_TWO_RANKS", "GRAD_ACCUM", "VIRTUAL_LINK", "DDP_BUCKETS", "MESH_DIMS", "MESHES",
           "MODEL_SPLIT", "HAND_WRITTEN", "GLOBAL_BATCH", "RANK0_SERVES", "KNOB_OWNERS"]


# What a label says for the knobs its strategy takes (KNOB_OWNERS), in this order. DDP's bucket size and
# bucket view are said with its comm hook, the knobs of torch DDP's own buckets; accelerate, which wraps DDP
# too, has never had them in its label, and a label stays what it was (saved runs are listed by it). The bucket
# size is in MiB, as torch's DDP reads `bucket_cap_mb` (times 1024 * 1024) and the plots' axes say it.
_LABEL_PARTS: tuple[tuple[str, Callable[[Any], str]], ...] = (
    ("compression", lambda c: f"bucket{c.bucket_cap_mb:g}MiB" + (" view" if c.gradient_as_bucket_view else "")
     + ("" if c.compression == "none" else " " + c.compression
        + (f"r{c.powersgd_rank}" if c.compression == "powersgd" else ""))),
    ("reshard_after_forward", lambda c: "zero3" if c.reshard_after_forward else "zero2-like"),
    ("ps_mode", lambda c: c.ps_mode + (f" straggler{c.straggler_ms:g}ms" if c.straggler_ms else "")),
    ("schedule", lambda c: f"{c.schedule} m{c.micro_batches}"
     + (f" v{c.virtual_stages}" if c.virtual_stages > 1 else "")),
    ("zigzag", lambda c: "zigzag" if c.zigzag else "contiguous"),
    ("experts", lambda c: f"E{c.experts} top{c.top_k}" + (f" cf{c.capacity_factor:g}" if c.capacity_factor else "")),
)


class ExperimentConfigError(ValueError):
    """A config value out of range or an impossible combination; the message says the fix."""


def _refuse_unknown(cls: type, keys: Any) -> None:
    """One message for a key the config does not have, however it came (the constructor, `replace`,
    `from_dict`): the closest valid key, then all of them (`bucket_mb=` would otherwise be Python's
    bare "unexpected keyword argument")."""
    names = [f.name for f in dataclasses.fields(cls)]
    unknown = sorted(set(keys) - set(names))
    if unknown:
        close = {k: m for k in unknown if (m := closest(k, names))}
        hint = "".join(f" (did you mean {close[k]!r} for {k!r}?)" for k in unknown if k in close)
        raise ExperimentConfigError(f"unknown config keys {unknown}{hint}; valid keys: {sorted(names)}")


@dataclass(frozen=True)
class ExperimentConfig:
    """What to run and how. `batch_size` is per rank (per replica for dp, global for pipeline/mp)."""

    strategy: str = DEFAULT_STRATEGY
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

    def __new__(cls, *args: Any, **kw: Any) -> "ExperimentConfig":
        _refuse_unknown(cls, kw)  # before the dataclass's __init__ raises a bare TypeError
        return super().__new__(cls)

    def __post_init__(self) -> None:
        try:
            check(self, ExperimentConfigError)  # every refusal: config_rules.py
        except ExperimentConfigError as refused:
            # The message names the value and the fix; the rules' own frames (config_rules.py) are left
            # out of the traceback, which showed four of them before it.
            raise refused.with_traceback(None) from None

    # -- derived ---------------------------------------------------------------------------
    @property
    def global_batch_size(self) -> int:
        """Samples per optimizer step over all ranks (the single-process reference batch)."""
        # GLOBAL_BATCH: every rank reads the one batch, or the stages pass it on (a mesh's dp splits it);
        # the others read batch_size each, but a serving rank 0 reads none. config_rules allows
        # grad_accum_steps > 1 only for GRAD_ACCUM, none of which is in those two groups.
        readers = 1 if self.strategy in GLOBAL_BATCH else \
            self.world_size - (1 if self.strategy in RANK0_SERVES else 0)
        return self.batch_size * readers * self.grad_accum_steps

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
        return cls(**d)

    def replace(self, **kw: Any) -> "ExperimentConfig":
        return dataclasses.replace(self, **kw)  # an unknown key: __new__ names the closest

    def label(self) -> str:
        """Short human label, e.g. 'ddp mlp bs32 fp32 bucket25MiB': the knobs this strategy takes
        (choices.KNOB_OWNERS) and those set away from their defaults."""
        parts = [self.strategy, self.workload, f"bs{self.batch_size}", self.precision]
        if self.world_size != 2 and self.strategy in KNOB_OWNERS["world_size"]:
            parts.insert(1, f"x{self.world_size}")
        parts += [part(self) for knob, part in _LABEL_PARTS if self.strategy in KNOB_OWNERS[knob]]
        if self.grad_accum_steps > 1:
            parts.append(f"accum{self.grad_accum_steps}")
        if self.mesh:
            parts.append("x".join(f"{k}{v}" for k, v in self.mesh.items()))
        if self.activation_checkpointing:
            parts.append("ckpt")
        if self.model_size != "small":
            parts.append(self.model_size)
        if self.interconnect:
            parts.append(f"@{self.interconnect}")
        if not self.instrument:
            parts.append("uninstrumented")  # its phases were not timed: say so wherever the run is named
        return " ".join(parts)


# inspect reads a class's own __new__ before its __init__, so help(ExperimentConfig), `ExperimentConfig?` and
# IPython's completion showed __new__'s (*args, **kw); they show the dataclass's fields and defaults instead
_fields = inspect.signature(ExperimentConfig.__init__)
ExperimentConfig.__signature__ = _fields.replace(  # type: ignore[attr-defined]
    parameters=list(_fields.parameters.values())[1:], return_annotation=inspect.Signature.empty)
