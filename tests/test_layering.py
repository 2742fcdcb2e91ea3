"""Import layering: cheap `import kit`, workers free of front-end libraries, a torch-free kernel."""
from __future__ import annotations

import ast
import pathlib
import subprocess
import sys
import textwrap

KIT = pathlib.Path(__file__).resolve().parent.parent / "kit"
FRONT_END = ("IPython", "ipywidgets", "matplotlib")
# Modules that run inside worker processes (directly or via Cluster.call)
WORKER_SIDE = ["worker.py", "_rank_setup.py", "_cell.py", "_collectives.py", "_hooks.py", "protocol.py", "errors.py",
               "diagnose.py", "experiments"]


def _imports(path: pathlib.Path) -> set[str]:
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module:
            names.add(node.module)
    return names


def _files(entry: str) -> list[pathlib.Path]:
    p = KIT / entry
    return sorted(p.rglob("*.py")) if p.is_dir() else [p]


def test_worker_side_never_imports_front_end_libraries():
    for entry in WORKER_SIDE:
        for path in _files(entry):
            bad = {n for n in _imports(path) if n.split(".")[0] in FRONT_END}
            assert not bad, f"{path.relative_to(KIT)} imports {bad}"


def test_plots_do_not_reach_into_the_engine():
    for path in _files("plots"):
        bad = {n for n in _imports(path) if n.startswith(("kit.cluster", "kit.worker", "kit.magics", "kit.widgets"))}
        assert not bad, f"{path.relative_to(KIT)} imports {bad}"


def _fresh_python(code: str) -> str:
    return subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True,
                          timeout=120, check=True).stdout.strip()


def test_import_kit_is_cheap():
    out = _fresh_python("""
        import sys, kit, kit.experiments, kit.plots, kit.widgets
        print(sorted(m for m in ("torch", "IPython", "ipywidgets", "matplotlib") if m in sys.modules))
    """)
    assert out == "[]"


def test_the_kernel_never_imports_torch_to_run_cells_or_experiments():
    out = _fresh_python("""
        import sys
        from kit.cluster import Cluster
        from kit.experiments import ExperimentConfig, run
        with Cluster(world_size=2) as c:
            r = c.run("t = torch.ones(2)\\ndist.all_reduce(t)\\nt", on_output=lambda *a: None)
            reprs = r.reprs                                  # what the magic shows: text only
            rec = run(ExperimentConfig(steps=2, warmup_steps=1), cluster=c)
        print("torch" in sys.modules, reprs[0])
    """)
    assert out == "False tensor([2., 2.])"
