"""Strategies (rank side, imports torch): one file per parallelism, the naive version beside the
real one. Every strategy is a `base.Strategy`; `registry.py` maps a config's strategy to its class.
The hand-written parallelisms (tensor_parallel, sequence_parallel, context_parallel,
expert_parallel, mesh) are each checked against one process (picotron's style).
"""
