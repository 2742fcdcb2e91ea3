"""Layering: the folder says which process runs the code, imports flow one way, no circles,
cheap `import kit`, ranks free of front-end libraries, a torch-free kernel."""
from __future__ import annotations

import ast
import pathlib
import re
import subprocess
import sys
import textwrap

ROOT = pathlib.Path(__file__).resolve().parent.parent
KIT = ROOT / "kit"
FRONT_END = ("IPython", "ipywidgets", "matplotlib")
SHARED = ("kit._lazy", "kit._renamed", "kit._renamed_tables", "kit.config", "kit.cpus", "kit.errors", "kit.messages",
          "kit.payload", "kit.protocol", "kit.handshake", "kit.diagnose", "kit.units", "kit.keywords")
# The shared modules import one another one way too. The wire is three modules: what is said (frame kinds,
# typed bodies), what fits in one frame (the size limit, pickling under it), and how it travels (signing);
# the first two never learn how frames are signed or carried.
SHARED_MAY_IMPORT = {
    "kit._renamed_tables": (),  # what this release renamed: pure data
    "kit._renamed": ("kit._renamed_tables",),  # the hooks that read the tables
    "kit.cpus": (), "kit.diagnose": (), "kit.units": (),  # units: byte sizes, a leaf
    "kit.keywords": (),  # a misspelt keyword or key: the one meant, a leaf
    "kit._lazy": ("kit._renamed",),  # a name the package no longer has: the renamed table answers
    "kit.errors": ("kit.diagnose",),
    "kit.config": ("kit.cpus", "kit.errors"),
    "kit.messages": (),
    "kit.payload": (),
    "kit.protocol": ("kit.errors", "kit.payload"),
    "kit.handshake": ("kit.errors",),
}
# Which kit packages each layer may import (shared modules are always allowed). Data flows
# notebook -> engine -> (ranks, over the wire) ; experiments -> plots -> widgets.
MAY_IMPORT = {
    "shared": (),
    "engine": ("engine",),
    "rank": ("rank",),
    "notebook": ("engine", "notebook", "plots"),  # plots: the --profile timeline under the cell
    "experiments": ("engine", "rank", "experiments"),  # api.py drives a Cluster; strategies run on ranks
    "plots": ("plots", "experiments"),
    "widgets": ("widgets", "plots", "experiments"),
    "top": ("engine", "notebook"),  # kit/__init__.py (lazy exports, %load_ext) and `python -m kit demo`
}
# Inside kit/experiments the folder says the role; which may import which (the kernel side never
# imports rank-side code: api.py calls "kit.experiments.runner:run_rank" by name on the ranks).
EXPERIMENTS_MAY_IMPORT = {
    "choices": (),                                    # the config's vocabulary, pure data
    "models": ("models", "choices"),                  # the kit's torch models (sizes from choices)
    "theory": ("theory", "choices"),                  # formulas and the predictor, no torch
    "config": ("config", "choices", "theory"),        # config.py, config_rules.py
    "kernel": ("kernel", "config", "choices"),        # the package, api, comparison, records, record_readers, stats
    "measure": ("measure", "models", "theory", "choices"),      # rank side: workloads and instruments
    "parallel": ("parallel", "models", "measure", "theory", "choices"),  # the building blocks a lesson reads, by hand
    "strategies": ("strategies", "parallel", "models", "measure", "theory", "config", "choices"),
    "runner": ("strategies", "models", "measure", "theory", "config", "choices"),  # the rank's run loop
    "harness": ("harness", "strategies", "parallel", "models", "measure", "config", "choices"),  # tests' and benches' ranks
    "benchmarks": ("benchmarks", "kernel", "config", "choices", "theory", "measure"),  # measure: group_device on the ranks
}
# Code that runs inside worker processes (directly, or via Cluster.call on experiments)
RANK_SIDE = ("shared", "rank", "experiments")


