"""Pictures of what a learner opens on `--profile DIR`, made from a trace the kit writes here, offline.

    npm pack webcomponents.js@0.7.24                  # once: the polyfill catapult's trace viewer needs (below)
    python docs/images/make_trace_pictures.py [--webcomponents webcomponents.js-0.7.24.tgz]   # about 1 min

1. Two CPU ranks run a short DDP-like loop (every gradient all-reduced by hand) under
   `%%distributed --cpus 2 --profile DIR`, so DIR holds all_ranks.json and ranks/rank{0,1}.pt.trace.json.
2. trace_kit_timeline.png: the picture the cell shows under itself (kit.plots.trace, from DIR/all_ranks.json).
3. trace_tensorboard_offline.png: `tensorboard --logdir DIR` with torch-tb-profiler, in Debian chromium
   through playwright, its Workers menu open. Every request to another host is refused, so the picture is
   what an offline machine shows wherever it is made: the plugin's panel waits for Google Charts from
   www.gstatic.com and stays a spinner. The script prints each refused address.
4. trace_tensorboard_trace_view.png: the plugin's Trace view for rank0 (its ranks/rank0.pt.trace.json),
   zoomed onto its gloo:all_reduce calls, all of them selected. Two requests off the machine are answered here instead of refused:
   - cdnjs.cloudflare.com's webcomponents.min.js 0.7.24, which the view's frame (trace_embedding.html)
     loads: the Web Components v0 polyfill (HTML Imports, document.registerElement) that catapult's
     trace viewer is written in and Chromium no longer has. The script serves the file of the same name
     from the npm package webcomponents.js@0.7.24 (its sha256 checked: trace_viewers.py);
   - www.gstatic.com/charts/loader.js: a stand-in whose google.charts.load() resolves only once the Trace
     view is chosen. The plugin draws nothing until that promise resolves; the Trace view draws no chart,
     while the Overview it opens on would fail on the missing charts, so it must not draw first.
5. trace_catapult_all_ranks.png: catapult's trace viewer, as the plugin ships it (its trace_embedding.html,
   served by the same TensorBoard), given DIR/all_ranks.json the way the plugin gives it a trace (a
   postMessage from the parent page): one process per rank, the kit's collectives on one clock, the first
   collective any rank entered selected. Same polyfill, no stand-in.
Pictures 4 and 5 need the polyfill: --webcomponents takes the .tgz `npm pack` writes, its unpacked folder or
the .min.js itself; without it the script runs `npm pack` in a temporary folder (npm's registry must be
reachable), and if that fails too it says why and keeps the pictures already there. The npm file is never
copied into the repository, nor is anything in site-packages changed: playwright's page.route answers the
browser's request for the cdnjs address with it.

Needs what the browser tests need (Debian chromium, playwright) and the `traces` extra (torch-tb-profiler).
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parent.parent
sys.path.insert(0, str(REPO / "tests"))
sys.path.insert(0, str(HERE))
from browser_util import browser_available, launch_browser  # noqa: E402
from trace_viewers import (CHARTS_STAND_IN, CHARTS_URL, HINT_GONE, POLYFILL_NPM, POLYFILL_URL,  # noqa: E402
                           VIEWER_HTML, VIEWER_PAGE, ZOOM_AND_SELECT, offline_page, polyfill, tensorboard,
                           viewer_frame)

KIT_PICTURE = HERE / "trace_kit_timeline.png"
TB_PICTURE = HERE / "trace_tensorboard_offline.png"
TRACE_VIEW_PICTURE = HERE / "trace_tensorboard_trace_view.png"
CATAPULT_PICTURE = HERE / "trace_catapult_all_ranks.png"

# DDP by hand, so the collectives are Python calls the kit sees (DDP's own come from its C++ reducer)
CELL = """\
torch.manual_seed(0)  # the same start on every rank, as DDP's first broadcast makes it
model = torch.nn.Sequential(torch.nn.Linear(256, 256), torch.nn.ReLU(), torch.nn.Linear(256, 10))
opt = torch.optim.SGD(model.parameters(), lr=0.1)
for step in range(3):
    x, y = torch.randn(32, 256), torch.randint(0, 10, (32,))
    torch.nn.functional.cross_entropy(model(x), y).backward()
    for p in model.parameters():  # average every gradient over the ranks
        dist.all_reduce(p.grad)
        p.grad /= world_size
    opt.step()
    opt.zero_grad()
