"""The browser side of make_trace_pictures.py: TensorBoard on a trace folder, a page that reaches only this
machine, and catapult's trace viewer (the copy torch-tb-profiler ships) driven from playwright.

What each answered request stands in for, and why, is in make_trace_pictures.py's docstring.
"""
from __future__ import annotations

import contextlib
import hashlib
import json
import shutil
import socket
import subprocess
import sys
import tarfile
import tempfile
import time
import urllib.request
from pathlib import Path
from urllib.parse import urlsplit

LOOPBACK = {"127.0.0.1", "localhost"}
POLYFILL_URL = "https://cdnjs.cloudflare.com/ajax/libs/webcomponentsjs/0.7.24/webcomponents.min.js"
POLYFILL_NPM = "webcomponents.js@0.7.24"
# webcomponents.min.js in that npm package (its tarball's sha1 2116fbfa... is what npm checks)
POLYFILL_SHA256 = "3858273ab39b299e7c2227f0830534afafaabf4a572c9ea73c2076fecbd8978c"
CHARTS_URL = "https://www.gstatic.com/charts/loader.js"
CHARTS_STAND_IN = "window.google = {charts: {load: () => new Promise(done => { window.releaseCharts = done; })}};"
VIEWER_PAGE = "kit-viewer.html"  # a page of ours on TensorBoard's address, holding the plugin's viewer frame
VIEWER_HTML = """<!doctype html><html><body style="margin:0">
<iframe id="viewer" src="data/plugin/pytorch_profiler/trace_embedding.html" style="border:0;width:100vw;height:100vh">
</iframe><script>  // the frame says "ready" to its parent once catapult has loaded, as in the plugin
window.viewerReady = new Promise(ready => addEventListener("message", e => (e.data || {}).msg === "ready" && ready()));
</script></body></html>"""
# In the viewer's frame: zoom onto the slices named `title` (of `category`, if given) and select them all,
# or only the earliest; returns what the caption states. The selection's details get 210 px, not half the page.
ZOOM_AND_SELECT = """([title, category, earliestOnly]) => {
    const view = document.getElementById('trace-viewer'), tracks = view.trackView;
    view.$.analysis.style.height = '210px';
    const calls = [...view.model.getDescendantEvents()].filter(
        e => e.title === title && (!category || e.category === category));
    const lo = Math.min(...calls.map(e => e.start)), hi = Math.max(...calls.map(e => e.end));
    const transform = new tr.ui.TimelineDisplayTransform();
    transform.set(tracks.viewport.currentDisplayTransform);
    transform.xSetWorldBounds(lo - (hi - lo) / 20, hi + (hi - lo) / 20, tracks.modelTrackContainer_.canvas.width);
    tracks.viewport.setDisplayTransformImmediately(transform);
    const chosen = earliestOnly ? [calls.reduce((a, b) => (a.start <= b.start ? a : b))] : calls;
    view.brushingStateController.changeSelectionFromTimeline(new tr.model.EventSet(chosen));
    return {processes: Object.values(view.model.processes).map(p => p.userFriendlyName), count: calls.length,
            from_ms: lo, to_ms: hi, chosen: chosen.sort((a, b) => a.start - b.start).map(
                e => [e.parentContainer.parent.userFriendlyName, e.start, e.duration])};
}"""
# a selection shows a hint over the tracks for 1 s ("Press 'm' to mark current selection")
HINT_GONE = "() => document.getElementById('trace-viewer').trackView.pendingHintTextClearTimeout_ === undefined"

# catapult sets its first viewport once its frame has a size (a 250 ms poll): zoom after that, not before
VIEWER_SETTLED = """() => { const view = document.getElementById('trace-viewer');
    return view && view.model && view.trackView.model === view.model
        && view.trackView.pollIfViewportAttachedInterval_ === undefined; }"""


def polyfill(given: str | None, tmp: Path) -> tuple[bytes | None, str]:
    """webcomponents.min.js from npm's webcomponents.js@0.7.24 and where it came from, or None and why not."""
    if given is None:
        if shutil.which("npm") is None:
            return None, f"no --webcomponents given and no npm here to run `npm pack {POLYFILL_NPM}`"
        try:
            run = subprocess.run(["npm", "pack", POLYFILL_NPM, "--pack-destination", str(tmp)],
                                 capture_output=True, text=True, timeout=300)
        except subprocess.TimeoutExpired:
            return None, f"`npm pack {POLYFILL_NPM}` did not finish in 300 s (is npm's registry reachable?)"
        if run.returncode != 0:
            said = [line for line in run.stderr.splitlines() if line.startswith("npm error")][:3]
            return None, f"`npm pack {POLYFILL_NPM}` failed: {'; '.join(said) or run.stderr.strip()[-300:]}"
        given = str(tmp / run.stdout.split()[-1])
    path = Path(given)
    if path.is_dir():
        path = path / "webcomponents.min.js"
    if not path.is_file():
        return None, f"{path} does not exist"
    if path.name.endswith((".tgz", ".tar.gz")):
        try:
            with tarfile.open(path) as package:
                body = package.extractfile("package/webcomponents.min.js").read()
        except (KeyError, tarfile.TarError) as exc:
            return None, f"{path} is no npm tarball holding package/webcomponents.min.js ({exc})"
    else:
        body = path.read_bytes()
    if hashlib.sha256(body).hexdigest() != POLYFILL_SHA256:
        return None, f"{path} is not {POLYFILL_NPM}'s webcomponents.min.js (sha256 differs)"
    return body, str(path)


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


@contextlib.contextmanager
def tensorboard(folder: Path):
    """`tensorboard --logdir folder` on a free loopback port, its run parsed; yields its address."""
    port = _free_port()
    url = f"http://127.0.0.1:{port}"
    log = tempfile.TemporaryFile()
    tb = subprocess.Popen([sys.executable, "-m", "tensorboard.main", "--logdir", str(folder), "--host", "127.0.0.1",
                           "--port", str(port)], stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        _wait_for_run(url)
        yield url
    except Exception:
        log.seek(0)
        print(log.read().decode(errors="replace")[-3000:])
        raise
    finally:
        tb.terminate()
        tb.wait(timeout=30)


def offline_page(browser, answers: dict[str, tuple[bytes | str, str]], refused: list[str]):
    """A page that reaches only the loopback: a URL in `answers` gets that (body, content type), the rest
    off the machine is refused and noted, so a picture does not depend on this machine's internet access."""
    page = browser.new_page(viewport={"width": 1280, "height": 680})

    def route(r):
        url = r.request.url
        if url in answers:
            body, kind = answers[url]
            r.fulfill(body=body, content_type=kind)
        elif urlsplit(url).hostname in LOOPBACK:
            r.continue_()
        else:
            refused.append(url)
            r.abort("internetdisconnected")

    page.route("**/*", route)
    return page


def viewer_frame(page, deadline_s: float = 60.0):
    """The frame holding catapult (the plugin's trace_embedding.html), once its trace is drawn."""
    end = time.monotonic() + deadline_s
    while time.monotonic() < end:
        frame = next((f for f in page.frames if f.url.endswith("/trace_embedding.html")), None)
        if frame is not None:
            frame.wait_for_function(VIEWER_SETTLED, timeout=deadline_s * 1000)
            return frame
        page.wait_for_timeout(200)
    raise TimeoutError(f"no trace viewer frame within {deadline_s:.0f} s")
