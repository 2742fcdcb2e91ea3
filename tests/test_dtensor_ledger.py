"""Tensor-parallel code as the public examples write it (pytorch/examples' tensor_parallel_example: a toy MLP,
ColwiseParallel then RowwiseParallel on a 1-D mesh, AdamW, a few steps), on 2 CPU gloo ranks.

DTensor's collectives (its redistribution through torch's functional collectives, and the scatter and
broadcast `distribute_tensor` issues) appear in the ledger `%dist where` shows, with their shapes, as
`dist.*` ones do; and a module built on a group that a cell destroyed behaves as the `%dist export`
script does under torchrun."""
from __future__ import annotations

import re
import subprocess
import sys
import threading

from conftest import quiet, wait_until
from test_attach_hostile import env_without_torchrun
from test_export import shell  # noqa: F401  (the fixture: an IPython shell with the kit loaded)

WALL_CLOCK_S = 240
PG_TIMEOUT_S = 60.0

TP_EXAMPLE = """\
import torch.nn as nn
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module

class ToyModel(nn.Module):
    def __init__(self):
        super().__init__()
        self.in_proj = nn.Linear(10, 32)
        self.relu = nn.ReLU()
        self.out_proj = nn.Linear(32, 5)

    def forward(self, x):
        return self.out_proj(self.relu(self.in_proj(x)))

tp_mesh = init_device_mesh("cpu", (world_size,), mesh_dim_names=("tp",))
torch.manual_seed(0)
tp_model = parallelize_module(ToyModel(), tp_mesh, {"in_proj": ColwiseParallel(), "out_proj": RowwiseParallel()})
optimizer = torch.optim.AdamW(tp_model.parameters(), lr=0.25, foreach=True)
for i in range(2):
    torch.manual_seed(i)
    inp = torch.rand(20, 10)
    output = tp_model(inp)
    output.sum().backward()
    optimizer.step()
"""


def test_where_lists_dtensors_collectives_with_their_shapes(cluster):
    r = cluster.run(TP_EXAMPLE, on_output=quiet)
    assert r.ok, r.failures
    seen = cluster.where()
    for rank, text in seen.items():
        assert text.startswith("idle") and "recent collectives (oldest first):" in text, text
        # RowwiseParallel's Partial output becomes Replicate: one all_reduce of the [20, 5] output a step,
        # issued in the cell's forward (line 13) and waited for on first use
        steps = re.findall(r"line 13: all_reduce\(float32\[20, 5\], op=sum, group=mesh dim 'tp'\): "
                           r"ok, [\d.]+ ms", text)
        assert len(steps) == 2, text
        # parallelize_module's distribute_tensor: each Shard weight scattered, the Replicate bias broadcast
        # (a 1-D mesh over every rank uses the default group itself)
        assert "line 17: scatter(float32[16, 10], group=WORLD): ok" in text, text
        assert "line 17: broadcast(float32[5], group=WORLD): ok" in text, text


def test_where_names_the_dtensor_collective_a_rank_waits_in(cluster, tmp_path):
    release = tmp_path / "release"
    code = ("import os, time\nfrom torch.distributed.device_mesh import init_device_mesh\n"
            "from torch.distributed.tensor import distribute_tensor, Shard, Replicate\n"
            "mesh = init_device_mesh('cpu', (world_size,), mesh_dim_names=('tp',))\n"
            "d = distribute_tensor(torch.arange(8.0).reshape(4, 2), mesh, [Shard(0)])\n"
            f"if rank == 1:\n    while not os.path.exists({str(release)!r}): time.sleep(0.02)\n"
            "full = d.redistribute(mesh, [Replicate()]).to_local()\nfull.sum().item()")
    result: dict = {}
    cell = threading.Thread(target=lambda: result.update(r=cluster.run(code, on_output=quiet)))
    cell.start()
    try:
        # rank 0 may wait briefly in distribute_tensor's scatter (line 5) first: wait for the redistribution's gather
        seen = wait_until(lambda: (w := cluster.where([0])) and "waiting inside all_gather_single" in w[0] and w,
                          what="rank 0 inside DTensor's redistribution")
    finally:
        release.touch()
        cell.join()
    assert result["r"].ok and result["r"].values == {0: 28.0, 1: 28.0}, result["r"].failures
    # the first line stays the cell's line (the kernel's stuck checks read it: test_parallel_mistakes)
    assert seen[0].startswith("running <cell") and "line 8: full = d.redistribute" in seen[0], seen[0]
    assert seen[0].splitlines()[1].startswith("  waiting inside all_gather_single(float32[2, 2], gather_dim=0, "
                                              "group=mesh dim 'tp') at line 8"), seen[0]
    assert "line 8, in <module>: full = d.redistribute(mesh, [Replicate()]).to_local()" in seen[0], seen[0]


AFTER_DESTROY = "print(f'after destroy {tp_model(torch.ones(3, 10)).sum().item():.4f}')"


