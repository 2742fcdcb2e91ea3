"""Pictures of what a learner opens on `--profile DIR`, made from a trace the kit writes here, offline.

    python docs/images/make_trace_pictures.py      # writes docs/images/trace_*.png (about 1 min)

1. Two CPU ranks run a short DDP-like loop (every gradient all-reduced by hand) under
   `%%distributed --cpus 2 --profile DIR`, so DIR holds all_ranks.json and ranks/rank{0,1}.pt.trace.json.
2. trace_kit_timeline.png: the picture the cell shows under itself (kit.plots.trace, from DIR/all_ranks.json).
3. trace_tensorboard_offline.png: `tensorboard --logdir DIR` with torch-tb-profiler, in Debian chromium
   through playwright, its Workers menu open. Every request to another host is refused, so the picture is
   what an offline machine shows wherever it is made: the plugin's panel waits for Google Charts from
   www.gstatic.com and stays a spinner. The script prints each refused address.
Catapult's trace viewer (the plugin's trace_viewer_full.html) is not pictured: it needs the Web Components v0
polyfill from cdnjs.cloudflare.com, which this machine does not have (docs/measuring.md says more).

Needs what the browser tests need (Debian chromium, playwright) and the `traces` extra (torch-tb-profiler).
"""
from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path
from urllib.parse import urlsplit

HERE = Path(__file__).resolve().parent
REPO = HERE.parent.parent
sys.path.insert(0, str(REPO / "tests"))
from browser_util import browser_available, launch_browser  # noqa: E402

KIT_PICTURE = HERE / "trace_kit_timeline.png"
TB_PICTURE = HERE / "trace_tensorboard_offline.png"
LOOPBACK = {"127.0.0.1", "localhost"}
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


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _wait_for_run(url: str, deadline_s: float = 120.0) -> None:
    """TensorBoard answers before the plugin has parsed the traces: wait until it lists the run."""
    end = time.monotonic() + deadline_s
    while time.monotonic() < end:
        try:
            with urllib.request.urlopen(f"{url}/data/plugin/pytorch_profiler/runs", timeout=5) as r:
                if "ranks" in json.load(r).get("runs", []):
                    return
        except OSError:
            pass  # not listening yet
        time.sleep(0.5)
    raise TimeoutError(f"TensorBoard at {url} listed no run 'ranks' within {deadline_s:.0f} s")


def tensorboard_picture(folder: Path) -> list[str]:
    """TensorBoard's PyTorch Profiler tab on `folder`, offline; returns the refused addresses."""
    from playwright.sync_api import sync_playwright

    port = _free_port()
    url = f"http://127.0.0.1:{port}"
    log = tempfile.TemporaryFile()
    tb = subprocess.Popen([sys.executable, "-m", "tensorboard.main", "--logdir", str(folder), "--host", "127.0.0.1",
                           "--port", str(port)], stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    refused: list[str] = []

    def offline(route):  # the picture must not depend on whether this machine reaches the internet
        if urlsplit(route.request.url).hostname in LOOPBACK:
            route.continue_()
        else:
            refused.append(route.request.url)
            route.abort("internetdisconnected")

    try:
        _wait_for_run(url)
        with sync_playwright() as p:
            browser = launch_browser(p)
            page = browser.new_page(viewport={"width": 900, "height": 600})
            page.route("**/*", offline)
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
            browser.close()
    except Exception:
        log.seek(0)
        print(log.read().decode(errors="replace")[-3000:])
        raise
    finally:
        tb.terminate()
        tb.wait(timeout=30)
    return refused


def main() -> int:
    reason = browser_available()
    if reason:
        print(f"cannot make the pictures here: {reason}")
        return 1
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp) / "traces"
        trace = make_trace(folder)
        describe(trace)
        kit_picture(trace)
        refused = tensorboard_picture(folder)
    for path in (KIT_PICTURE, TB_PICTURE):
        print(f"wrote {path} ({path.stat().st_size // 1024} KiB)")
    print("refused (not on this machine):", *refused, sep="\n  ")
    return 0


if __name__ == "__main__":
    sys.exit(main())
