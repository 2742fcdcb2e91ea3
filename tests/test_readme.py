"""The README is the front door; what it promises is checked here."""
from __future__ import annotations

import pathlib
import re

ROOT = pathlib.Path(__file__).resolve().parent.parent
README = (ROOT / "README.md").read_text()
REPO = "https://github.com/distributed-kit/distributed-kit"


def test_one_repository_url_everywhere():
    urls = set(re.findall(r"github\.com/([\w.-]+/[\w.-]+)", README))
    assert urls == {"distributed-kit/distributed-kit"}, urls
    assert f"git+{REPO}" in README


def test_jupyter_as_root_has_a_command_that_works():
    assert "--allow-root" in README


def test_magic_table_lists_every_flag_of_the_magic():
    from kit.notebook.magics import DistributedMagics

    doc = DistributedMagics.distributed.__doc__ or ""
    flags = set(re.findall(r"(--[a-z-]+)", doc))
    table = README[README.index("## The magics"):README.index("## Tensor, sequence, context and expert parallelism")]
    missing = {f for f in flags if f"`{f}" not in table and f" {f}" not in table}
    assert not missing, f"flags missing from the README's magic table: {missing}"
    assert "`--expect-error`" in table


def test_pull_is_documented_as_a_trust_boundary():
    faults = (ROOT / "docs" / "faults.md").read_text()
    for text in (README, faults):
        assert "trust boundary" in text and "unpickles" in text


def _first_screen() -> str:
    """What a visitor reads before scrolling: up to the first cell's explanation."""
    return README[:README.index("## A first cell")]


def test_the_install_starts_with_a_clone_of_the_repository():
    """The README's first steps clone the checkout before `pip install -e`, which needs it."""
    block = re.search(r"## Try it.*?```bash\n(.*?)```", README, re.S)
    assert block is not None
    lines = block.group(1).splitlines()
    assert lines[0] == f"git clone {REPO} && cd distributed-kit"
    assert 'pip install -e ".[lessons]"' in lines[1] and "python -m kit demo" in lines[1]


def test_the_first_screen_shows_a_picture_made_by_the_kit_and_what_to_open_next():
    first = _first_screen()
    pictures = re.findall(r"!\[[^\]]+\]\(([^)]+\.png)\)", first)
    assert pictures == ["docs/images/first_cells.png"]
    png = ROOT / pictures[0]
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and png.stat().st_size < 300_000
    assert (ROOT / "docs" / "images" / "make_readme_picture.py").exists()  # how it was made, to remake it
    for step in ("00_quickstart.ipynb", "from kit.widgets import lab_bench; lab_bench()",
                 "from kit.widgets import plan_panel; plan_panel()"):
        assert step in first, step


def test_the_feature_table_points_at_what_exists():
    table = README[README.index("## What it does"):README.index("## A first cell")]
    links = re.findall(r"\]\(([^)#]*)(#[^)]*)?\)", table)
    assert len(links) >= 6
    headings = {re.sub(r"[^a-z0-9 -]", "", h.lower()).replace(" ", "-") for h in re.findall(r"^#+ (.+)$", README, re.M)}
    for path, anchor in links:
        if path:
            assert (ROOT / path).exists(), path
        elif anchor:
            assert anchor[1:] in headings, anchor


def test_jargon_waits_below_the_first_screen():
    """The README's first screen says what the kit does without cgroups, gloo or the rank template."""
    first = _first_screen().lower()
    for word in ("gloo", "cgroup", "nccl", "rank template", "filestore", "hmac", "load 2-6"):
        assert word not in first, word


def test_every_picture_in_the_docs_is_there_small_and_remade_by_a_script():
    """A picture the docs show opens (a PNG under 300 KB) and a script beside it names it, so it can be made
    again when the kit or a viewer changes (docs/images/make_*.py)."""
    makers = "".join(p.read_text() for p in (ROOT / "docs" / "images").glob("make_*.py"))
    pictures = [(doc, name) for doc in sorted((ROOT / "docs").glob("*.md"))
                for name in re.findall(r"!\[[^\]]+\]\(images/([^)]+\.png)\)", doc.read_text())]
    assert ("measuring.md", "trace_tensorboard_offline.png") in {(d.name, n) for d, n in pictures}
    for doc, name in pictures:
        png = ROOT / "docs" / "images" / name
        assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n", f"{doc.name}: {name}"
        assert png.stat().st_size < 300_000, f"{name}: {png.stat().st_size} bytes"
        assert f'"{name}"' in makers, f"{name}: no docs/images/make_*.py writes it"