"""


def make_trace(folder: Path) -> dict:
    """Run CELL on 2 CPU ranks as a notebook would, profiled into `folder`; the merged trace."""
    from IPython.core.interactiveshell import InteractiveShell

    shell = InteractiveShell.instance()
    shell.run_line_magic("load_ext", "kit")
    try:  # a numbered cell, as in a notebook: the trace names it "In [1]"
        result = shell.run_cell(f"%%distributed --cpus 2 --profile {folder}\n{CELL}", store_history=True)
        result.raise_error()
    finally:
        shell.run_line_magic("unload_ext", "kit")  # stops the ranks
    ranks = sorted(os.listdir(folder / "ranks"))
    if ranks != ["rank0.pt.trace.json", "rank1.pt.trace.json"]:
        raise RuntimeError(f"expected one torch trace per rank in {folder / 'ranks'}, found {ranks}")
    return json.loads((folder / "all_ranks.json").read_text())


def describe(trace: dict) -> None:
    """What the caption says, measured from this trace: the collectives per rank and when the first one ran."""
    for rank in (0, 1):
        calls = sorted((e["ts"], e["ts"] + e["dur"]) for e in trace["traceEvents"]
                       if e["ph"] == "X" and e["pid"] == rank and e.get("cat") == "collective")
        print(f"rank {rank}: {len(calls)} collectives; the first from {calls[0][0] / 1e3:.1f} ms "
              f"to {calls[0][1] / 1e3:.1f} ms")


def kit_picture(trace: dict) -> None:
    import matplotlib
    matplotlib.use("Agg")
    from kit.plots.trace import trace_timeline

    trace_timeline(trace).savefig(KIT_PICTURE, dpi=110, bbox_inches="tight")


def tensorboard_picture(browser, url: str) -> list[str]:
    """TensorBoard's PyTorch Profiler tab, offline; returns the refused addresses."""
    refused: list[str] = []
    page = offline_page(browser, {}, refused)
    page.set_viewport_size({"width": 900, "height": 600})
    page.goto(f"{url}/#pytorch_profiler")
    plugin = page.frame_locator("iframe").first  # the plugin's page lives in TensorBoard's iframe
    plugin.get_by_role("button", name="rank0").wait_for(timeout=60_000)
    end = time.monotonic() + 30
    while not refused and time.monotonic() < end:  # the refusal that leaves the panel a spinner
        page.wait_for_timeout(200)
    plugin.get_by_role("button", name="rank0").click()
    plugin.get_by_role("option", name="rank1").wait_for(timeout=10_000)
    page.wait_for_timeout(500)  # the menu's opening animation
    page.screenshot(path=str(TB_PICTURE))
    page.close()
    return refused


