"""Harness for tests and benches (rank side): local gloo ranks without a Cluster, and the agreement
checks that compare a strategy with the single process or with DDP."""