def _module_name(path: pathlib.Path) -> str:
    parts = list(path.relative_to(KIT.parent).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _layer(module: str) -> str:
    if module in ("kit", "kit.__main__"):
        return "top"
    if module in SHARED:
        return "shared"
    return module.split(".")[1]


def _imports(path: pathlib.Path) -> set[str]:
    """Every import in the file, at any depth (function-level and TYPE_CHECKING ones too)."""
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module:
            names.add(node.module)
            if node.module == "kit":  # `from kit import plots` imports the module kit.plots
                names |= {f"kit.{a.name}" for a in node.names if (KIT / a.name).exists()
                          or (KIT / f"{a.name}.py").exists()}
    return names


def _graph() -> dict[str, set[str]]:
    modules = {_module_name(p): p for p in KIT.rglob("*.py")}
    graph: dict[str, set[str]] = {}
    for name, path in modules.items():
        deps = set()
        for imp in _imports(path):
            while imp and imp not in modules:  # kit.engine.cluster.Cluster -> kit.engine.cluster
                imp = imp.rpartition(".")[0]
            if imp and imp != name and imp != "kit":
                deps.add(imp)
        graph[name] = deps
    return graph


def test_every_module_lives_in_a_known_layer():
    unknown = {m for m in _graph() if _layer(m) not in MAY_IMPORT}
    assert not unknown, f"modules outside the layout (engine/, rank/, notebook/, experiments/, ...): {unknown}"


def test_imports_flow_one_way():
    bad = []
    for module, deps in _graph().items():
        layer = _layer(module)
        for dep in deps:
            dep_layer = _layer(dep)
            if dep_layer != "shared" and dep_layer not in MAY_IMPORT[layer]:
                bad.append(f"{module} ({layer}) imports {dep} ({dep_layer})")
    assert not bad, "\n".join(bad)


def test_shared_modules_import_one_way():
    graph = _graph()
    assert set(SHARED_MAY_IMPORT) == set(SHARED), "every shared module has its row in SHARED_MAY_IMPORT"
    bad = [f"{m} imports {d}" for m in SHARED for d in sorted(graph[m]) if d not in SHARED_MAY_IMPORT[m]]
    assert not bad, "\n".join(bad)


def _experiments_role(module: str) -> str:
    parts = module.split(".")
    if len(parts) > 3:
        return parts[2]
    name = parts[2] if len(parts) == 3 else ""
    return {"choices": "choices", "models": "models", "config": "config", "config_rules": "config", "config_parallel": "config",
            "runner": "runner"}.get(name, "kernel")


def test_experiments_folders_import_one_way():
    bad, roles = [], set()
    for module, deps in _graph().items():
        if _layer(module) != "experiments":
            continue
        role = _experiments_role(module)
        roles.add(role)
        for dep in deps:
            if _layer(dep) == "experiments" and (dep_role := _experiments_role(dep)) != role \
                    and dep_role not in EXPERIMENTS_MAY_IMPORT.get(role, ()):
                bad.append(f"{module} ({role}) imports {dep} ({dep_role})")
    assert roles <= set(EXPERIMENTS_MAY_IMPORT), f"folders outside the table: {roles - set(EXPERIMENTS_MAY_IMPORT)}"
    assert not bad, "\n".join(bad)


def test_no_import_circles():
    graph = _graph()
    cycles, state = [], {}

    def visit(node: str, stack: list[str]) -> None:
        state[node] = "open"
        for dep in sorted(graph.get(node, ())):
            if state.get(dep) == "open":
                cycles.append(" -> ".join(stack[stack.index(dep):] + [dep]))
            elif dep not in state:
                visit(dep, stack + [dep])
        state[node] = "done"

    for module in sorted(graph):
        if module not in state:
            visit(module, [module])
    assert not cycles, "import circles:\n" + "\n".join(cycles)


def test_rank_side_never_imports_front_end_libraries():
    for path in KIT.rglob("*.py"):
        if _layer(_module_name(path)) in RANK_SIDE:
            bad = {n for n in _imports(path) if n.split(".")[0] in FRONT_END}
            assert not bad, f"{path.relative_to(KIT)} imports {bad}"


# Pure-Python folders and the kernel's experiment modules: the kernel computes with them without
# starting a rank (a config checked, a run's records merged and judged), so they never import torch,
# not even through another kit module. A check at run time would only see the modules one call loads.
TORCH_FREE = ("kit.experiments.theory", "kit.experiments.api", "kit.experiments.records",
              "kit.experiments.record_readers", "kit.experiments.comparison", "kit.experiments.stats",
              "kit.experiments.config", "kit.experiments.config_rules", "kit.experiments.config_parallel", "kit.experiments.choices",
              "kit.experiments.run_record")
# ... and the package itself (its __init__, which `from kit.experiments import run` loads first), not its subpackages
TORCH_FREE_ONLY = ("kit.experiments",)


def _reaches_torch(module: str, graph: dict[str, set[str]], seen: set[str]) -> list[str] | None:
    """The import chain from `module` to torch, or None (every import at any depth counts)."""
    if module in seen:
        return None
    seen.add(module)
    path = KIT.parent / (module.replace(".", "/") + ".py")
    if not path.exists():
        path = KIT.parent / module.replace(".", "/") / "__init__.py"
    if any(n.split(".")[0] == "torch" for n in _imports(path)):
        return [module, "torch"]
    for dep in sorted(graph.get(module, ())):
        chain = _reaches_torch(dep, graph, seen)
        if chain:
            return [module] + chain
    return None


def test_the_vocabulary_is_read_from_choices_only():
    """One name, one path: kit and the benches read STRATEGIES, STAGED, ... from experiments/choices.py only;
    config.py re-exports them for a learner's `from kit.experiments.config import STRATEGIES`, and no kit module
    imports them from there (e.g. a module reading half of them through config, half from choices)."""
    import kit.experiments.choices as choices
    vocabulary = {n for n in choices.__all__ if n.isupper()}
    bad = []
    for path in [*KIT.rglob("*.py"), *(ROOT / "bench").glob("*.py")]:
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and node.module == "kit.experiments.config":
                bad += [f"{path.relative_to(ROOT)}: {a.name}" for a in node.names if a.name in vocabulary]
    assert not bad, "import these from kit.experiments.choices:\n" + "\n".join(bad)


def test_theory_and_the_kernel_experiment_modules_never_import_torch():
    graph = _graph()
    folders = [m for m in graph if any(m == f or m.startswith(f + ".") for f in TORCH_FREE)]
    assert folders, f"no modules under {TORCH_FREE}"
    assert set(TORCH_FREE_ONLY) <= set(graph), f"{TORCH_FREE_ONLY} not found"
    folders += TORCH_FREE_ONLY
    for module in sorted(folders):
        chain = _reaches_torch(module, graph, set())
        assert chain is None, " -> ".join(chain or [])


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
        from kit.engine.cluster import Cluster
        from kit.experiments import ExperimentConfig, run
        with Cluster(world_size=2) as c:
            r = c.run("t = torch.ones(2)\\ndist.all_reduce(t)\\nt", on_output=lambda *a: None)
            reprs = r.reprs                                  # what the magic shows: text only
            rec = run(ExperimentConfig(steps=2, warmup_steps=1), cluster=c)
        print("torch" in sys.modules, reprs[0])
    """)
    assert out == "False tensor([2., 2.])"


# A lesson or bench names kit code only through the packages that export it lazily, so moving a module
# never breaks a notebook; and nothing outside kit/ imports a private name (`_x`) from it.
PUBLIC_PACKAGES = ("kit", "kit.experiments", "kit.plots", "kit.widgets")
_KIT_IMPORT = re.compile(r"^\s*(?:from\s+(kit[\w.]*)\s+import\s+(.+)|import\s+(kit[\w.]*))", re.M)


def _kit_imports(path: pathlib.Path) -> list[tuple[str, list[str]]]:
    """(module, imported names) per kit import; a regex, since lesson sources hold `%%` magics."""
    out = []
    for m in _KIT_IMPORT.finditer(path.read_text()):
        names = [n.split(" as ")[0].strip(" ()") for n in (m[2] or "").split("#")[0].split(",")]
        out.append((m[1] or m[3], [n for n in names if n]))
    return out


def test_lessons_import_kit_only_from_its_public_packages():
    sources = sorted((ROOT / "lessons" / "src").glob("*.py"))
    assert sources, "no lesson sources found"
    deep = [f"{p.name}: {mod}" for p in sources for mod, _ in _kit_imports(p) if mod not in PUBLIC_PACKAGES]
    assert not deep, "import these from kit.experiments (or kit, kit.plots, kit.widgets):\n" + "\n".join(deep)


def test_lessons_and_benches_use_no_private_kit_name():
    """Neither `from kit.m import _x` nor `import kit.m as m` then `m._x` (gpu_checks_kit read
    `templates._TEMPLATES`): a private name may change with no notice, and the lesson or bench breaks."""
    files = sorted((ROOT / "lessons" / "src").glob("*.py")) + sorted((ROOT / "bench").glob("*.py"))
    bad = []
    for p in files:
        text, aliases = p.read_text(), set()
        for mod, names in _kit_imports(p):
            bad += [f"{p.relative_to(ROOT)}: {mod}.{n}" for n in names if n.startswith("_")]
            aliases |= {mod} | {n.split(" as ")[-1] for n in names}
        aliases |= set(re.findall(r"import\s+kit[\w.]*\s+as\s+(\w+)", text))
        aliases |= set(re.findall(r"from\s+kit[\w.]*\s+import\s+\w+\s+as\s+(\w+)", text))
        for alias in aliases:
            bad += [f"{p.relative_to(ROOT)}: {alias}.{n}" for n in
                    re.findall(rf"(?<![\w.]){re.escape(alias)}\.(_[A-Za-z]\w*)", text)]
    assert not bad, "\n".join(sorted(set(bad)))


def test_no_lazy_export_is_hidden_by_a_submodule_of_the_same_name():
    """`from kit.widgets import plan_panel` gives the function, not the module `kit/widgets/plan_panel.py`
    (importing a submodule binds its name on the package, over the lazy export, so no export may share
    a submodule's name)."""
    out = _fresh_python("""
        import importlib, pkgutil, kit
        for info in pkgutil.walk_packages(kit.__path__, "kit."):
            if not info.ispkg:
                continue
            pkg = importlib.import_module(info.name)
            for attr, target in getattr(pkg, "_LAZY", {}).items():
                module, _, name = target.partition(":")
                wanted = importlib.import_module(module) if target.endswith(":") else getattr(importlib.import_module(module), name or attr)
                if getattr(pkg, attr) is not wanted:
                    print(f"{info.name}.{attr}")
    """)
    assert out == "", f"lazy exports hidden by a submodule of the same name: {out}"


EXPERIMENTS = KIT / "experiments"


def _class_members(path: pathlib.Path, name: str) -> set[str]:
    """The names a class body declares: methods, annotated and assigned attributes."""
    cls = next(n for n in ast.parse(path.read_text()).body if isinstance(n, ast.ClassDef) and n.name == name)
    out: set[str] = set()
    for n in cls.body:
        if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef)):
            out.add(n.name)
        elif isinstance(n, ast.AnnAssign) and isinstance(n.target, ast.Name):
            out.add(n.target.id)
        elif isinstance(n, ast.Assign):
            out |= {t.id for t in n.targets if isinstance(t, ast.Name)}
    return out


