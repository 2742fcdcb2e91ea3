"""Every Python snippet in the README and docs/ runs as written on a CPU machine; where one
cannot run here (it waits for other machines), its commands and names are checked instead.

Plain Python snippets run in a fresh interpreter each, as a reader pastes them into a script.
Notebook snippets (a `%` line, or one the docs say runs inside a `%%distributed` cell) run in order in
one real Jupyter kernel, as a reader runs them cell after cell."""
from __future__ import annotations

import ast
import importlib
import pathlib
import re
import shlex
import subprocess
import sys
from dataclasses import dataclass
from typing import Any

import pytest

from kernel_util import Kernel, kernel_available

ROOT = pathlib.Path(__file__).resolve().parent.parent
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
WALL_CLOCK_S = 600  # compare() runs 12 runs and predict() one; under a load of 10 that is minutes

# Snippets that cannot run on one machine, and why: their names are checked instead of run.
NOT_RUN = {"%dist attach --world-size": "waits for ranks that torchrun starts on other nodes"}
# Snippets the docs say to run inside a `%%distributed` cell (they call collectives on the ranks).
ON_RANKS = ("check_tp()",)


@dataclass(frozen=True)
class Snippet:
    path: pathlib.Path
    line: int
    code: str

    @property
    def name(self) -> str:
        return f"{self.path.relative_to(ROOT)}:{self.line}"

    @property
    def kind(self) -> str:
        if any(key in self.code for key in NOT_RUN):
            return "names"
        if any(key in self.code for key in ON_RANKS) or any(x.lstrip().startswith("%") for x in self.code.splitlines()):
            return "notebook"
        return "python"


def _snippets() -> list[Snippet]:
    found = []
    for path in DOCS:
        text = path.read_text()
        for m in re.finditer(r"^```python\n(.*?)^```", text, re.S | re.M):
            found.append(Snippet(path, text[:m.start()].count("\n") + 1, m.group(1)))
    return found


SNIPPETS = _snippets()


def _by_kind(kind: str) -> list[Any]:
    return [pytest.param(s, id=s.name) for s in SNIPPETS if s.kind == kind]


def _promised_prints(code: str) -> list[str]:
    """`print(x)   # {0: [1.0]}`: the comment is what the line prints, where it is a Python literal."""
    promised = []
    for line in code.splitlines():
        m = re.match(r"\s*print\(.*\)\s*#\s*(.+)$", line)
        if m:
            try:
                promised.append(repr(ast.literal_eval(m.group(1).strip())))
            except (ValueError, SyntaxError):
                pass
    return promised


def test_the_docs_have_snippets_of_every_kind():
    kinds = {s.kind for s in SNIPPETS}
    assert kinds == {"python", "notebook", "names"}, [(s.name, s.kind) for s in SNIPPETS]


@pytest.mark.parametrize("snippet", _by_kind("python"))
def test_python_snippet_runs(snippet: Snippet, tmp_path: pathlib.Path):
    r = subprocess.run([sys.executable, "-c", snippet.code], cwd=tmp_path, capture_output=True, text=True,
                       timeout=WALL_CLOCK_S - 60)
    assert r.returncode == 0, f"{snippet.name} failed as written:\n{snippet.code}\n{r.stderr[-3000:]}"
    for text in _promised_prints(snippet.code):
        assert text in r.stdout, f"{snippet.name} promises {text}, printed:\n{r.stdout[-2000:]}"


@pytest.mark.skipif(kernel_available() is not None, reason=str(kernel_available()))
def test_notebook_snippets_run_cell_after_cell_in_a_kernel(tmp_path: pathlib.Path):
    cells = [s for s in SNIPPETS if s.kind == "notebook"]
    assert cells[0].code.strip() == "%load_ext kit", "the first notebook snippet loads the kit"
    with Kernel(cwd=str(tmp_path)) as k:
        for s in cells:
            code = s.code if any(key in s.code for key in ("%%distributed", "%load_ext")) else "%%distributed\n" + s.code
            r = k.run(code, timeout_s=WALL_CLOCK_S / 2)
            assert r.status == "ok", f"{s.name} failed as written:\n{s.code}\n{r.text[-3000:]}"
            for line in s.code.splitlines():
                # `print(t)   # [rank 0] tensor([3., 3., 3.])   [rank 1] tensor([3., 3., 3.])`
                for label, value in re.findall(r"(\[rank \d+\]) (\S.*?)(?=\s+\[rank|\s*$)", line.partition("#")[2]):
                    assert f"{label} {value}" in r.text, f"{s.name} promises `{label} {value}`:\n{r.text[-2000:]}"
        # The README's promise after its first cell: `t` is still there on both ranks in the next one.
        r = k.run("%%distributed\nprint(t.tolist())")
        assert "[rank 0] [3.0, 3.0, 3.0]" in r.text and "[rank 1] [3.0, 3.0, 3.0]" in r.text, r.text


@pytest.mark.parametrize("snippet", _by_kind("names"))
def test_snippet_that_cannot_run_here_uses_real_commands(snippet: Snippet):
    from kit.notebook.dist_actions import ACTIONS, parse

    for line in snippet.code.splitlines():
        words = shlex.split(line.partition("#")[0])
        if words[:1] == ["%dist"]:
            assert words[1] in ACTIONS, f"{snippet.name}: `%dist {words[1]}` is no %dist command"
            parse(words[1], words[2:])  # raises UsageError on an unknown flag or a flag without its value
        elif words:
            compile(line.partition("#")[0], snippet.name, "exec")


def _resolve(dotted: str) -> Any:
    parts = dotted.split(".")
    for i in range(len(parts), 0, -1):
        try:
            obj = importlib.import_module(".".join(parts[:i]))
            break
        except ModuleNotFoundError:
            continue
    for part in parts[i:]:
        obj = getattr(obj, part)
    return obj


def test_every_kit_name_the_docs_spell_exists():
    """`kit.plots.expert_load`, `kit.widgets.prediction_panel(records)`: each dotted name in backticks
    imports (record schemas such as `kit.run/2` are names of formats, not of code)."""
    missing = []
    for path in DOCS:
        for quoted in re.findall(r"`[^`\n]+`", path.read_text()):
            for dotted in re.findall(r"\bkit(?:\.[A-Za-z_]\w*)+(?!\w*/)", quoted):
                try:
                    _resolve(dotted)
                except (ImportError, AttributeError) as e:
                    missing.append(f"{path.name}: {dotted} ({e})")
    assert not missing, "\n".join(missing)
