"""The public surface: every lazily exported name is listed in `__all__` and `dir()`, resolves, and
tab-completes in IPython (jedi on and off), because completion asks `dir()` and a name only
`__getattr__` knows is never offered; the benches' ranks come from the public `cluster_for`."""
from __future__ import annotations

import dataclasses
import importlib
import inspect
import json
import pydoc
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


def test_ipython_completes_the_keywords_a_factory_passes_on():
    """Inside the parentheses, as the README writes the imports: `plan_panel(mo` offered nothing (its `**kw`),
    nor `Cluster(wor` or `ExperimentConfig(strat`, jedi on or off. Checked by hand on IPython 7.34 with jedi
    0.19.1 (Colab's) too."""
    code = textwrap.dedent("""
        import json
        from IPython.core.interactiveshell import InteractiveShell
        from IPython.core.completer import provisionalcompleter
        shell = InteractiveShell.instance()
        shell.run_cell("from kit import Cluster; from kit.widgets import plan_panel; from kit.experiments import ExperimentConfig")
        offered = {}
        for use_jedi in (True, False):
            shell.Completer.use_jedi = use_jedi
            for t in ("plan_panel(mo", "Cluster(wor", "ExperimentConfig(strat"):
                with provisionalcompleter():
                    offered[f"{t} jedi={use_jedi}"] = [c.text for c in shell.Completer.completions(t, len(t))]
        print(json.dumps(offered))
    """)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=180, check=True)
    offered = json.loads(out.stdout.strip().splitlines()[-1])
    want = {"plan_panel(mo": "model=", "Cluster(wor": "world_size=", "ExperimentConfig(strat": "strategy="}
    missing = [t for t, names in offered.items() if want[t.split(" ")[0]] not in names]
    assert missing == [], f"not offered: {missing}: {offered}"


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


def _named(callable_: object) -> list[tuple[str, object, object]]:
    return [(p.name, p.kind, p.default) for p in inspect.signature(callable_).parameters.values()]


def test_factories_show_the_keywords_they_take_with_their_defaults():
    """help(), `?` and IPython's completion read inspect.signature: `plan_panel(**kw)` showed `**kw` where
    PlanPanel's keywords were meant, `Cluster(config=None, **kwargs)` hid LaunchConfig's fields, and
    ExperimentConfig showed its `__new__`'s `(*args, **kw)` instead of its fields; `lab_bench` restated
    LabBench's defaults and left out its `knobs`."""
    import kit
    from kit.experiments import ExperimentConfig
    from kit.widgets import PlanPanel, plan_panel

    keyword_only = inspect.Parameter.KEYWORD_ONLY
    assert _named(plan_panel) == [(n, keyword_only, d) for n, _, d in _named(PlanPanel)]
    assert ("model", keyword_only, "llama3-8b") in _named(plan_panel)  # PlanPanel's default, the one copy
    assert _named(kit.Cluster) == [("config", inspect.Parameter.POSITIONAL_OR_KEYWORD, None)] + [
        (n, keyword_only, d) for n, _, d in _named(kit.LaunchConfig)]
    from kit.widgets import LabBench, lab_bench
    assert _named(lab_bench) == [("cluster", inspect.Parameter.POSITIONAL_OR_KEYWORD, None)] + [
        (n, keyword_only, d) for n, _, d in _named(LabBench)[1:]]  # knobs= too, with LabBench's default
    assert len(str(inspect.signature(lab_bench))) < 200  # help shows `knobs=None`, not the 27 knobs' reprs
    assert [n for n, _, _ in _named(ExperimentConfig)] == [f.name for f in dataclasses.fields(ExperimentConfig)]
    assert ("strategy", inspect.Parameter.POSITIONAL_OR_KEYWORD, "ddp") in _named(ExperimentConfig)
    shown = pydoc.render_doc(plan_panel, renderer=pydoc.plaintext)
    assert "plan_panel(*, model: 'str' = 'llama3-8b', nodes" in shown and "**kw" not in shown


def test_a_factorys_misspelt_keyword_names_the_one_meant_before_anything_is_built():
    import kit
    from kit.widgets import plan_panel

    with pytest.raises(TypeError, match=r"plan_panel\(\) has no keyword mdoel= \(did you mean model=\?\); its "
                                        r"keywords: model, nodes, gpus_per_node"):
        plan_panel(mdoel="llama3-70b")
    with pytest.raises(TypeError, match=r"Cluster\(\) has no keyword wrld_size= \(did you mean world_size=\?\); "
                                        r"its keywords: config, world_size"):
        kit.Cluster(wrld_size=2)
    assert kit.Cluster(world_size=3).config == kit.LaunchConfig(world_size=3)  # starts nothing until used


@pytest.mark.parametrize("package", PACKAGES)
def test_no_public_callable_hides_its_keywords_behind_star_star(package):
    """Every public function and class of the four packages shows what it takes: a `**kw` or `*args` it
    passes on lists nothing in help() or completion (kit.keywords.passes_keywords_to says how to show them)."""
    mod = importlib.import_module(package)
    hidden = {}
    for name in mod.__all__:
        obj = getattr(mod, name)
        if not callable(obj) or inspect.ismodule(obj):
            continue
        try:
            params = inspect.signature(obj).parameters.values()
        except (TypeError, ValueError):  # a builtin without a signature
            continue
        stars = [p.name for p in params if p.kind in (p.VAR_KEYWORD, p.VAR_POSITIONAL)]
        if stars:
            hidden[name] = stars
    assert hidden == {}, f"{package}: these show */** instead of their parameters"


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
