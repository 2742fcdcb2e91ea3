"""Benches and lessons still find the kit names they import: a module or name moved or renamed in `kit`
fails here, in the unit tier, instead of when someone next runs a bench or a lesson by hand.

Two checks, no process started:
- every `from kit... import name` (and `import kit...`) in bench/*.py, lessons/*.py and the lesson sources
  lessons/src/*.py resolves: the module imports and has the name (or the name is its submodule). Imports
  inside functions count, and so do the Python snippets a bench hands to a kernel or a fresh interpreter
  as strings (a string constant that parses and imports from kit), and the "kit.module:function" names a
  bench hands to `run_local`/`run_each` or `Cluster.call` to run on the ranks;
- every bench module imports (its own top-level imports: the bench's helpers, torch, the kit), except
  `floor_torchrun.py`, which joins a process group as it is imported (it runs under torchrun).
An old name that kit/_renamed.py still answers for one release (with a FutureWarning) counts as stale.
"""
from __future__ import annotations

import ast
import importlib
import pathlib
import re
import sys
import warnings

import pytest

ROOT = pathlib.Path(__file__).resolve().parent.parent
BENCH = ROOT / "bench"
RUNS_AT_IMPORT = {"floor_torchrun"}  # dist.init_process_group at the top level: a torchrun script
_MAGIC = re.compile(r"^(\s*)[%!].*$")  # IPython magics and shell lines in a lesson cell
_BY_NAME = re.compile(r"^(kit(?:\.\w+)+):(\w+)$")  # a function named for the ranks: "kit.experiments.runner:run_rank"


def _code_cells(source: str) -> list[str]:
    """The code cells of a lesson source (`# %%` percent format), magic lines blanked to `pass` so that
    the Python in a `%%distributed` cell parses as it runs on the ranks."""
    cells, current = [], None
    for line in source.splitlines():
        if line.startswith("# %%"):
            if current is not None:
                cells.append("\n".join(current))
            current = None if "[markdown]" in line else []
        elif current is not None:
            current.append(_MAGIC.sub(r"\1pass", line))
    if current is not None:
        cells.append("\n".join(current))
    return cells


def _sources() -> list[tuple[str, str]]:
    """(label, Python text) for every bench and lesson source, and the snippets embedded in the benches."""
    out = []
    for path in sorted(BENCH.glob("*.py")) + sorted((ROOT / "lessons").glob("*.py")):
        text = path.read_text()
        out.append((path.relative_to(ROOT).as_posix(), text))
        for node in ast.walk(ast.parse(text)):
            if isinstance(node, ast.Constant) and isinstance(node.value, str) and "import" in node.value \
                    and "kit" in node.value:
                try:
                    ast.parse(node.value)
                except SyntaxError:
                    continue  # a message or a cell with magics, not a script
                out.append((f"{path.relative_to(ROOT).as_posix()}:{node.lineno} (snippet)", node.value))
    for path in sorted((ROOT / "lessons" / "src").glob("*.py")):
        for i, cell in enumerate(_code_cells(path.read_text())):
            out.append((f"{path.relative_to(ROOT).as_posix()} code cell {i}", cell))
    return out


def _kit_imports(text: str) -> list[tuple[int, str, str | None]]:
    """(line, module, name or None) for each absolute import from the kit in `text`, and each function
    named as "kit.module:function" in a string."""
    found = []
    for node in ast.walk(ast.parse(text)):
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and _BY_NAME.match(node.value):
            found.append((node.lineno, *_BY_NAME.match(node.value).groups()))
        if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module \
                and node.module.split(".")[0] == "kit":
            found += [(node.lineno, node.module, alias.name) for alias in node.names if alias.name != "*"]
        elif isinstance(node, ast.Import):
            found += [(node.lineno, alias.name, None) for alias in node.names if alias.name.split(".")[0] == "kit"]
    return found


def _missing(module: str, name: str | None) -> str | None:
    # an old name still answers for one release, with a FutureWarning (kit/_renamed.py): stale all the same
    with warnings.catch_warnings():
        warnings.filterwarnings("error", message=".*the old name goes away in the next release", category=FutureWarning)
        try:
            return _missing_now(module, name)
        except FutureWarning as e:
            return f"{module}{'.' + name if name else ''} is an old name ({e})"


def _missing_now(module: str, name: str | None) -> str | None:
    try:
        mod = importlib.import_module(module)
    except ImportError as e:
        return f"module {module} does not import ({e})"
    try:
        if name is None or hasattr(mod, name):
            return None
    except ImportError as e:  # a lazy package whose table names a module that moved
        return f"{module}.{name} does not import ({e})"
    try:
        importlib.import_module(f"{module}.{name}")
    except ImportError:
        return f"{module} has no {name}"
    return None


def test_every_kit_name_that_benches_and_lessons_import_exists() -> None:
    sources = _sources()
    assert any(label.startswith("lessons/src/") for label, _ in sources)  # the lesson sources were read
    checked, problems = 0, []
    for label, text in sources:
        for line, module, name in _kit_imports(text):
            checked += 1
            why = _missing(module, name)
            if why:
                problems.append(f"{label}:{line}: {why}")
    assert checked > 50  # the walk found the imports it is meant to check
    assert not problems, "stale kit imports (update them to the new names):\n" + "\n".join(problems)


def test_an_old_name_that_still_answers_counts_as_stale() -> None:
    # kit/_renamed.py keeps old names working for one release; a bench or lesson must not lean on them
    assert "is an old name" in _missing("kit.experiments", "ring_allreduce_s")
    assert "is an old name" in _missing("kit.experiments.strategies.wire", None)
    assert "has no" in _missing("kit.experiments", "predict_allreduce_ms")  # removed: its message is not needed here
    assert _missing("kit.experiments", "alpha_beta_allreduce_s") is None


@pytest.mark.parametrize("name", sorted(p.stem for p in BENCH.glob("*.py") if p.stem not in RUNS_AT_IMPORT))
def test_bench_module_imports(name: str, monkeypatch: pytest.MonkeyPatch) -> None:
    # bench/ is the script's directory (first on sys.path when it runs); tests/ for orphans.py's helpers
    monkeypatch.syspath_prepend(str(ROOT / "tests"))
    monkeypatch.syspath_prepend(str(ROOT))
    monkeypatch.syspath_prepend(str(BENCH))
    if name in sys.modules:  # imported already as another bench's helper (_kernel, gpu_checks, _netns)
        assert sys.modules[name].__file__ == str(BENCH / f"{name}.py")
        return
    mod = importlib.import_module(name)
    assert mod.__file__ == str(BENCH / f"{name}.py")
