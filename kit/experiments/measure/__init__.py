"""Measure (rank side, imports torch): the built-in workloads and the instruments a run is measured with:
step timing and stamps, the common clock, memory, and the virtual interconnect."""
