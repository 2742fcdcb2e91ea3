"""JupyterLab + Playwright helpers for browser tests (Debian chromium, no downloads).

Why a throwaway server per test session: the user's Jupyter config, workspaces and news
toast must not leak into what we check, and a random loopback port with a token keeps the
server private. Every wait here is bounded, so a broken frontend fails the test instead of
hanging CI.
"""
from __future__ import annotations

import json
import os
import secrets
import shutil
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path
from typing import Any

__all__ = ["CHROMIUM", "LabServer", "browser_available", "launch_browser", "open_notebook",
           "run_all_cells", "serve_notebooks"]

CHROMIUM = "/usr/bin/chromium"
REPO = Path(__file__).resolve().parents[1]
# Hides the "notified about official Jupyter news?" toast, which covers the page. It only
# works from the *app* settings dir (jupyterlab_server ignores it in the user settings dir).
OVERRIDES = {"@jupyterlab/apputils-extension:notification":
             {"fetchNews": "false", "checkForUpdates": False}}


def browser_available() -> str | None:
    """None when a browser test can run here, else the reason to skip."""
    if not Path(CHROMIUM).exists():
        return f"{CHROMIUM} missing (apt-get install -y chromium)"
    try:
        import playwright.sync_api  # noqa: F401
        import jupyterlab  # noqa: F401
    except ImportError as exc:
        return f"{exc.name} not installed"
    return None


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class LabServer:
    """A private JupyterLab on 127.0.0.1 serving a copy of `notebooks` from a temp root."""

    def __init__(self, tmp: Path, notebooks: list[Path], start_timeout_s: float = 60.0) -> None:
        self.root = tmp / "root"
        self.root.mkdir(parents=True)
        for nb in notebooks:
            shutil.copy(nb, self.root / nb.name)
        settings = tmp / "app-settings"
        settings.mkdir()
        (settings / "overrides.json").write_text(json.dumps(OVERRIDES))
        self.port, self.token = _free_port(), secrets.token_hex(16)
        self.url = f"http://127.0.0.1:{self.port}"
        env = {**os.environ, "JUPYTER_CONFIG_DIR": str(tmp / "config"),
               "JUPYTER_RUNTIME_DIR": str(tmp / "runtime"),
               "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO),
                                                           os.environ.get("PYTHONPATH")])),
               "MPLBACKEND": "Agg"}
        self.log_path = tmp / "jupyterlab.log"
        self._log = self.log_path.open("wb")
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "jupyterlab", "--no-browser", "--ip=127.0.0.1",
             f"--port={self.port}", "--allow-root", f"--IdentityProvider.token={self.token}",
             f"--ServerApp.root_dir={self.root}", f"--LabApp.app_settings_dir={settings}",
             "--ServerApp.port_retries=0"],
            env=env, stdout=self._log, stderr=subprocess.STDOUT, start_new_session=True)
        self._wait_ready(start_timeout_s)

    def _wait_ready(self, timeout_s: float) -> None:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"jupyterlab exited {self.proc.returncode}:\n{self.log()}")
            try:
                with urllib.request.urlopen(f"{self.url}/api/status?token={self.token}",
                                            timeout=2) as r:
                    if r.status == 200:
                        return
            except OSError:
                time.sleep(0.3)
        self.close()
        raise TimeoutError(f"jupyterlab not ready after {timeout_s} s:\n{self.log()}")

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")[-4000:]

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()  # the server shuts its kernels down on SIGTERM
            try:
                self.proc.wait(15)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(5)
        self._log.close()


def launch_browser(playwright: Any) -> Any:
    return playwright.chromium.launch(
        executable_path=CHROMIUM, headless=True,
        args=["--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
              "--disable-background-networking", "--disable-component-update",
              "--disable-sync", "--no-first-run"])


def open_notebook(page: Any, server: LabServer, name: str, timeout_ms: int = 60_000) -> None:
    """Open a notebook in a fresh workspace and wait until its kernel is idle."""
    page.goto(f"{server.url}/lab/tree/{name}?token={server.token}&reset",
              timeout=timeout_ms)
    page.wait_for_selector("#jp-main-statusbar >> text=Idle", timeout=timeout_ms)


def run_all_cells(page: Any) -> None:
    page.click("#jp-menu-panel >> text=Run", timeout=10_000)
    page.click(".lm-Menu-content >> text=Run All Cells", timeout=10_000)



def serve_notebooks(tmp_path_factory: Any, notebooks: list[Path]) -> Any:
    """Body of a module-scoped fixture: skip without a browser, else serve and always close."""
    import pytest

    reason = browser_available()
    if reason:
        pytest.skip(reason)
    server = LabServer(tmp_path_factory.mktemp("lab"), notebooks)
    try:
        yield server
    finally:
        server.close()
