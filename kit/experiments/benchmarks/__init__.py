"""Benchmarks: one function per question, each returning a record. The kernel-side half (no torch)
drives the ranks; the rank-side half (collectives, allreduce_algos, memmap_data) runs the measurement."""
