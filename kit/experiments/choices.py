"""The config's vocabulary: what each knob may be, and which strategies share a behaviour.

Pure data, imports nothing: config.py re-exports every name (read them from there), and
theory/ reads the groupings without importing the config's rules. A new strategy is one name in
STRATEGIES plus the groups it joins (docs/architecture.md, "Adding a strategy").
"""
from __future__ import annotations

__all__ = ["STRATEGIES", "WORKLOADS", "PRECISIONS", "SCHEDULES", "MODEL_SIZES", "DATASETS", "COMPRESSIONS",
           "PS_MODES", "ONE_PROCESS", "SHARDS_DATA", "STAGED", "SHARDED", "NEEDS_TWO_RANKS", "GRAD_ACCUM",
           "VIRTUAL_LINK"]

STRATEGIES = ("single", "ddp", "naive_dp", "dp", "model_parallel", "pipeline", "zero1", "fsdp", "param_server",
              "accelerate")
WORKLOADS = ("mlp", "cnn", "gpt")
PRECISIONS = ("fp32", "fp16", "bf16")
SCHEDULES = ("gpipe", "1f1b")
MODEL_SIZES = ("tiny", "small", "base")
DATASETS = ("synthetic", "memmap")
COMPRESSIONS = ("none", "fp16", "bf16", "powersgd")
PS_MODES = ("sync", "async")

# Strategy groupings: which strategies share a behaviour. Defined here once; api, runner, records,
# prediction, plots and the lab bench read them (a new strategy joins a group by one edit here).
ONE_PROCESS = ("single", "dp")  # one process (dp drives its replicas from threads); other ranks idle
SHARDS_DATA = ("ddp", "naive_dp", "zero1", "fsdp", "param_server")  # each rank reads its own shard
STAGED = ("model_parallel", "pipeline")  # the model cut into stages, one per rank
SHARDED = ("zero1", "fsdp")  # parameters / optimizer state sharded over ranks
NEEDS_TWO_RANKS = ("ddp", "naive_dp", "dp") + STAGED
GRAD_ACCUM = ("single", "ddp", "naive_dp")  # grad_accum_steps > 1 implemented
VIRTUAL_LINK = ("ddp", "naive_dp")  # the virtual interconnect delays their gradient buckets
