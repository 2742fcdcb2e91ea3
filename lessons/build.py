"""Build lessons/NN_*.ipynb from the readable sources in lessons/src/NN_*.py.

Sources use the "percent" format: `# %%` starts a code cell, `# %% [markdown]` a markdown
cell whose lines start with `# `; `# %% tags=["a", "b"]` adds cell tags. The notebooks are
written without outputs and with stable cell ids, so they diff cleanly and read well on
GitHub. `python lessons/build.py --check` fails when a notebook's cells (kind, source, tags) differ
from its source's: a notebook someone ran and saved, with outputs, still passes.
"""
from __future__ import annotations

import json
import pathlib
import re
import sys

import nbformat

HERE = pathlib.Path(__file__).resolve().parent
_HEADER = re.compile(r"^# %%(?P<md> \[markdown\])?(?: tags=(?P<tags>\[.*\]))?\s*$")


def cells_from_source(text: str) -> list[nbformat.NotebookNode]:
    cells, kind, tags, lines = [], None, [], []

    def flush() -> None:
        if kind is None:
            return
        body = "\n".join(lines).strip("\n")
        meta = {"tags": tags} if tags else {}
        if kind == "markdown":
            body = "\n".join(line[2:] if line.startswith("# ") else line.lstrip("#") for line in body.splitlines())
            cells.append(nbformat.v4.new_markdown_cell(body, metadata=meta))
        else:
            cells.append(nbformat.v4.new_code_cell(body, metadata=meta))

    for line in text.splitlines():
        m = _HEADER.match(line)
        if m:
            flush()
            kind, tags, lines = ("markdown" if m["md"] else "code"), json.loads(m["tags"] or "[]"), []
        elif kind is not None:
            lines.append(line)
    flush()
    for i, cell in enumerate(cells):
        cell["id"] = f"c{i:02d}"
    return cells


def build(src: pathlib.Path) -> str:
    nb = nbformat.v4.new_notebook(cells=cells_from_source(src.read_text()))
    nb.metadata = {"kernelspec": {"display_name": "Python 3", "language": "python", "name": "python3"},
                   "language_info": {"name": "python"}}
    return nbformat.writes(nb) + "\n"


def _cells(text: str) -> list[tuple[str, str, list[str]]]:
    """What a notebook's sources say, without what running it added (outputs, counts, other metadata)."""
    nb = nbformat.reads(text, as_version=4)
    return [(c.cell_type, c.source, list(c.metadata.get("tags", []))) for c in nb.cells]


def main(argv: list[str]) -> int:
    stale = []
    for src in sorted((HERE / "src").glob("[0-9][0-9]_*.py")):
        target = HERE / (src.stem + ".ipynb")
        text = build(src)
        if "--check" in argv:
            if not target.exists() or _cells(target.read_text()) != _cells(text):
                stale.append(target.name)
        else:
            target.write_text(text)
    if stale:
        print(f"out of date: {', '.join(stale)}; run `python lessons/build.py`")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
