"""The tables of what this release renamed, moved or removed (one word, one meaning): pure data.

kit/_renamed.py holds the hooks that read them (a module `__getattr__`, the moved modules' finder, a class's
old attributes and keywords, a result dict's old keys) and re-exports every table, so `kit._renamed.RENAMED`
and the rest stay where they were. The next release deletes both files. Imports nothing.
"""
from __future__ import annotations

__all__ = ["RENAMED", "REMOVED", "MOVED", "MOVED_AWAY", "ATTRIBUTES", "KEYWORDS", "REMOVED_KEYWORDS", "KEYS",
           "REMOVED_KEYS"]

_X = "kit.experiments"
# module: {old name: "module:new name"} (a package's lazy name where it has one: the name a learner imports)
RENAMED: dict[str, dict[str, str]] = {
    _X: {
        "predicted_interleaved_bubble": f"{_X}:predicted_bubble",
        "ring_all_reduce": f"{_X}:hand_ring_all_reduce",
        "ring_allreduce_s": f"{_X}:alpha_beta_allreduce_s",
        "run_local": f"{_X}.harness.local:run_local",  # the tests' and benches' harness, no longer exported
        "run_each": f"{_X}.harness.local:run_each",
    },
    f"{_X}.benchmarks.allreduce_algos": {
        "ring_all_reduce": f"{_X}.benchmarks.allreduce_algos:hand_ring_all_reduce",
        "root_all_reduce": f"{_X}.benchmarks.allreduce_algos:hand_root_all_reduce",
    },
    f"{_X}.measure.interconnect": {"ring_allreduce_s": f"{_X}.theory.links:alpha_beta_allreduce_s"},
    f"{_X}.measure.workloads": {
        "Block": f"{_X}.models:Block", "Checkpointed": f"{_X}.models:Checkpointed",
        "Embed": f"{_X}.models:Embed", "Head": f"{_X}.models:Head",
        "SIZES": f"{_X}.choices:WORKLOAD_SIZES",
    },
    f"{_X}.models": {"SEQ": f"{_X}.choices:GPT_SEQ"},  # one name for the GPT's tokens per sample
    f"{_X}.parallel.reference": {"LR": f"{_X}.parallel.reference:SGD_LR"},  # the reference's SGD
    f"{_X}.records": {
        "is_complete": f"{_X}.record_readers:is_complete", "run_center": f"{_X}.record_readers:run_center",
        "run_spread": f"{_X}.record_readers:run_spread",
    },
    f"{_X}.strategies.common": {"LR": f"{_X}.strategies.common:ADAM_LR"},  # the run loop's Adam
    f"{_X}.strategies.mesh": {"fsdp_over": f"{_X}.parallel.mesh:apply_fsdp"},  # the module moved too (MOVED)
    f"{_X}.strategies.pipeline_bubble": {"predicted_interleaved_bubble": f"{_X}.theory.bubble:predicted_bubble"},
    f"{_X}.strategies.sharding": {"local_bytes": f"{_X}.measure.memory:local_bytes"},
    f"{_X}.theory.cluster": {"Cluster": f"{_X}.theory.cluster:ClusterSpec",
                             "make_cluster": f"{_X}.theory.cluster:cluster_spec"},  # kit.experiments' name
    f"{_X}.theory.layout_memory": {
        "PRECISIONS": f"{_X}.theory.layout_memory:PLAN_PRECISIONS",
        "SCHEDULES": f"{_X}.theory.layout_memory:PLAN_SCHEDULES",
    },
    f"{_X}.theory.layout_time": {"allreduce_s": f"{_X}.theory.layout_time:planned_allreduce_s"},
    f"{_X}.theory.links": {"ring_allreduce_s": f"{_X}.theory.links:alpha_beta_allreduce_s"},
    f"{_X}.theory.parallel_memory": {"STRATEGIES": f"{_X}.theory.parallel_memory:PARALLEL_KINDS"},
    f"{_X}.theory.plan": {"evaluate": f"{_X}.theory.plan:layout_of"},
    f"{_X}.theory.prediction": {
        "STRATEGIES": f"{_X}.theory.prediction:PREDICTABLE",
        "TOKENS_PER_SAMPLE": f"{_X}.theory.predict_inputs:TOKENS_PER_SAMPLE",
    },
    f"{_X}.theory.published_check": {"compare": f"{_X}.theory.published_check:compare_published"},
}

_MS = ("link_allreduce_s(link, nbytes, world_size) * 1e3: it gives seconds, the old name gave milliseconds")


def _hand(what: str, module: str, parts: str) -> str:
    return (f"{what} runs the one strategy HandParallel (kit.experiments.strategies.hand_parallel) given {parts} "
            f"(kit.experiments.strategies.{module}): HandParallel(cfg, model, loss_fn, device, clock, {parts}); "
            "kit.experiments.strategies.registry.build_strategy(cfg, model, loss_fn, device, clock) picks the parts")


