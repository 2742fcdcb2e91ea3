"""`%dist export` and `%dist slurm-script`: the notebook's work as files that run without it.

export: the executed `%%distributed` cells, in execution order, as one script for
`torchrun --nproc-per-node N train.py`, with the set-up the kit does for a cell (the process group,
`rank`, `world_size`, `local_rank`, `device`). Cells that failed, ran with `--expect-error` or
`--fresh` are left out with a comment saying why; `--ranks` cells become `if rank in (...)` blocks;
`from __future__` imports move to the top, where Python requires them. A cell's own
`init_process_group(...)` runs only where no group exists (the kit skips it while its group exists),
and after a cell that calls `destroy_process_group()` the group is made again on fresh store keys of
torchrun's store (a cell may have set its own MASTER_PORT), as the kit does before the next cell.
Every text that is not code (error messages, labels, file names) is commented line by line, so nothing
in it can run. What is done to each cell's source (indenting, guarding, hoisting, commenting) is
notebook/cell_source.py.
slurm-script: an sbatch script that runs the attach command (one torchrun per node) under Slurm.
Both write a new file (an existing one only with force=True), never through a symbolic link.
"""
from __future__ import annotations

import errno
import os
import re
import shlex
from dataclasses import dataclass

from kit.notebook.cell_source import commented, destroys, guard_init, indented, names_in, one_line, split_future

__all__ = ["CellRecord", "export_script", "slurm_script", "write_script"]


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
    replaced: bool = False  # `%dist restart`/`shutdown` replaced the ranks it ran on: its variables are gone
    pushed: tuple[str, ...] | None = None  # a `%dist push`: the names (source assigns them); None for a cell
    unwritable: tuple[str, ...] = ()  # pushed values that are not Python literals: the script raises for them

    @property
    def exported(self) -> bool:
        """Whether `%dist export` writes it as code (else as a commented-out cell with the reason)."""
        return self.ok and not self.expect_error and not self.fresh and not self.replaced


_HEADER = '''\
#!/usr/bin/env python
# Exported by distributed-kit (`%dist export {name}`): the notebook's %%distributed cells, in the order
# they ran, as a script that runs unchanged under torchrun.
#   one machine:  torchrun --nproc-per-node {n} {name}
#   many nodes:   torchrun --nnodes NODES --nproc-per-node GPUS_PER_NODE --max-restarts 0 \\
#                   --rdzv-backend c10d --rdzv-endpoint NODE0_HOST:29400 --rdzv-id my-run {name}
#   Slurm:        srun --ntasks-per-node 1 torchrun ... (as above, NODE0_HOST from `scontrol show hostnames`)
{future}import os

import torch
import torch.distributed as dist

# What the kit sets up before every cell: the process group and the names the cells use.
backend = "nccl" if torch.cuda.is_available() and os.environ.get("KIT_EXPORT_BACKEND", "auto") != "gloo" else "gloo"
{timeout}rank, world_size = dist.get_rank(), dist.get_world_size()
local_rank = int(os.environ.get("LOCAL_RANK", 0))
if backend == "nccl":
    torch.cuda.set_device(local_rank)
    device = torch.device("cuda", local_rank)
else:
    device = torch.device("cpu")
'''

_FOOTER = '''
if dist.is_initialized():
    dist.destroy_process_group()
'''


# A group made again on the same store keys would read the old group's addresses: fresh keys each time.
# On torchrun's store: a cell may have written its own MASTER_ADDR/PORT (the DDP tutorial's setup() does), where
# under torchrun nobody listens, so the rendezvous would wait there for its whole timeout.
_LAUNCH_ENV = """launch_env = {k: os.environ[k] for k in ("MASTER_ADDR", "MASTER_PORT")}  # torchrun's, to make the group again
"""
_REINIT = """if not dist.is_initialized():  # the kit re-creates the default group after a cell destroys it
    os.environ.update(launch_env)
    dist.init_process_group(backend, store=dist.PrefixStore("{prefix}", next(dist.rendezvous("env://"))[0]),
                            rank=rank, world_size=world_size)
"""


_TIMEOUT = """# The kit's --pg-timeout ({s:g} s), for the default group and, as in the kit, for every group made later
# without its own (new_group, each DeviceMesh dimension): torch's module default, 30 min (gloo) / 10 min (NCCL).
import datetime
import torch.distributed.distributed_c10d as c10d
pg_timeout = datetime.timedelta(seconds={s!r})
c10d.default_pg_timeout = pg_timeout
if c10d.default_pg_nccl_timeout is not None:
    c10d.default_pg_nccl_timeout = pg_timeout
dist.init_process_group(backend, timeout=pg_timeout)
"""


_DISPLAY = """
def display(*objs, **kwargs):  # the kit's ranks show display() in the notebook; a script prints the objects
    print(*objs)
"""


