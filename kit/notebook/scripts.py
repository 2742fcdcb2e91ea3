"""`%dist export` and `%dist slurm-script`: the notebook's work as files that run without it.

export: the executed `%%distributed` cells, in execution order, as one script for
`torchrun --nproc-per-node N train.py`, with the set-up the kit does for a cell (the process group,
`rank`, `world_size`, `local_rank`, `device`). Cells that failed, ran with `--expect-error` or
`--fresh` are left out with a comment saying why; `--ranks` cells become `if rank in (...)` blocks.
slurm-script: an sbatch script that runs the attach command (one torchrun per node) under Slurm.
"""
from __future__ import annotations

import shlex
import textwrap
from dataclasses import dataclass

__all__ = ["CellRecord", "export_script", "slurm_script"]


@dataclass
class CellRecord:
    """One executed `%%distributed` cell, as the magic saw it."""

    label: str  # "In [7]"
    source: str
    flags: str  # the magic's line, e.g. "--cpus 2 --ranks 0"
    ok: bool
    error: str = ""  # "rank 1 raised ValueError at line 3" for a failed cell
    ranks: tuple[int, ...] | None = None
    expect_error: bool = False
    fresh: bool = False


_HEADER = '''\
#!/usr/bin/env python
# Exported by distributed-kit (`%dist export {name}`): the notebook's %%distributed cells, in the order
# they ran, as a script that runs unchanged under torchrun.
#   one machine:  torchrun --nproc-per-node {n} {name}
#   many nodes:   torchrun --nnodes NODES --nproc-per-node GPUS_PER_NODE --max-restarts 0 \\
#                   --rdzv-backend c10d --rdzv-endpoint NODE0_HOST:29400 --rdzv-id my-run {name}
#   Slurm:        srun --ntasks-per-node 1 torchrun ... (as above, NODE0_HOST from `scontrol show hostnames`)
import os

import torch
import torch.distributed as dist

# What the kit sets up before every cell: the process group and the names the cells use.
backend = "nccl" if torch.cuda.is_available() and os.environ.get("KIT_EXPORT_BACKEND", "auto") != "gloo" else "gloo"
dist.init_process_group(backend)
rank, world_size = dist.get_rank(), dist.get_world_size()
local_rank = int(os.environ.get("LOCAL_RANK", 0))
if backend == "nccl":
    torch.cuda.set_device(local_rank)
    device = torch.device("cuda", local_rank)
else:
    device = torch.device("cpu")
'''

_FOOTER = '''
dist.destroy_process_group()
'''


def _commented(source: str) -> str:
    return textwrap.indent(source.rstrip("\n"), "# ", lambda line: True)


def export_script(cells: list[CellRecord], name: str, world_size: int) -> str:
    parts = [_HEADER.format(name=name, n=world_size)]
    for c in cells:
        if c.expect_error or c.fresh or not c.ok:
            why = ("ran with --expect-error (it fails on purpose)" if c.expect_error else
                   "ran with --fresh in separate processes" if c.fresh else f"failed: {c.error or 'an error'}")
            parts.append(f"\n# --- {c.label}: left out, it {why} ---\n{_commented(c.source)}\n")
            continue
        body = c.source.rstrip("\n")
        if c.ranks is not None:  # `--ranks 0`: only those ranks ran it
            body = f"if rank in {tuple(c.ranks)!r}:\n" + textwrap.indent(body or "pass", "    ")
        parts.append(f"\n# --- {c.label} (%%distributed {c.flags}".rstrip() + ") ---\n" + body + "\n")
    if not any(c.ok and not c.expect_error and not c.fresh for c in cells):
        parts.append("\n# (no %%distributed cell had run successfully when this was exported)\n")
    parts.append(_FOOTER)
    return "".join(parts)


def slurm_script(nodes: int, gpus_per_node: int, attach: str, key_file: str, job_name: str = "kit-attach",
                 time_limit: str = "01:00:00") -> str:
    """An sbatch script: one task per node, each starting torchrun, whose ranks attach to the notebook."""
    q = shlex.quote
    gres = f"#SBATCH --gres=gpu:{gpus_per_node}\n" if gpus_per_node > 0 else ""
    per_node = max(1, gpus_per_node)
    return f"""#!/bin/bash
# Written by distributed-kit (`%dist slurm-script`): {nodes} node(s) x {per_node} rank(s) attach to the notebook
# at {attach}. First run in the notebook:
#   %dist attach --world-size {nodes * per_node} --host 0.0.0.0 --port {attach.rpartition(":")[2]}
# then submit this script with sbatch. Every node needs the kit installed and a copy of the key file (mode 0600).
#SBATCH --job-name={job_name}
#SBATCH --nodes={nodes}
#SBATCH --ntasks-per-node=1
{gres}#SBATCH --time={time_limit}
set -euo pipefail
NODE0=$(scontrol show hostnames "$SLURM_JOB_NODELIST" | head -n 1)
srun --kill-on-bad-exit=1 torchrun \\
    --nnodes {nodes} --nproc-per-node {per_node} --max-restarts 0 \\
    --rdzv-backend c10d --rdzv-endpoint "$NODE0:29400" --rdzv-id "$SLURM_JOB_ID" \\
    -m kit.rank.worker --attach {q(attach)} --key-file {q(key_file)}
"""
