"""`%dist export` writes the executed %%distributed cells as a torchrun script that reproduces the
notebook's training (same final loss); `%dist slurm-script` writes an sbatch script around the attach command
(content only: no Slurm controller runs here)."""
from __future__ import annotations

import os
import re
import subprocess
import sys

import pytest

from conftest import assert_pids_gone
from test_attach_hostile import env_without_torchrun, interpreter_argv

WALL_CLOCK_S = 180

SETUP = """g = torch.Generator().manual_seed(rank)
X = torch.randn(64, 4, generator=g)
y = X @ torch.tensor([1.0, -2.0, 3.0, 0.5])
w = torch.zeros(4, requires_grad=True)"""
TRAIN = """for step in range(25):
    loss = ((X @ w - y) ** 2).mean()
    loss.backward()
    dist.all_reduce(w.grad)
    w.grad /= world_size
    with torch.no_grad():
        w -= lr * w.grad
    w.grad.zero_()
final = loss.item()
print(f"final loss {final:.6f} on rank {rank}")"""


@pytest.fixture
def shell():
    IPython = pytest.importorskip("IPython")
    from IPython.testing.globalipapp import start_ipython

    ip = start_ipython() or IPython.get_ipython()
    ip.run_line_magic("load_ext", "kit")
    yield ip
    from kit.notebook.magics import get_cluster

    cluster = get_cluster()
    pids = list(cluster.pids.values()) if cluster else []
    ip.run_line_magic("unload_ext", "kit")
    assert_pids_gone(pids)


def test_export_runs_under_torchrun_with_the_notebooks_final_loss(shell, tmp_path):
    from kit.notebook.magics import get_cluster

    assert shell.run_cell("%%distributed --cpus 2\n" + SETUP, store_history=True).success
    # a value the cells use, pushed from the kernel: before, the script lacked it (NameError under torchrun)
    assert shell.run_cell("lr = 0.05\n%dist push lr", store_history=True).success
    assert not shell.run_cell("%%distributed\nif rank == 1:\n    raise ValueError('oops')", store_history=True).success
    assert shell.run_cell("%%distributed --expect-error\nundefined_name", store_history=True).success
    assert shell.run_cell("%%distributed --ranks 0\nprint('only rank 0')", store_history=True).success
    assert shell.run_cell("%%distributed\n" + TRAIN, store_history=True).success
    notebook = {r: v["final"] for r, v in get_cluster().pull("final").items()}
    path = tmp_path / "train.py"
    shell.run_line_magic("dist", f"export {path}")
    text = path.read_text()
    assert text.startswith("#!/usr/bin/env python") and "torchrun --nproc-per-node 2" in text
    assert "left out, it failed: rank 1 raised ValueError at line 2" in text and "# if rank == 1:" in text
    assert "left out, it ran with --expect-error" in text and "# undefined_name" in text
    assert "if rank in (0,):\n    print('only rank 0')" in text
    assert "(%dist push lr): the values the kernel sent then ---\nlr = 0.05\n" in text
    env = env_without_torchrun(GLOO_SOCKET_IFNAME="lo", OMP_NUM_THREADS="1")
    run = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2",
                          "--max-restarts", "0", str(path)], env=env, capture_output=True, text=True, timeout=120,
                         start_new_session=True)
    assert run.returncode == 0, run.stderr[-3000:]
    got = {int(r): float(v) for v, r in re.findall(r"final loss ([\d.]+) on rank (\d)", run.stdout)}
    assert got == {r: float(f"{v:.6f}") for r, v in notebook.items()}, (got, notebook)
    assert run.stdout.count("only rank 0") == 1


