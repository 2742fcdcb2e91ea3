"""Run a notebook top to bottom as Jupyter's Run All does, in this fresh process: `python notebook_driver.py
IN.ipynb OUT.ipynb CWD [CGROUP_PROCS] [--allow-errors]`.

Why a process of its own: on Binder the Jupyter server shares the container's memory limit with the kernel
and its ranks, so a lesson's memory test must count the process that drives the kernel too. This process
writes itself into CGROUP_PROCS before it imports nbclient or starts the kernel: the driver, the kernel,
its ranks and everything they start are charged to that cgroup, as on Binder. (A fork of pytest would not
do: pages it shares with its parent stay charged to the parent's cgroup.)
OUT receives the notebook with its outputs, also after a failing cell; the exit status is 0 when every
cell ran (or --allow-errors), 1 when a cell failed or the kernel died (the error on stderr).
"""
from __future__ import annotations

import sys


def main(argv: list[str]) -> int:
    allow_errors = "--allow-errors" in argv
    args = [a for a in argv if a != "--allow-errors"]
    src, out, cwd = args[:3]
    if len(args) > 3:
        import os
        with open(args[3], "w") as f:  # before anything big is imported: all of it is charged inside
            f.write(str(os.getpid()))
    import os
    import tempfile

    import nbclient
    import nbformat
    from traitlets.config import Config

    nb = nbformat.read(src, as_version=4)
    with tempfile.TemporaryDirectory(prefix="kit-nb-") as sockets:
        # Unix sockets, not TCP ports: jupyter_client picks a free port, closes it and hands it to the kernel,
        # and another process (a rank, the other test worker) can take it in between ("Address already in use").
        # Configured, not a KernelManager passed in: the client then owns the kernel and shuts it down.
        config = Config({"KernelManager": {"transport": "ipc", "ip": os.path.join(sockets, "k")}})
        client = nbclient.NotebookClient(nb, config=config, timeout=300, kernel_name="python3",
                                         allow_errors=allow_errors, resources={"metadata": {"path": cwd}})
        try:
            client.execute()
            return 0
        except Exception as e:  # a failing cell (CellExecutionError) or a dead kernel (DeadKernelError)
            print(f"{type(e).__name__}: {e}", file=sys.stderr)
            return 1
        finally:
            nbformat.write(nb, out)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
