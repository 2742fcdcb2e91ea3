"""The config's vocabulary: what each knob may be, and which strategies share a behaviour.

Pure data, imports nothing: config.py re-exports every name (read them from there), and
theory/ reads the groupings without importing the config's rules. A new strategy is one name in
STRATEGIES plus the groups it joins (docs/architecture.md, "Adding a strategy").
"""
from __future__ import annotations

__all__ = ["STRATEGIES", "WORKLOADS", "PRECISIONS", "SCHEDULES", "MODEL_SIZES", "DATASETS", "COMPRESSIONS",
           "PS_MODES", "ONE_PROCESS", "SHARDS_DATA", "STAGED", "SHARDED", "NEEDS_TWO_RANKS", "GRAD_ACCUM",
           "VIRTUAL_LINK", "DDP_BUCKETS", "DEFAULT_STRATEGY", "HAND_WRITTEN", "SPLITS_WEIGHTS", "SPLITS_SEQUENCE",
           "GLOBAL_BATCH", "RANK0_SERVES", "KNOB_OWNERS",
           "MODEL_SPLIT", "WORKLOAD_SIZES", "gpt_heads", "GPT_HEADS_HIDDEN", "GPT_SEQ", "GPT_LAYERS", "MESH_DIMS", "MESHES",
           "STAGE_BLOCKS"]

DEFAULT_STRATEGY = "ddp"  # ExperimentConfig's; it takes no mesh, so a mesh names the strategy in its place
STRATEGIES = ("single", "ddp", "naive_dp", "dp", "model_parallel", "pipeline", "zero1", "fsdp", "param_server",
              "accelerate", "tp", "sp", "cp", "ep")
WORKLOADS = ("mlp", "cnn", "gpt")
PRECISIONS = ("fp32", "fp16", "bf16")
SCHEDULES = ("gpipe", "1f1b", "interleaved_1f1b")  # torch.distributed.pipelining: ScheduleGPipe, Schedule1F1B, ScheduleInterleaved1F1B
MODEL_SIZES = ("tiny", "small", "base")
DATASETS = ("synthetic", "memmap")
COMPRESSIONS = ("none", "fp16", "bf16", "powersgd")
PS_MODES = ("sync", "async")

# Strategy groupings: which strategies share a behaviour. Defined here once; api, runner, records,
# config_rules, prediction, plots and the lab bench read them (a new strategy joins a group by one edit
# here; tests/test_choices.py checks them against the registry and the config's fields).
ONE_PROCESS = ("single", "dp")  # one process (dp drives its replicas from threads); other ranks idle
SHARDS_DATA = ("ddp", "naive_dp", "zero1", "fsdp", "param_server", "ep")  # each rank reads its own shard
STAGED = ("model_parallel", "pipeline")  # the model cut into stages, one per rank
SHARDED = ("zero1", "fsdp")  # parameters / optimizer state sharded over ranks
# tensor, sequence and context parallel: every rank reads the same batch and holds part of each
# layer (tp, sp) or part of the sequence (cp); strategies/hand_parts.py
MODEL_SPLIT = ("tp", "sp", "cp")
HAND_WRITTEN = MODEL_SPLIT + ("ep",)  # written by hand for the gpt in fp32 (registry.HAND_PARTS: their parts)
SPLITS_WEIGHTS = ("tp", "sp")  # each layer's heads and hidden size split over ranks: the rank count must divide them
SPLITS_SEQUENCE = ("sp", "cp")  # the sequence split over ranks: the rank count must divide GPT_SEQ
GLOBAL_BATCH = STAGED + MODEL_SPLIT  # batch_size is the step's whole batch (ExperimentConfig.global_batch_size)
RANK0_SERVES = ("param_server",)  # rank 0 serves the parameters and reads no batch; ranks 1..N-1 split it
NEEDS_TWO_RANKS = ("ddp", "naive_dp", "dp") + STAGED + HAND_WRITTEN
GRAD_ACCUM = ("single", "ddp", "naive_dp")  # grad_accum_steps > 1 implemented
VIRTUAL_LINK = ("ddp", "naive_dp")  # the virtual interconnect delays their gradient buckets
DDP_BUCKETS = ("ddp", "accelerate")  # torch DDP's gradient buckets (accelerate wraps DDP): bucket_cap_mb applies