def test_slurm_script_wraps_the_attach_command(shell, tmp_path):
    path = tmp_path / "job.sbatch"
    shell.run_line_magic("dist", f"slurm-script {path} --nodes 2 --gpus-per-node 4 --host login1 --port 29650 "
                                 f"--key-file /home/me/.distributed-kit/attach.key")
    text = path.read_text()
    assert text.startswith("#!/bin/bash") and "#SBATCH --nodes=2" in text and "#SBATCH --ntasks-per-node=1" in text
    assert "#SBATCH --gres=gpu:4" in text and "--nnodes 2 --nproc-per-node 4 --max-restarts 0" in text
    assert "--rdzv-endpoint \"$NODE0:29400\"" in text and "scontrol show hostnames" in text
    assert "-m kit.rank.worker --attach login1:29650 --key-file /home/me/.distributed-kit/attach.key" in text
    assert "%dist attach --world-size 8" in text
    subprocess.run(["bash", "-n", str(path)], check=True)  # valid shell


def test_dist_attach_waits_for_ranks_started_before_it_and_times_out_clearly(shell, tmp_path):
    """Nodes may start first (a batch job): ranks keep trying to connect; `%dist attach` then takes them."""
    import socket
    import threading
    import time

    from kit.engine.attach import attach_command
    from kit.errors import WorkerStartError
    from kit.notebook.magics import get_cluster

    key = str(tmp_path / "k.key")
    with pytest.raises(WorkerStartError, match=r"only 0/2 ranks attached within 1 s"):
        shell.run_line_magic("dist", f"attach --world-size 2 --key-file {key} --timeout 1")
    ports = []
    for _ in range(2):
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            ports.append(s.getsockname()[1])
    argv = interpreter_argv(attach_command("127.0.0.1", ports[0], key, 2, 1, f"127.0.0.1:{ports[1]}"))
    env = env_without_torchrun(GLOO_SOCKET_IFNAME="lo")
    nodes = [subprocess.Popen(argv, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                              start_new_session=True) for _ in range(2)]
    waiting = [threading.Event() for _ in nodes]

    def read(node: subprocess.Popen, said: threading.Event) -> None:  # drained to the end: a full pipe blocks
        for line in node.stderr:
            if "does not answer yet" in line:
                said.set()
    readers = [threading.Thread(target=read, args=pair, daemon=True) for pair in zip(nodes, waiting)]
    for reader in readers:
        reader.start()
    try:
        deadline = time.monotonic() + 120  # each node's rank tried, found no listener, and keeps trying
        assert all(w.wait(max(0.0, deadline - time.monotonic())) for w in waiting), \
            "the nodes' ranks never said they wait for the notebook"
        shell.run_line_magic("dist", f"attach --world-size 2 --port {ports[0]} --key-file {key} --timeout 90")
        assert shell.run_cell("%%distributed\nt = torch.ones(1)\ndist.all_reduce(t)\nsaw = t.item()").success
        assert get_cluster().pull("saw") == {0: {"saw": 2.0}, 1: {"saw": 2.0}}
        shell.run_line_magic("dist", "shutdown")
        for node in nodes:
            assert node.wait(timeout=30) == 0  # a clean stop: torchrun reports success
    finally:
        for node in nodes:
            if node.poll() is None:
                os.killpg(node.pid, 9)


def _torchrun(path, cwd) -> subprocess.CompletedProcess:
    env = env_without_torchrun(GLOO_SOCKET_IFNAME="lo", OMP_NUM_THREADS="1")
    return subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2",
                           "--max-restarts", "0", str(path)], env=env, capture_output=True, text=True, timeout=120,
                          start_new_session=True, cwd=cwd)


HOSTILE_ERROR = ("if rank == 1:\n"
                 "    raise ValueError('bad\\nopen(\"PWNED\", \"w\")\\r\\rimport os; os.mkdir(\"PWNED2\")"
                 "\\x00\\u2028print(\"PWNED3\")')")
FUTURE = ("from __future__ import annotations\ndef f(x: NotDefinedAnywhere) -> int:\n    return 1\n"
          "notes = f.__annotations__\nprint(f'annotations {notes}')")  # one write: two ranks share the pipe
TRIPLE = 's = """line one\nline two\n    indented\n"""\nt = f"""{s}\nmore"""\nprint(f"lengths {len(s)} {len(t)}")'  # one write each: two ranks share the pipe