def test_the_run_loop_reads_only_what_the_strategy_contract_declares():
    declared = _class_members(EXPERIMENTS / "strategies" / "base.py", "Strategy")
    tree = ast.parse((EXPERIMENTS / "runner.py").read_text())
    read = {n.attr for n in ast.walk(tree) if isinstance(n, ast.Attribute)
            and isinstance(n.value, ast.Name) and n.value.id == "strat"}
    assert read, "runner.py no longer names its strategy `strat`: update this test"
    assert read <= declared, f"runner.py reads {sorted(read - declared)}, which strategies/base.Strategy does not declare"
    by_name = _name_branches(tree)
    assert not by_name, f"the run loop branches on a strategy's name (ask the strategy instead): {by_name}"


def _name_branches(tree: ast.AST) -> list[str]:
    """Comparisons of a strategy's name with == or != (`cfg.strategy == "pipeline"`); `in` a group is fine."""
    return [ast.unparse(n) for n in ast.walk(tree) if isinstance(n, ast.Compare)
            and "strategy" in ast.unparse(n.left) and any(isinstance(op, (ast.Eq, ast.NotEq)) for op in n.ops)]


def test_no_strategy_class_branches_on_a_strategy_name():
    """A base class asks its subclass (an attribute the subclass sets, e.g. Pipeline's micro_batches), never
    `cfg.strategy == "pipeline"`: a strategy renamed or a new subclass would silently take the other branch."""
    by_name = [f"{path.name}: {b}" for path in sorted((EXPERIMENTS / "strategies").glob("*.py"))
               for b in _name_branches(ast.parse(path.read_text()))]
    assert not by_name, f"strategies/ branches on a strategy's name (let the subclass set an attribute): {by_name}"


