"""Strategies (rank side, imports torch): what the run loop (runner.run_rank) trains with, one
class per `ExperimentConfig.strategy`, the naive version beside the real one. Every strategy is a
`base.Strategy`; `registry.py` maps a config to its class; `common.py` holds what they share.
The hand-written parallelisms they wrap (tp, sp, cp, ep, meshes) live in ../parallel/, each
checked against one process (picotron's style).
"""