def trace_view_picture(browser, url: str, webcomponents: bytes) -> dict:
    """The plugin's Trace view for rank0, its gloo:all_reduce calls selected (see the module's notes)."""
    refused: list[str] = []
    page = offline_page(browser, {POLYFILL_URL: (webcomponents, "application/javascript"),
                                  CHARTS_URL: (CHARTS_STAND_IN, "application/javascript")}, refused)
    page.goto(f"{url}/#pytorch_profiler")
    plugin = page.frame_locator("iframe").first
    plugin.get_by_role("button", name="rank0").wait_for(timeout=60_000)
    plugin.get_by_role("button", name="Overview").click()
    plugin.get_by_role("option", name="Trace").click()
    plugin_frame = next(f for f in page.frames if f.url.endswith("/pytorch_profiler/index.html"))
    plugin_frame.wait_for_function("() => typeof window.releaseCharts === 'function'", timeout=30_000)
    plugin_frame.evaluate("() => window.releaseCharts()")  # the plugin now draws its Trace view
    viewer = viewer_frame(page)
    shown = viewer.evaluate(ZOOM_AND_SELECT, ["gloo:all_reduce", None, False])
    viewer.wait_for_function(HINT_GONE, timeout=10_000)
    page.screenshot(path=str(TRACE_VIEW_PICTURE))
    page.close()
    return {**shown, "refused": refused}


def catapult_picture(browser, url: str, webcomponents: bytes, merged: Path) -> dict:
    """Catapult's viewer (the plugin's copy) on the merged trace, the first collective entered selected."""
    refused: list[str] = []
    page = offline_page(browser, {POLYFILL_URL: (webcomponents, "application/javascript"),
                                  f"{url}/{VIEWER_PAGE}": (VIEWER_HTML, "text/html")}, refused)
    page.goto(f"{url}/{VIEWER_PAGE}")
    page.evaluate("() => window.viewerReady")
    page.evaluate("trace => document.getElementById('viewer').contentWindow.postMessage("
                  "{msg: 'data', data: trace, name: 'all_ranks.json'}, '*')", merged.read_text())
    viewer = viewer_frame(page)
    shown = viewer.evaluate(ZOOM_AND_SELECT, ["all_reduce", "collective", True])
    viewer.wait_for_function(HINT_GONE, timeout=10_000)
    page.screenshot(path=str(CATAPULT_PICTURE))
    page.close()
    return {**shown, "refused": refused}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--webcomponents", help=f"{POLYFILL_NPM} from npm: the .tgz of `npm pack`, its unpacked "
                                                "folder or its webcomponents.min.js (default: run npm pack)")
    args = parser.parse_args()
    reason = browser_available()
    if reason:
        print(f"cannot make the pictures here: {reason}")
        return 1
    from playwright.sync_api import sync_playwright

    with tempfile.TemporaryDirectory() as tmp:
        webcomponents, source = polyfill(args.webcomponents, Path(tmp))
        print(f"webcomponents polyfill: {source}" if webcomponents else
              f"no webcomponents polyfill, so {TRACE_VIEW_PICTURE.name} and {CATAPULT_PICTURE.name} are left "
              f"as they are: {source}")
        folder = Path(tmp) / "traces"
        trace = make_trace(folder)
        describe(trace)
        kit_picture(trace)
        made = [KIT_PICTURE, TB_PICTURE]
        with tensorboard(folder) as url, sync_playwright() as p:
            browser = launch_browser(p)
            refused = tensorboard_picture(browser, url)
            if webcomponents:
                for name, shown in (("trace view", trace_view_picture(browser, url, webcomponents)),
                                    ("catapult", catapult_picture(browser, url, webcomponents,
                                                                  folder / "all_ranks.json"))):
                    chosen = ", ".join(f"{where} at {start:.1f} ms for {dur:.1f} ms" for where, start, dur in
                                       shown["chosen"][:3])
                    print(f"{name}: processes {shown['processes']}; {shown['count']} calls from "
                          f"{shown['from_ms']:.1f} to {shown['to_ms']:.1f} ms; selected {len(shown['chosen'])}: "
                          f"{chosen}; refused {shown['refused'] or 'nothing'}")
                made += [TRACE_VIEW_PICTURE, CATAPULT_PICTURE]
            browser.close()
    for path in made:
        print(f"wrote {path} ({path.stat().st_size // 1024} KiB)")
    print("refused (not on this machine):", *refused, sep="\n  ")
    return 0


if __name__ == "__main__":
    sys.exit(main())