def test_the_hand_written_parallelisms_differ_only_by_their_declared_parts():
    """tp, sp, cp, ep and tp on a mesh run through one HandParallel given a HandParts: no class derives
    from HandParallel (its overrides would be a second, undeclared contract), and HandParallel reads of
    its parts only the fields HandParts declares."""
    subclasses = [f"{path.relative_to(EXPERIMENTS)}:{c.name}" for path in sorted(EXPERIMENTS.rglob("*.py"))
                  for c in ast.walk(ast.parse(path.read_text())) if isinstance(c, ast.ClassDef)
                  and any(ast.unparse(b).rpartition(".")[2] == "HandParallel" for b in c.bases)]
    assert not subclasses, f"give HandParallel a HandParts instead of subclassing it: {subclasses}"
    path = EXPERIMENTS / "strategies" / "hand_parallel.py"
    declared = _class_members(path, "HandParts")
    read = {n.attr for n in ast.walk(ast.parse(path.read_text())) if isinstance(n, ast.Attribute)
            and ast.unparse(n.value) in ("parts", "self.parts", "run.parts")}
    assert read, "hand_parallel.py no longer reads `parts`, `self.parts` or `run.parts`: update this test"
    assert read <= declared, f"HandParallel reads {sorted(read - declared)} of its parts, which HandParts does not declare"