def test_exported_script_does_what_the_cells_did_with_hostile_errors_strings_and_future(shell, tmp_path):
    """A failed cell's multi-line error text (with code after each line break) stays a
    comment; `--ranks` keeps triple-quoted strings as they were; `from __future__` lines are hoisted. The
    script runs under torchrun and prints what the cells printed, and nothing from the error text runs."""
    from kit.notebook.magics import get_cluster

    assert shell.run_cell("%%distributed --cpus 2\n" + FUTURE, store_history=True).success
    assert not shell.run_cell("%%distributed\n" + HOSTILE_ERROR, store_history=True).success
    assert shell.run_cell("%%distributed --ranks 0\n" + TRIPLE, store_history=True).success
    lengths = get_cluster().pull(["s", "t"], [0])[0]
    notes = get_cluster().pull("notes", [0])[0]["notes"]
    path = tmp_path / "train.py"
    shell.run_line_magic("dist", f"export {path}")
    text = path.read_text()
    compile(text, str(path), "exec")
    assert text.count("from __future__ import annotations") == 1
    run = _torchrun(path, tmp_path)
    assert run.returncode == 0, run.stderr[-3000:]
    assert not any(p.name.startswith("PWNED") for p in tmp_path.iterdir()) and "PWNED3" not in run.stdout
    assert run.stdout.count(f"lengths {len(lengths['s'])} {len(lengths['t'])}") == 1, run.stdout
    assert run.stdout.count(f"annotations {notes}") == 2, run.stdout


def test_export_and_slurm_script_refuse_to_overwrite_follow_symlinks_or_write_a_directory(shell, tmp_path):
    """An existing file needs --force; a symlink is never followed; a directory gets a clear message."""
    from IPython.core.error import UsageError

    assert shell.run_cell("%%distributed --cpus 2\nx = 1", store_history=True).success
    existing = tmp_path / "train.py"
    existing.write_text("precious\n")
    target = tmp_path / "target.py"
    target.write_text("not yours\n")
    (tmp_path / "link.py").symlink_to(target)
    (tmp_path / "dir.py").mkdir()
    for sub in ("export {p}", "slurm-script {p} --nodes 2 --host login1"):
        with pytest.raises(UsageError, match="already exists.*--force"):
            shell.run_line_magic("dist", sub.format(p=existing))
        assert existing.read_text() == "precious\n"
        for force in ("", " --force"):
            with pytest.raises(UsageError, match="symbolic link"):
                shell.run_line_magic("dist", sub.format(p=tmp_path / "link.py") + force)
            with pytest.raises(UsageError, match="is a directory"):
                shell.run_line_magic("dist", sub.format(p=tmp_path / "dir.py") + force)
        assert target.read_text() == "not yours\n"
    shell.run_line_magic("dist", f"export {existing} --force")
    assert "x = 1" in existing.read_text()


def test_slurm_script_refuses_a_newline_in_host_and_negative_counts(shell, tmp_path):
    """A newline in --host would end its comment line and run the rest in bash; counts must be >= 1 / 0."""
    from IPython.core.error import UsageError

    path = tmp_path / "job.sbatch"
    for flags, match in (("--nodes 2 --host 'login1\ntouch PWNED'", "--host"), ("--nodes -1", "--nodes"),
                         ("--nodes 0", "--nodes"), ("--nodes 2 --gpus-per-node -4", "--gpus-per-node"),
                         ("--nodes 2 --port -5", "^--port -5"), ("--nodes 2 --port 0", "^--port 0"),
                         ("--nodes 2 --port 99999", "^--port 99999")):  # not blamed on --host
        with pytest.raises(UsageError, match=match):
            shell.run_line_magic("dist", f"slurm-script {path} {flags}")
        assert not path.exists()


TUTORIAL_INIT = ('import torch.distributed as dist\ndist.init_process_group("gloo")\n'
                 't = torch.ones(1)\ndist.all_reduce(t)\nprint(f"first {t.item()}")\n'
                 'g = dist.new_group()\nprint(f"subgroup timeout {g._get_backend(torch.device(\'cpu\')).options._timeout}")')
