"""Run a notebook top to bottom as Jupyter's Run All does, in this fresh process: `python notebook_driver.py
IN.ipynb OUT.ipynb CWD [CGROUP_PROCS] [--allow-errors]`.

Why a process of its own: on Binder the Jupyter server shares the container's memory limit with the kernel
and its ranks, so a lesson's memory test must count the process that drives the kernel too. This process
writes itself into CGROUP_PROCS before it imports nbclient or starts the kernel: the driver, the kernel,
its ranks and everything they start are charged to that cgroup, as on Binder. (A fork of pytest would not
do: pages it shares with its parent stay charged to the parent's cgroup.)
OUT receives the notebook with its outputs, also after a failing cell; the exit status is 0 when every
cell ran (or --allow-errors), 1 when a cell failed or the kernel died (the error on stderr).

A code cell tagged `rerun` runs a second time after the final cell, in the same kernel, as a learner runs an
earlier cell again once the lesson is done (the lesson has stopped ranks, removed or written folders ...).
The tagged cells run again last first, so that no cell's second run prepares the state the next one needs
(in order, a cell that writes a folder would hide that the cell after it fails alone). Each copy is appended
to OUT with `rerun_of` (the cell's id) in its metadata; its failure fails the run like any cell's.
Then the cells tagged `rerun-in-order` run again in the notebook's order: a learner who runs an earlier cell
again and goes on from there to a later one (a cell that stops the ranks or replaces a folder, then a cell
that uses them). A cell may carry both tags.
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
            if any(set(RERUN_TAGS) & set(c.metadata.get("tags", [])) for c in nb.cells):
                run_then_rerun(client, nb)
            else:
                client.execute()
            return 0
        except Exception as e:  # a failing cell (CellExecutionError) or a dead kernel (DeadKernelError)
            print(f"{type(e).__name__}: {e}", file=sys.stderr)
            return 1
        finally:
            nbformat.write(nb, out)


RERUN_TAGS = ("rerun", "rerun-in-order")


def run_then_rerun(client, nb) -> None:
    """Every cell in order (as `client.execute()` does), then each `rerun` cell again, last first, then each
    `rerun-in-order` cell again, in the notebook's order, in the same kernel."""
    import copy

    alone = [c for c in nb.cells if "rerun" in c.metadata.get("tags", [])]
    in_order = [c for c in nb.cells if "rerun-in-order" in c.metadata.get("tags", [])]
    with client.setup_kernel():
        for index, cell in enumerate(list(nb.cells)):
            client.execute_cell(cell, index, execution_count=client.code_cells_executed + 1)
        for n, cell in enumerate(list(reversed(alone)) + in_order):
            twice = copy.deepcopy(cell)
            twice.outputs, twice.id = [], f"{cell.id}-rerun{n}"  # a cell in both passes runs twice more
            twice.metadata = {"rerun_of": cell.id}
            nb.cells.append(twice)
            client.execute_cell(twice, len(nb.cells) - 1, execution_count=client.code_cells_executed + 1)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
