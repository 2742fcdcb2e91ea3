"""The public surface: every lazily exported name is listed in `__all__` and `dir()`, resolves, and
tab-completes in IPython (jedi on and off), because completion asks `dir()` and a name only
`__getattr__` knows is never offered; the benches' ranks come from the public `cluster_for`."""
from __future__ import annotations

import importlib
import json
import subprocess
import sys
import textwrap

import pytest

PACKAGES = ("kit", "kit.experiments", "kit.plots", "kit.widgets")


@pytest.mark.parametrize("package", PACKAGES)
def test_every_lazy_name_is_listed_by_all_and_dir_and_resolves(package):
    mod = importlib.import_module(package)
    lazy = set(mod._LAZY)
    assert lazy - set(mod.__all__) == set(), "exported lazily but missing from __all__"
    assert set(mod.__all__) - set(dir(mod)) == set(), "in __all__ but not offered by dir()"
    assert [n for n in mod.__all__ if not hasattr(mod, n)] == [], "listed but not importable"


@pytest.mark.parametrize("package", PACKAGES)
def test_dir_offers_only_the_public_names(package):
    # Tab completion lists dir(): the module's own imports (`annotations` from __future__, typing's `Any`,
    # the lazy helpers) are not things a learner can use, so they must not be offered beside the real names.
    mod = importlib.import_module(package)
    public = [n for n in dir(mod) if not n.startswith("_")]
    stray = [n for n in public if n not in mod.__all__
             and not getattr(getattr(mod, n), "__name__", "").startswith(package + ".")]
    assert stray == [], f"dir({package}) offers names that are not its public surface"


def test_subpackages_are_reachable_from_import_kit():
    # `import kit` then `kit.widgets.plan_panel()` (or completing `kit.widgets.`) works without a second import.
    code = "import kit; print(kit.widgets.plan_panel.__name__, kit.plots.__name__, 'experiments' in dir(kit))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.stdout.split() == ["plan_panel", "kit.plots", "True"], out.stderr[-2000:]


# What a learner types, and names the completion must offer (it may offer more).
TYPED = {
    "kit.Clu": {"Cluster"},
    "kit.experiments.check_": {"check_tp", "check_sp", "check_ring_attention", "check_ep", "check_mesh"},
    "kit.experiments.cluster_f": {"cluster_for"},
    "kit.plots.step_": {"step_breakdown", "step_timeline"},
    "kit.widgets.lab_": {"lab_bench"},
    "kit.wid": {"widgets"},
}


@pytest.mark.parametrize("use_jedi", [True, False])
def test_ipython_tab_completion_offers_the_lazy_names(use_jedi):
    # A fresh interpreter: IPython's shell is a process-wide singleton that test_magics owns here.
    code = textwrap.dedent(f"""
        import json
        from IPython.core.interactiveshell import InteractiveShell
        from IPython.core.completer import provisionalcompleter
        shell = InteractiveShell.instance()
        shell.run_cell("import kit, kit.experiments, kit.plots, kit.widgets")
        shell.Completer.use_jedi = {use_jedi}
        with provisionalcompleter():
            print(json.dumps({{t: [c.text.rpartition(".")[2] for c in shell.Completer.completions(t, len(t))]
                              for t in {sorted(TYPED)!r}}}))
    """)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=180, check=True)
    offered = json.loads(out.stdout.strip().splitlines()[-1])
    missing = {t: sorted(want - set(offered[t])) for t, want in TYPED.items() if want - set(offered[t])}
    assert not missing, f"not offered: {missing}"


def test_completing_a_lazy_package_imports_no_torch():
    """The first Tab on `kit.experiments.` (jedi on, IPython's default) offers the names without importing
    their modules: jedi's type probe once imported a rank-side module and torch with it (2.5-6 s, past
    JupyterLab's 1 s providerTimeout, so JupyterLab showed no list; +190 MiB in the kernel). A name used
    once is imported as usual, and completion then types it."""
    code = textwrap.dedent("""
        import json, sys
        from IPython.core.interactiveshell import InteractiveShell
        from IPython.core.completer import provisionalcompleter
        shell = InteractiveShell.instance()
        shell.run_cell("import kit")
        assert shell.Completer.use_jedi
        def offered(t):
            with provisionalcompleter():
                return {c.text: c.type for c in shell.Completer.completions(t, len(t))}
        first = offered("kit.experiments.")
        torch_after_tab = "torch" in sys.modules
        shell.run_cell("kit.experiments.run")  # a real use imports it
        print(json.dumps({"first": first, "torch": torch_after_tab, "after_use": offered("kit.experiments.ru")}))
    """)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=180, check=True)
    seen = json.loads(out.stdout.strip().splitlines()[-1])
    assert {"run", "sweep", "compare", "ExperimentConfig", "check_tp"} <= set(seen["first"]), seen["first"]
    assert not seen["torch"], "completing kit.experiments. imported torch into the kernel"
    assert seen["after_use"].get("run") == "function", seen["after_use"]


class _FakeCluster:
    def __init__(self, world_size: int) -> None:
        self.world_size, self.state = world_size, "ready"


def test_cluster_for_uses_the_given_cluster_and_refuses_another_size():
    from kit.experiments import cluster_for

    two = _FakeCluster(2)
    assert cluster_for(2, two) is two
    assert cluster_for(1, two) is two  # one-process work runs on rank 0 of any cluster
    with pytest.raises(ValueError, match="world_size=4 but the cluster has 2 ranks"):
        cluster_for(4, two)
    with pytest.raises(ValueError, match="an int >= 1"):
        cluster_for(0, two)
