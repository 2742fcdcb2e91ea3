"""The parallelism building blocks, by hand, one file per parallelism (picotron's layout): what a
lesson reads. Rank side, imports torch.

    tensor.py      Megatron's column/row-parallel layers, f and g, and torch's DTensor twin
    sequence.py    tensor parallelism with the LayerNorms split along the sequence
    context.py     ring attention (zig-zag split, online softmax, hand-written backward)
    expert.py      a mixture of experts, its experts split over ranks (all-to-all dispatch)
    pipeline.py    the model cut into stages over a group, micro-batches in 1F1B order (send/recv)
    mesh.py        two at once on init_device_mesh: dp x tp, fsdp x tp (apply_tp, then apply_data_parallel),
                   pp x dp (pipeline.py's stages, then apply_data_parallel), HSDP (apply_hsdp: FSDP2 on a
                   2-D mesh); check_mesh checks each of them
    pipeline_bubble.py  the pipeline bubble on balanced stages (the schedule from theory/), measured
    wire.py        their communication: every collective counted and timed per mesh dimension
    wire_fsdp.py   FSDP2's own collectives, counted through its custom-collective API and HSDP's hook
    reference.py   the one-process GPT and SGD loop every check_* compares against

The checks, each against one process: `check_tp` (tensor.py), `check_sp` (sequence.py),
`check_ring_attention` (context.py), `check_ep` (expert.py) and `check_mesh` (mesh.py: the four
meshes; a pipeline alone is `check_mesh({"pp": p, "dp": 1})`). Each trains (or runs) a small model on the
calling ranks and in one process and returns a result with the same keys (`CheckResult` in reference.py).
The byte formulas they are held to live in theory/comm_bytes.py; strategies/ plugs these blocks into the
run loop (`ExperimentConfig`). Nothing here imports strategies/ (tests/test_layering.py).
"""