def test_the_interleaving_note_reads_the_plan_and_plans_nothing():
    """plan_notes.interleaving_note words what plan()'s search found (plan_search.unkept_of): it imports no rule,
    memory or time formula, so it cannot become a second small planner beside plan_search."""
    path = EXPERIMENTS / "theory" / "plan_notes.py"
    imported = {f"{n.module}:{a.name}" for n in ast.walk(ast.parse(path.read_text()))
                if isinstance(n, ast.ImportFrom) and (n.module or "").startswith("kit") for a in n.names}
    types = {"kit.experiments.theory.layout:Layout", "kit.experiments.theory.layout_memory:ParallelConfig",
             "kit.experiments.theory.plan_rules:Refusal", "kit:_renamed"}
    assert imported <= types, f"plan_notes.py imports {sorted(imported - types)}: let plan_search record it instead"


def test_strategies_holds_strategy_classes_and_their_plumbing_only():
    """The hand-written building blocks a lesson reads live in parallel/; strategies/ plugs them into
    the run loop: each module there defines a Strategy subclass, or is base, registry, common or
    hand_parts (the parts HandParallel runs tp, sp, cp and ep with: run-loop plumbing, not blocks)."""
    plumbing = {"__init__", "base", "registry", "common", "hand_parts"}
    classes: dict[str, list[str]] = {}  # class name -> its bases' names, over the folder
    per_module: dict[str, list[str]] = {}
    for path in sorted((EXPERIMENTS / "strategies").glob("*.py")):
        defs = [n for n in ast.parse(path.read_text()).body if isinstance(n, ast.ClassDef)]
        per_module[path.stem] = [c.name for c in defs]
        for c in defs:
            classes[c.name] = [b.id if isinstance(b, ast.Name) else getattr(b, "attr", "") for b in c.bases]

    def is_strategy(name: str, seen: frozenset = frozenset()) -> bool:
        return name == "Strategy" or any(is_strategy(b, seen | {name}) for b in classes.get(name, ()) if b not in seen)

    bad = [m for m, names in per_module.items() if m not in plumbing and not any(is_strategy(c) for c in names)]
    assert not bad, f"strategies/ modules without a Strategy subclass (move them to parallel/ or harness/): {bad}"


