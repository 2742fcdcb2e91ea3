"""Strategies (rank side, imports torch): what the run loop (runner.run_rank) trains with, one
class per `ExperimentConfig.strategy`, the naive version beside the real one. Every strategy is a
`base.Strategy`; `registry.py` maps a config to its class; `common.py` holds what they share.
The hand-written parallelisms (tp, sp, cp, ep, tp on a mesh) share one class,
`hand_parallel.HandParallel`, given each one's `HandParts` (hand_parts.py, mesh_strategies.py);
the blocks they wrap live in ../parallel/, each checked against one process (picotron's style).
"""