# knob -> the strategies whose code reads it (a knob not listed: every strategy). config_rules refuses
# the restricted ones set elsewhere, ExperimentConfig.label names them, the lab bench shows a knob only
# for these (widgets/relevance.py), so a strategy that takes a knob joins its row here and nowhere else.
KNOB_OWNERS: dict[str, tuple[str, ...]] = {
    "world_size": tuple(s for s in STRATEGIES if s != "single"),  # single is one process: world_size=1
    "bucket_cap_mb": DDP_BUCKETS,
    "grad_accum_steps": GRAD_ACCUM,
    "interconnect": VIRTUAL_LINK,
    "find_unused_parameters": ("ddp",),
    "compression": ("ddp",),  # a DDP comm hook (registry.WITH_COMPRESSION)
    "powersgd_rank": ("ddp",),
    "start_powerSGD_iter": ("ddp",),
    "reshard_after_forward": ("fsdp",),
    "ps_mode": RANK0_SERVES,
    "straggler_ms": RANK0_SERVES,
    "micro_batches": ("pipeline",),
    "schedule": ("pipeline",),
    "virtual_stages": ("pipeline",),  # and only with the interleaved schedule
    "zigzag": ("cp",),  # how ring attention splits the sequence
    "experts": ("ep",),
    "top_k": ("ep",),
}

# The workloads' sizes: (width, depth) per model_size; "small" is tens of ms per step on a 2-core CPU at
# bs32. models.py builds the models from this table, and the config refuses a split of them
# before any rank starts, from the same numbers.
WORKLOAD_SIZES: dict[str, dict[str, tuple[int, int]]] = {
    "mlp": {"tiny": (64, 2), "small": (1024, 4), "base": (2048, 6)},
    "cnn": {"tiny": (8, 3), "small": (32, 3), "base": (64, 3)},
    "gpt": {"tiny": (32, 2), "small": (128, 3), "base": (256, 6)},
}
GPT_SEQ = 32  # tokens per sample


def gpt_heads(width: int) -> int:
    """Attention heads of the gpt workload at this width: a head is 32 wide."""
    return max(1, width // 32)


# The gpt's (heads, hidden) per model_size and its transformer blocks (the Sequential adds the
# embedding and the head).
GPT_HEADS_HIDDEN = {k: (gpt_heads(w), w) for k, (w, _) in WORKLOAD_SIZES["gpt"].items()}
GPT_LAYERS = {k: d for k, (_, d) in WORKLOAD_SIZES["gpt"].items()}

# Meshes: a data-parallel dimension added to the strategy that splits the model, dimension names
# in torchtitan's order (pp outermost, tp innermost). strategy -> the meshes it takes.
MESH_DIMS = {"tp": (("dp", "tp"), ("fsdp", "tp")), "pipeline": (("pp", "dp"),),
             "fsdp": (("dp", "fsdp"),)}  # fsdp on {"dp": r, "fsdp": s}: HSDP, replicated over dp, sharded over fsdp
MESHES = (None, {"dp": 2, "tp": 2}, {"fsdp": 2, "tp": 2}, {"pp": 2, "dp": 2}, {"dp": 2, "fsdp": 2})  # the lab bench's choices
# Blocks each workload cuts into pipeline stages, per model_size (models.py: the mlp and
# the cnn have depth + 1 blocks, the gpt its layers + embedding + head): world_size x virtual_stages
# may not exceed them. A test keeps this in step with the built models.
STAGE_BLOCKS = {name: {k: d + (2 if name == "gpt" else 1) for k, (_, d) in sizes.items()}
                for name, sizes in WORKLOAD_SIZES.items()}
