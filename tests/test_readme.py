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
    table = README[README.index("## The magics"):README.index("## How it works")]
    missing = {f for f in flags if f"`{f}" not in table and f" {f}" not in table}
    assert not missing, f"flags missing from the README's magic table: {missing}"
    assert "`--expect-error`" in table


def test_pull_is_documented_as_a_trust_boundary():
    faults = (ROOT / "docs" / "faults.md").read_text()
    for text in (README, faults):
        assert "trust boundary" in text and "unpickles" in text