def test_every_check_a_lesson_calls_is_defined_in_parallel():
    """A learner following `from kit.experiments import check_mesh` to its source reads parallel/ (the block
    beside its check), never a strategies/ module full of run-loop classes; and no strategies/ module
    defines a check_* of its own (its checks are parallel/'s, called)."""
    import kit.experiments as x
    lazy = {name: target.split(":")[0] for name, target in x._LAZY.items() if name.startswith("check_")}
    elsewhere = {n: m for n, m in lazy.items() if n != "check_local" and not m.startswith("kit.experiments.parallel.")}
    assert not elsewhere, f"kit.experiments' checks defined outside parallel/: {elsewhere}"
    defined = [f"{path.name}: {n.name}" for path in sorted((EXPERIMENTS / "strategies").glob("*.py"))
               for n in ast.parse(path.read_text()).body if isinstance(n, ast.FunctionDef) and n.name.startswith("check")]
    assert not defined, f"strategies/ defines checks (move them beside their block in parallel/): {defined}"


def _private_reads_of_a_cluster(tree: ast.AST) -> list[int]:
    """Lines reading or writing `cluster._x` (or `x.cluster._x`): a Cluster's privates used from outside."""
    lines = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and node.attr.startswith("_") and not node.attr.startswith("__"):
            owner = node.value
            name = owner.id if isinstance(owner, ast.Name) else owner.attr if isinstance(owner, ast.Attribute) else ""
            if name.lstrip("_") == "cluster":
                lines.append(node.lineno)
    return lines


def _private_members(protocol: ast.ClassDef) -> list[str]:
    names = [n.target.id for n in protocol.body if isinstance(n, ast.AnnAssign) and isinstance(n.target, ast.Name)]
    names += [n.name for n in protocol.body if isinstance(n, ast.FunctionDef)]
    return [n for n in names if n.startswith("_") and not n.startswith("__")]


def test_the_engines_running_state_has_one_owner():
    """Only engine/cluster.py touches a Cluster's private state (the ranks' running state is handed to the
    engine's modules as a `Running`, engine/running.py); no module declares a Protocol of another class's
    privates, and no other class is named Cluster."""
    owner = KIT / "engine" / "cluster.py"
    bad = []
    for path in KIT.rglob("*.py"):
        tree = ast.parse(path.read_text())
        if path != owner:
            bad += [f"{path.relative_to(KIT)}:{n}: cluster._..." for n in _private_reads_of_a_cluster(tree)]
        for node in ast.walk(tree):
            if not isinstance(node, ast.ClassDef):
                continue
            if any(getattr(b, "id", getattr(b, "attr", "")) == "Protocol" for b in node.bases) \
                    and _private_members(node):
                bad.append(f"{path.relative_to(KIT)}:{node.lineno}: Protocol {node.name} lists another class's "
                           f"privates {_private_members(node)}")
            if node.name == "Cluster" and path != owner:
                bad.append(f"{path.relative_to(KIT)}:{node.lineno}: a second class named Cluster")
    assert not bad, "\n".join(bad)


def test_the_attach_door_imports_nothing_of_the_engine_but_its_refusal_counter():
    """engine/admission.py faces unauthenticated peers (the handshakes and their flood rules); who may join is
    the listener's decision (engine/attach.py, which imports the door, never the other way)."""
    deps = {d for d in _graph()["kit.engine.admission"] if _layer(d) == "engine"}
    assert deps <= {"kit.engine.refusals"}, deps


def test_tests_and_benches_use_a_cluster_through_its_public_api():
    """A test or bench drives a Cluster as a user does (run, call, where_reports, status, ...): none reads or
    calls a Cluster's private members, so the engine's inside can change without them noticing."""
    cls = next(n for n in ast.parse((KIT / "engine" / "cluster.py").read_text()).body
               if isinstance(n, ast.ClassDef) and n.name == "Cluster")
    private = {n.name for n in cls.body if isinstance(n, ast.FunctionDef)}
    private |= {n.attr for n in ast.walk(cls) if isinstance(n, ast.Attribute) and isinstance(n.value, ast.Name)
                and n.value.id == "self"}
    private = {n for n in private if n.startswith("_") and not n.startswith("__")}
    assert "_running" in private, "engine/cluster.py changed: update this test"
    files = sorted((ROOT / "tests").glob("*.py")) + sorted((ROOT / "bench").glob("*.py"))
    bad = [f"{path.relative_to(ROOT)}:{node.lineno}: {ast.unparse(node)}" for path in files
           for node in ast.walk(ast.parse(path.read_text()))
           if isinstance(node, ast.Attribute) and node.attr in private
           and not (isinstance(node.value, ast.Name) and node.value.id == "self")]
    assert not bad, "\n".join(bad)
