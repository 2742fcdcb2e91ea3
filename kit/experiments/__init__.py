"""Experiments: run a built-in workload under one parallelism strategy and measure it.

    from kit.experiments import ExperimentConfig, run, table
    rec = run(ExperimentConfig(strategy="ddp", workload="mlp", bucket_cap_mb=5))
    res = compare(ExperimentConfig(strategy="dp"), ExperimentConfig(strategy="ddp"))
    print(res["summary"])   # "ddp is 1.21x slower than dp (95% CI ...)" or "same within noise"

Importing this package is light (no torch): the kernel builds configs and calls `run`;
the strategies (strategies/ddp.py, strategies/pipeline.py, ...) are imported only inside the worker ranks.
"""
from __future__ import annotations


from kit._lazy import lazy_dir, lazy_getattr

# Public names: lessons, benches and notebooks import these from `kit.experiments`, never from
# the module that defines them, so moving a module never breaks a notebook.
_LAZY = {
    # kernel side: configure, run, compare, record
    "ExperimentConfig": "kit.experiments.config",
    "ExperimentConfigError": "kit.experiments.config",
    "run": "kit.experiments.api",
    "sweep": "kit.experiments.api",
    "shutdown": "kit.experiments.api",
    "cluster_for": "kit.experiments.api",  # the ranks a run or a benchmark uses (started once, reused)
    "compare": "kit.experiments.comparison",
    "conclude": "kit.experiments.comparison",
    "paired_verdict": "kit.experiments.comparison",
    "summary_line": "kit.experiments.comparison",
    "DEFAULT_REPEATS": "kit.experiments.comparison",
    "quantile": "kit.experiments.stats",
    "combine_repeats": "kit.experiments.records",
    "merge": "kit.experiments.records",
    "load_jsonl": "kit.experiments.records",
    "append_jsonl": "kit.experiments.records",
    "table": "kit.experiments.records",
    "bucket_report": "kit.experiments.records",  # a DDP run's buckets and where its all-reduce went (lesson 03)
    "breakdown_ms": "kit.experiments.measure.timing",  # one step's overlapped and exposed comm from its intervals
    # theory: formulas and the predictor (no torch)
    "predict": "kit.experiments.theory.prediction",  # kit.prediction/1; docs/predicting.md
    "plan": "kit.experiments.theory.plan",  # layouts of a model on a cluster, no torch; docs/predicting.md
    "ModelSpec": "kit.experiments.theory.models",
    "MODELS": "kit.experiments.theory.models",  # the named model shapes plan() and predict() know
    "cluster_spec": "kit.experiments.theory.cluster:cluster_spec",  # a cluster to plan for (nodes, GPUs, links)
    "published_runs": "kit.experiments.theory.published",  # 48 published runs, with sources, as plan() inputs
    "compare_published": "kit.experiments.theory.published_check",  # the planner against one of them
    "planned_allreduce_s": "kit.experiments.theory.layout_time",  # the planner's all-reduce on a group of a cluster
    "spec_from_module": "kit.experiments.measure.model_shapes",
    "LINKS": "kit.experiments.theory.links",
    "alpha_beta_allreduce_s": "kit.experiments.theory.links",  # the ring formula from your alpha and bandwidth
    "link_allreduce_s": "kit.experiments.theory.links",  # the same with a link preset's numbers (the emulated link's)
    "zero_bytes_per_param": "kit.experiments.theory.parallel_memory",
    "ring_factor": "kit.experiments.theory.links",  # bytes a rank sends per payload byte, ring
    "predict_tp_bytes": "kit.experiments.theory.comm_bytes",  # what each parallelism moves per step
    "predict_sp_bytes": "kit.experiments.theory.comm_bytes",
    "predict_cp_bytes": "kit.experiments.theory.comm_bytes",
    "predict_ep_bytes": "kit.experiments.theory.comm_bytes",
    "wire_prediction": "kit.experiments.theory.sharding_theory",
    # rank side: workloads, instruments, strategies' pieces a lesson shows
    "build_workload": "kit.experiments.measure.workloads",
    "make_loader": "kit.experiments.measure.workloads",
    "ActivationMeter": "kit.experiments.measure.memory",
    "pipeline_schedule": "kit.experiments.theory.pipeline_schedule:schedule",
    # tensor / sequence / context / expert parallelism and meshes, by hand (parallel/, docs/strategies.md); each
    # check_* trains or runs a small model on the calling ranks and in one process, and returns the
    # differences and the bytes counted beside the formula's: `check_tp()` in a %%distributed cell
    "copy_to_tp": "kit.experiments.parallel.tensor",  # Megatron's f
    "reduce_from_tp": "kit.experiments.parallel.tensor",  # Megatron's g
    "ColumnParallelLinear": "kit.experiments.parallel.tensor",
    "RowParallelLinear": "kit.experiments.parallel.tensor",
    "tensor_parallel": "kit.experiments.parallel.tensor",
    "torch_tensor_parallel": "kit.experiments.parallel.tensor",
    "check_tp": "kit.experiments.parallel.tensor",
    "sequence_parallel": "kit.experiments.parallel.sequence",
    "check_sp": "kit.experiments.parallel.sequence",
    "ring_attention": "kit.experiments.parallel.context",
    "split_sequence": "kit.experiments.parallel.context",
    "check_ring_attention": "kit.experiments.parallel.context",
    "MoE": "kit.experiments.parallel.expert",
    "ExpertParallelMoE": "kit.experiments.parallel.expert",
    "route": "kit.experiments.parallel.expert",
    "check_ep": "kit.experiments.parallel.expert",
    "make_mesh": "kit.experiments.parallel.mesh",
    "check_mesh": "kit.experiments.parallel.mesh",
    "collectives_counted": "kit.experiments.parallel.wire:WIRE",  # .counting(), .report()
    "small_gpt": "kit.experiments.parallel.reference",
    "pipeline_bubble": "kit.experiments.parallel.pipeline_bubble",
    "predicted_bubble": "kit.experiments.theory.bubble",  # (p-1)/(v m + p-1)
    "mlp_pipeline_bubble": "kit.experiments.theory.local_time",  # the bubble with measured costs, predicted
    "calibrate_rank": "kit.experiments.measure.calibrate",  # this CPU's matmul rate and per-op cost, measured
    "handoff_rank": "kit.experiments.measure.calibrate",  # one pipeline hand-off between ranks 0 and 1, measured
    # benchmarks
    "memmap_benchmark": "kit.experiments.benchmarks.memmap_bench",
    "MemmapBenchError": "kit.experiments.benchmarks.memmap_bench",
    "cached_before_line": "kit.experiments.benchmarks.memmap_bench",  # its page-cache share per epoch, in words
    "collective_benchmark": "kit.experiments.benchmarks.collectives",
    "allreduce_algorithms_benchmark": "kit.experiments.benchmarks.allreduce_algos",
    "hand_ring_all_reduce": "kit.experiments.benchmarks.allreduce_algos",  # runs on ranks: a tensor summed in place
    "compression_break_even_sweep": "kit.experiments.benchmarks.compression_bench",
    "check_local": "kit.experiments.benchmarks.local_check",  # the time model against a run on these ranks
    "predict_check": "kit.experiments.benchmarks.predict_check:",  # the module: measure, residuals, residual_table
}


__all__ = list(_LAZY)  # every public name, so `from kit.experiments import *` and dir() agree

__getattr__ = lazy_getattr(__name__, _LAZY)
__dir__ = lazy_dir(globals(), _LAZY)
