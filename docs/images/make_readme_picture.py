"""The README's picture, made by the kit itself: a notebook with a `%%distributed` cell and a measured plot,
run in a real JupyterLab and Chromium, the cells' outputs photographed.

    python docs/images/make_readme_picture.py      # writes docs/images/first_cells.png (about 30 s)

Needs what the browser tests need (Debian chromium, playwright, jupyterlab); tests/browser_util.py serves
the notebook from a throwaway JupyterLab. The cells are the README's own first steps.
"""
from __future__ import annotations

import json
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent.parent / "tests"))
from browser_util import LabServer, browser_available, launch_browser, open_notebook, run_all_cells  # noqa: E402

OUT = HERE / "first_cells.png"
CELLS = [
    "%load_ext kit",
    "%%distributed --cpus 2\nt = torch.ones(3) * (rank + 1)\ndist.all_reduce(t)\nprint(t)",
    "from kit.experiments import ExperimentConfig, run\nfrom kit.plots import step_timeline\n\n"
    "# DDP on the same 2 ranks, measured: one step, per rank\n"
    "rec = run(ExperimentConfig(strategy=\"ddp\", steps=5))\nstep_timeline(rec)",
]


def notebook(path: Path) -> Path:
    cells = [{"cell_type": "code", "execution_count": None, "id": f"c{i}", "metadata": {}, "outputs": [],
              "source": src} for i, src in enumerate(CELLS)]
    path.write_text(json.dumps({"cells": cells, "metadata": {"kernelspec": {
        "name": "python3", "display_name": "Python 3", "language": "python"}}, "nbformat": 4, "nbformat_minor": 5}))
    return path


def main() -> int:
    reason = browser_available()
    if reason:
        print(f"cannot make the picture here: {reason}")
        return 1
    from playwright.sync_api import sync_playwright

    with tempfile.TemporaryDirectory() as tmp:
        server = LabServer(Path(tmp), [notebook(Path(tmp) / "first_cells.ipynb")])
        try:
            with sync_playwright() as p:
                browser = launch_browser(p)
                page = browser.new_page(viewport={"width": 1000, "height": 1100})
                open_notebook(page, server, "first_cells.ipynb")
                run_all_cells(page)
                try:
                    page.locator(".jp-OutputArea-output img").first.wait_for(timeout=240_000)
                    page.wait_for_function("() => ![...document.querySelectorAll('.jp-InputArea-prompt')]"
                                           ".some(p => p.textContent.includes('*'))", timeout=60_000)
                except Exception:
                    page.screenshot(path=str(Path(tmp) / "failed.png"))
                    print(server.log())
                    raise
                # what a reader needs: the cells, without the active cell's toolbar and blue marks
                page.add_style_tag(content=".jp-cell-toolbar, .jp-Collapser {visibility: hidden !important}"
                                           ".jp-Notebook .jp-Cell.jp-mod-selected {background: none !important}")
                page.wait_for_timeout(1000)
                first = page.locator(".jp-Notebook .jp-Cell").first.bounding_box()
                last = page.locator(".jp-Notebook .jp-Cell").last.bounding_box()
                page.screenshot(path=str(OUT), clip={"x": first["x"], "y": first["y"], "width": first["width"],
                                                     "height": last["y"] + last["height"] - first["y"] + 8})
                browser.close()
        finally:
            server.close()
    print(f"wrote {OUT} ({OUT.stat().st_size // 1024} KiB)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
