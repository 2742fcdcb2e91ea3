"""The parallelism building blocks, by hand, one file per parallelism (picotron's layout): what a
lesson reads. Rank side, imports torch.

    tensor.py      Megatron's column/row-parallel layers, f and g, and torch's DTensor twin
    sequence.py    tensor parallelism with the LayerNorms split along the sequence
    context.py     ring attention (zig-zag split, online softmax, hand-written backward)
    expert.py      a mixture of experts, its experts split over ranks (all-to-all dispatch)
    mesh.py        two at once on init_device_mesh: dp x tp, fsdp x tp; gradient averaging
    pipeline_bubble.py  the pipeline bubble on balanced stages (the schedule from theory/)
    wire.py        their communication: every collective counted and timed per mesh dimension
    reference.py   the one-process GPT and SGD loop every check_* compares against

Each file's `check_*` trains a small model on the calling ranks and in one process and returns a
result with the same keys (`CheckResult` in reference.py). The byte formulas they are held to live in
theory/comm_bytes.py; strategies/ plugs these blocks into the run loop (`ExperimentConfig`).
"""