def test_a_tp_module_after_destroy_process_group_does_what_the_export_does_under_torchrun(shell, tmp_path, capsys):
    """The kit re-creates the default group after a cell destroys it, and `%dist export` writes the same
    into the script. torch names every re-created default group "0" again and a DeviceMesh finds its
    group by that name, so the TP module keeps working in both; the cell's note says so, and that a
    script which does not re-create the group fails there with torch's own error (checked here too)."""
    before = TP_EXAMPLE + "print(f'before destroy {tp_model(torch.ones(3, 10)).sum().item():.4f}')"
    assert shell.run_cell("%%distributed --cpus 2\n" + before, store_history=True).success
    capsys.readouterr()
    assert shell.run_cell("%%distributed\ndist.destroy_process_group()", store_history=True).success
    note = "".join(capsys.readouterr())
    assert shell.run_cell("%%distributed\n" + AFTER_DESTROY, store_history=True).success
    kit_printed = re.findall(r"after destroy -?[\d.]+", "".join(capsys.readouterr()))
    assert len(kit_printed) == 2 and kit_printed[0] == kit_printed[1], kit_printed
    assert "DeviceMesh" in note and 'default group "0" again' in note, note
    assert "Could not resolve the process group registered under the name 0" in note, note

    path = tmp_path / "train.py"
    shell.run_line_magic("dist", f"export {path}")
    run = _torchrun(path, tmp_path)
    assert run.returncode == 0, run.stderr[-3000:]
    assert re.findall(r"after destroy -?[\d.]+", run.stdout) == kit_printed, run.stdout

    # the same cells as a script that does not make the group again: torch's error, as the note says
    plain = path.read_text().replace("if not dist.is_initialized():  # the kit re-creates", "if False:  #")
    assert plain != path.read_text()
    path.write_text(plain)
    run = _torchrun(path, tmp_path)
    assert run.returncode != 0 and "Could not resolve the process group registered under the name 0" in run.stderr, \
        run.stderr[-3000:]


def _torchrun(path, cwd) -> subprocess.CompletedProcess:
    env = env_without_torchrun(GLOO_SOCKET_IFNAME="lo", OMP_NUM_THREADS="1")
    return subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2",
                           "--max-restarts", "0", str(path)], env=env, capture_output=True, text=True, timeout=120,
                          start_new_session=True, cwd=cwd)


COMPILED = """\
import os, sys, tempfile, torch, torch.distributed as dist
from kit.rank.ledger import Ledger
from kit.rank.ledger_dtensor import install_dtensor
ledger = Ledger(0)
install_dtensor(ledger)  # as a rank does, before torch imports the functional collectives
dist.init_process_group("gloo", store=dist.FileStore(os.path.join(tempfile.mkdtemp(), "store"), 1), rank=0,
                        world_size=1)
import torch.distributed._functional_collectives as funcol

def step(x):
    return funcol.wait_tensor(funcol.all_reduce(x * 2, "sum", dist.group.WORLD)) + 1

eager = step(torch.ones(3))
recorded = len(ledger.entries)
compiled = torch.compile(step, fullgraph=True, backend="eager")(torch.ones(3))
print(eager.tolist(), compiled.tolist(), recorded, len(ledger.entries) - recorded, [e.sig for e in ledger.entries])
dist.destroy_process_group()
"""


def test_the_wrappers_step_aside_under_torch_compile_fullgraph():
    """A compiled graph is traced as torch's own functions: `fullgraph=True` (which refuses any graph break)
    compiles a step calling the wrapped functional collectives, and nothing is recorded while tracing."""
    run = subprocess.run([sys.executable, "-c", COMPILED], capture_output=True, text=True, timeout=300,
                         env=env_without_torchrun(OMP_NUM_THREADS="1"))
    assert run.returncode == 0, run.stderr[-3000:]
    assert run.stdout.startswith("[3.0, 3.0, 3.0] [3.0, 3.0, 3.0] 1 0 ['all_reduce(float32[3], op=sum, group=WORLD)']"), \
        run.stdout + run.stderr[-2000:]


def test_a_wrongly_called_functional_collective_is_in_the_ledger_with_torchs_error():
    """`%dist where` and the ledger's tail list a functional collective the cell called wrongly (an unknown
    keyword, too many arguments), with torch's own TypeError, as they list one that failed inside."""
    import pytest
    import torch

    from kit.rank.ledger import Ledger
    from kit.rank.ledger_dtensor import _Recorder, _wrap

    def all_reduce(self, reduceOp, group, tag=""):  # the shape of torch's functional all_reduce
        return self
    ledger = Ledger.__new__(Ledger)
    ledger.entries, ledger.current, ledger.cell, ledger.suspect = [], None, "c", False
    wrapped = _wrap(_Recorder(ledger), "all_reduce", all_reduce, False, None)
    t = torch.zeros(2)
    assert wrapped(t, "sum", None) is t and len(ledger.entries) == 1
    for bad in (lambda: wrapped(t, "sum", None, nope=1), lambda: wrapped(t, "sum", None, "", 5)):
        before = len(ledger.entries)
        with pytest.raises(TypeError):
            bad()
        assert len(ledger.entries) == before + 1, "the wrong call is not in the ledger"