SETUP_FN = ('def setup(backend="gloo"):\n    os.environ.setdefault("MASTER_ADDR", "localhost")\n'
            '    dist.init_process_group(backend=backend,\n                            rank=rank, world_size=world_size)\n'
            'import os\nsetup()')
AFTER_DESTROY = 't = torch.ones(1) * 3\ndist.all_reduce(t)\nprint(f"after destroy {t.item()}")'
# Python ends a line at \r too, and a form feed in the indentation resets its column count; U+2028 is no
# line break to Python (but is one to str.splitlines): each must stay inside the `if rank in (0,):` block.
ODD_BREAKS = 'x = 1\rprint(f"cr {x}")\nif x:\n    y = 2\n\x0cprint(f"ff {y}")\ns = "a\u2028b"\nprint(f"ls {len(s)}")'


# The PyTorch DDP tutorial's setup and cleanup (pytorch.org/tutorials/intermediate/ddp_tutorial.html): it sets its
# own MASTER_ADDR and MASTER_PORT before init_process_group, and destroys the group at the end.
DDP_TUTORIAL = ('import os\ndef setup(rank, world_size):\n    os.environ["MASTER_ADDR"] = "localhost"\n'
                '    os.environ["MASTER_PORT"] = "12355"\n'
                '    dist.init_process_group("gloo", rank=rank, world_size=world_size)\n'
                'def cleanup():\n    dist.destroy_process_group()\n'
                'setup(rank, world_size)\nt = torch.ones(1)\ndist.all_reduce(t)\nprint(f"tutorial {t.item()}")\ncleanup()')


def test_export_of_the_ddp_tutorials_setup_and_cleanup_runs_under_torchrun(shell, tmp_path):
    """The kit re-creates the group after the tutorial's cleanup(); so must the script, on torchrun's store, not on
    the port the tutorial wrote into the environment (nobody listens there: the script hung)."""
    assert shell.run_cell("%%distributed --cpus 2\n" + DDP_TUTORIAL, store_history=True).success
    assert shell.run_cell("%%distributed\n" + AFTER_DESTROY, store_history=True).success
    path = tmp_path / "tutorial.py"
    shell.run_line_magic("dist", f"export {path}")
    run = _torchrun(path, tmp_path)
    assert run.returncode == 0, run.stderr[-3000:]
    assert run.stdout.count("tutorial 2.0") == 2 and run.stdout.count("after destroy 6.0") == 2, run.stdout


def test_export_of_tutorial_init_destroy_and_odd_line_breaks_runs_under_torchrun(shell, tmp_path):
    """The kit's no-op `init_process_group` (a cell, a tutorial's setup function) and a
    `destroy_process_group()` cell become what runs under torchrun; lines split as Python splits them."""
    said = shell.run_cell("%%distributed --cpus 2 --pg-timeout 45\n" + TUTORIAL_INIT, store_history=True)
    assert said.success
    assert shell.run_cell("%%distributed\n" + SETUP_FN, store_history=True).success
    assert shell.run_cell("%%distributed\ndist.destroy_process_group()", store_history=True).success
    assert shell.run_cell("%%distributed\n" + AFTER_DESTROY, store_history=True).success
    assert shell.run_cell("%%distributed --ranks 0\n" + ODD_BREAKS, store_history=True).success
    path = tmp_path / "train.py"
    shell.run_line_magic("dist", f"export {path}")
    run = _torchrun(path, tmp_path)
    assert run.returncode == 0, run.stderr[-3000:]
    out = run.stdout
    assert out.count("first 2.0") == 2 and out.count("after destroy 6.0") == 2, out
    assert out.count("subgroup timeout 0:00:45") == 2, out  # the cells' --pg-timeout, as in the kit
    assert out.count("cr 1") == 1 and out.count("ff 2") == 1 and out.count("ls 3") == 1, out
