"""Lesson 00 in a real JupyterLab and Chromium: Run All, rank-labelled output, the final check.

Skipped unless Debian chromium and playwright are installed. The screenshot lands in
tests/artifacts/ for a human to look at.
"""
from __future__ import annotations

from pathlib import Path
from typing import Any, Iterator

import pytest

try:
    from tests.browser_util import LabServer, launch_browser, open_notebook, run_all_cells, serve_notebooks
except ImportError:
    from browser_util import LabServer, launch_browser, open_notebook, run_all_cells, serve_notebooks

pytestmark = [pytest.mark.browser, pytest.mark.slow]
LESSON = Path(__file__).resolve().parents[1] / "lessons" / "00_quickstart.ipynb"
ARTIFACTS = Path(__file__).parent / "artifacts"
OUT = ".jp-OutputArea-output"


@pytest.fixture(scope="module")
def lab(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LabServer]:
    yield from serve_notebooks(tmp_path_factory, [LESSON])


def test_quickstart_run_all_in_jupyterlab(lab: LabServer) -> None:
    from playwright.sync_api import sync_playwright

    ARTIFACTS.mkdir(exist_ok=True)
    with sync_playwright() as p:
        browser = launch_browser(p)
        page: Any = browser.new_page(viewport={"width": 1280, "height": 1000})
        page.set_default_timeout(30_000)
        try:
            open_notebook(page, lab, LESSON.name)
            run_all_cells(page)
            # scoped to outputs: text locators would also match the cells' source
            page.locator(OUT, has_text="[rank 1] after:  [3.0, 3.0, 3.0]").first.wait_for(timeout=90_000)
            page.locator(OUT, has_text="check passed").last.wait_for(timeout=90_000)
            assert page.locator(OUT, has_text="FALLBACK").count() == 1  # the banner is shown once, loudly
            assert page.locator(OUT, has_text="failed as expected").count() == 3
            page.locator(".jp-OutputArea-output", has_text="Lab bench").first.scroll_into_view_if_needed()
            page.screenshot(path=str(ARTIFACTS / "browser_lesson00_bench.png"))
            page.locator(OUT, has_text="rank 1 raised ValueError").first.scroll_into_view_if_needed()
            page.screenshot(path=str(ARTIFACTS / "browser_lesson00_error.png"))
        finally:
            browser.close()