def export_script(cells: list[CellRecord], name: str, world_size: int, pg_timeout_s: float | None = None) -> str:
    kept = [c for c in cells if c.exported]
    bodies, future = {}, []
    for c in kept:
        names, bodies[id(c)] = split_future(c.source.rstrip("\n"))
        future += [n for n in names if n not in future]
    hoisted = (f"from __future__ import {', '.join(future)}  # from the cells below: Python wants it first\n"
               if future else "")
    timeout = _TIMEOUT.format(s=float(pg_timeout_s)) if pg_timeout_s else "dist.init_process_group(backend)\n"
    if any(destroys(bodies[id(c)]) for c in kept):
        timeout += _LAUNCH_ENV
    parts = [_HEADER.format(name=one_line(name), n=world_size, future=hoisted, timeout=timeout)]
    if any(names_in(bodies[id(c)]) & {"display"} for c in kept):  # the ranks define it; under torchrun: NameError
        parts.append(_DISPLAY)
    for c in cells:
        if c not in kept:
            why = ("ran with --expect-error (it fails on purpose)" if c.expect_error else
                   "ran with --fresh in separate processes" if c.fresh else
                   f"failed: {c.error or 'an error'}" if not c.ok else
                   "ran on ranks that a later `%dist restart` or `shutdown` replaced: its variables were gone after it")
            parts.append(f"\n{commented(f'--- {c.label}: left out, it {why} ---')}\n{commented(c.source)}\n")
            continue
        body = guard_init(bodies[id(c)])
        if c.ranks is not None:  # `--ranks 0`: only those ranks ran it
            body = f"if rank in {tuple(c.ranks)!r}:\n" + (indented(body) if body.strip() else "    pass")
        title = (f"--- {c.label} (%dist push {c.flags}): the values the kernel sent then ---" if c.pushed is not None
                 else f"--- {c.label} (%%distributed {c.flags}".rstrip() + ") ---")
        reinit = _REINIT.format(prefix=f"kit-reinit-{len(parts)}") if destroys(body) else ""
        parts.append(f"\n{commented(title)}\n{body}\n{reinit}")
    if not kept:
        parts.append("\n# (no %%distributed cell had run successfully when this was exported)\n")
    parts.append(_FOOTER)
    return "".join(parts)


_HOST = re.compile(r"[A-Za-z0-9._:%\[\]-]+")


def slurm_script(nodes: int, gpus_per_node: int, attach: str, key_file: str, job_name: str = "kit-attach",
                 time_limit: str = "01:00:00") -> str:
    """An sbatch script: one task per node, each starting torchrun, whose ranks attach to the notebook.
    Raises ValueError for counts below 1 node / 0 GPUs, and for a host that is not a host name (a line
    break there would end its comment line, and bash would run the rest)."""
    host, _, port = attach.rpartition(":")
    if not port.lstrip("-").isdigit() or not 1 <= int(port) <= 65535:
        raise ValueError(f"--port {port}: a port is a number from 1 to 65535 (the one `%dist attach` listens on)")
    if not _HOST.fullmatch(host):
        raise ValueError(f"--host {host!r} is not a host name or address (letters, digits, '.', '-', ':')")
    if nodes < 1:
        raise ValueError(f"--nodes {nodes}: a job needs at least 1 node")
    if gpus_per_node < 0:
        raise ValueError(f"--gpus-per-node {gpus_per_node}: use 0 for CPU nodes, or the GPUs each node has")
    if one_line(key_file) != key_file:
        raise ValueError(f"--key-file {key_file!r} holds a line break or control character")
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


def write_script(path: str, text: str, force: bool = False) -> None:
    """Write a new file at `path` (mode 0644, or replacing a regular file's contents with `force`), never
    through a symbolic link. Raises ValueError saying what is in the way and what to do."""
    if os.path.islink(path):
        raise ValueError(f"{path} is a symbolic link; the kit never writes through one. Remove it, or name "
                         f"another file")
    if os.path.isdir(path):
        raise ValueError(f"{path} is a directory; name a file inside it, e.g. {os.path.join(path, 'train.py')}")
    flags = os.O_WRONLY | os.O_CREAT | getattr(os, "O_NOFOLLOW", 0) | (os.O_TRUNC if force else os.O_EXCL)
    try:
        fd = os.open(path, flags, 0o644)
    except FileExistsError:
        raise ValueError(f"{path} already exists; add --force to overwrite it, or name another file") from None
    except OSError as e:
        if e.errno == errno.ELOOP:  # it became a link after the check above
            raise ValueError(f"{path} is a symbolic link; the kit never writes through one") from None
        raise ValueError(f"cannot write {path}: {e.strerror}") from None
    with os.fdopen(fd, "w") as f:
        f.write(text)