# module: {old name: ("module:the replacement", what to write instead)}: no name maps one to one
REMOVED: dict[str, dict[str, tuple[str, str]]] = {
    _X: {"predict_allreduce_ms": (f"{_X}:link_allreduce_s", f"call kit.experiments.{_MS}")},
    f"{_X}.theory.links": {"predict_allreduce_ms": (f"{_X}.theory.links:link_allreduce_s", f"call {_MS}")},
    f"{_X}.theory.plan_notes": {"config_of": (f"{_X}.theory.layout:Layout",
                                              "a Layout holds its ParallelConfig: read layout.config")},
    f"{_X}.strategies.mesh_strategies": {"pipeline_on_mesh": (
        f"{_X}.parallel.mesh:pp_dp", "the pipeline on a mesh is written by hand in parallel/: "
        "pp_dp(make_mesh(shape), batches, dims, micro_batches), checked by check_mesh({'pp': 2, 'dp': 2})"),
        "MeshPipeline": (
        f"{_X}.strategies.pipeline:Pipeline", "the Pipeline strategy puts its stages on a mesh's pp dimension "
        "itself: ExperimentConfig(strategy='pipeline', mesh={'pp': 2, 'dp': 2})"),
        "MeshTensorParallel": (f"{_X}.strategies.mesh_strategies:DP_X_TP", _hand(
            "tp on a dp x tp mesh (on fsdp x tp: FSDP_X_TP)", "mesh_strategies", "DP_X_TP"))},
    f"{_X}.strategies.parallel_gpt": {
        "TensorParallel": (f"{_X}.strategies.hand_parts:TP", _hand("tp", "hand_parts", "TP")),
        "SequenceParallel": (f"{_X}.strategies.hand_parts:SP", _hand("sp", "hand_parts", "SP"))},
    f"{_X}.strategies.parallel_gpt_cp_ep": {
        "ContextParallel": (f"{_X}.strategies.hand_parts:CP", _hand("cp", "hand_parts", "CP")),
        "ExpertParallel": (f"{_X}.strategies.hand_parts:EP", _hand("ep", "hand_parts", "EP"))},
}

# old module: new module (the hand-written building blocks left strategies/ for parallel/)
MOVED: dict[str, str] = {
    f"{_X}.strategies.checks": f"{_X}.harness.checks",
    f"{_X}.strategies.context_parallel": f"{_X}.parallel.context",
    f"{_X}.strategies.expert_parallel": f"{_X}.parallel.expert",
    f"{_X}.strategies.mesh": f"{_X}.parallel.mesh",
    f"{_X}.strategies.parallel_gpt": f"{_X}.strategies.hand_parallel",  # one strategy, given each parallelism's parts
    f"{_X}.strategies.parallel_gpt_cp_ep": f"{_X}.strategies.hand_parts",
    f"{_X}.strategies.pipeline_bubble": f"{_X}.parallel.pipeline_bubble",
    f"{_X}.strategies.reference": f"{_X}.parallel.reference",
    f"{_X}.strategies.sequence_parallel": f"{_X}.parallel.sequence",
    f"{_X}.strategies.tensor_parallel": f"{_X}.parallel.tensor",
    f"{_X}.strategies.wire": f"{_X}.parallel.wire",
}
# old module: (the replacement, what to write): moved, but an importable alias would do harm. Importing
# kit.widgets.plan_panel sets it on kit.widgets, where it would hide the plan_panel function again
# (why the module was renamed planner; test_layering's "hidden by a submodule of the same name").
MOVED_AWAY: dict[str, tuple[str, str]] = {
    "kit.widgets.plan_panel": ("kit.widgets.planner:plan_panel",
                               "the module is kit.widgets.planner; `from kit.widgets import plan_panel` still works"),
}

_L = {k: f"config.{k}" for k in ("tp", "pp", "dp", "cp", "ep", "zero", "micro_batch", "recompute", "virtual_stages")}
_LAYOUT = {**_L, "microbatches": "config.micro_batches"}  # Layout holds its ParallelConfig
# class: {old attribute: its path from the instance}
ATTRIBUTES: dict[str, dict[str, str]] = {
    f"{_X}.theory.layout:Layout": _LAYOUT,
    f"{_X}.theory.layout_memory:ParallelConfig": {"microbatches": "micro_batches"},
}
# function or class: {old keyword: new keyword} (micro_batches: the count, everywhere), where a learner passed it
KEYWORDS: dict[str, dict[str, str]] = {
    f"{_X}.theory.layout_memory:ParallelConfig": {"microbatches": "micro_batches"},
}

# class: {removed keyword: (its old place among the positional arguments, what happens now)}. The old
# place is now a parameter that takes a function (Knob's `parse`), so a value there that is not callable
# is the old argument, moved along: without this, Knob("strategy", ..., options, "ddp") made "ddp" the parser.
REMOVED_KEYWORDS: dict[str, dict[str, tuple[int, str]]] = {
    "kit.widgets.knobs:Knob": {"default": (4, "the panel starts at ExperimentConfig's default for the field "
                                              "(one copy of each default), which Knob.default now reads; "
                                              "the value given is not used")},
}

# a result dict a learner reads: {old key: the new key's path, "diffs.weights" for res["diffs"]["weights"]}
KEYS: dict[str, dict[str, str]] = {
    # check_tp, check_sp, check_ep, check_mesh (and a tp/sp/ep/mesh run record's comm.report.check_vs_one_process)
    "check_*()": {"weights_max_abs_diff": "diffs.weights", "loss_max_abs_diff": "diffs.loss"},
    "Layout.as_dict()": _LAYOUT,
}
# a result dict: {old key: what to read instead}: no key maps one to one (none this release)
REMOVED_KEYS: dict[str, dict[str, str]] = {}
