"""Small helpers shared by the engine benches: a real Jupyter kernel driven through
`jupyter_client.KernelManager`, process memory from /proc, and summary statistics.

Every process a bench starts is ended by pid (never by name): `Kernel.shutdown()` records the
kernel's descendants first, shuts the kernel down, then SIGTERM/SIGKILLs what is left.
"""
from __future__ import annotations

import os
import signal
import socket
import statistics
import sys
import time
from queue import Empty
from typing import Any

BENCH_DIR = os.path.dirname(os.path.abspath(__file__))
REPO_DIR = os.path.dirname(BENCH_DIR)
ANCHOR_VENV = os.environ.get("KIT_ANCHOR_VENV", "/tmp/anchor-venv")


# -- statistics ---------------------------------------------------------------------------
def summary(xs: list[float]) -> dict[str, float]:
    xs = [x for x in xs if x is not None]
    if not xs:
        return {"n": 0}
    return {"n": len(xs), "median": statistics.median(xs), "min": min(xs), "max": max(xs),
            "p90": sorted(xs)[min(len(xs) - 1, int(0.9 * len(xs)))]}


def fmt(s: dict[str, float], scale: float = 1.0, unit: str = "s", digits: int = 3) -> str:
    if not s.get("n"):
        return "n/a"
    f = f"{{:.{digits}f}}"
    return (f"{f.format(s['median'] * scale)} {unit} ({f.format(s['min'] * scale)}-"
            f"{f.format(s['max'] * scale)}) n={s['n']}")


def verdict(ok: bool) -> str:
    return "PASS" if ok else "FAIL"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def loadavg() -> str:
    return " ".join(f"{x:.2f}" for x in os.getloadavg())


# -- /proc memory ---------------------------------------------------------------------------
def _proc_field_mib(path: str, field: str) -> float | None:
    """A "<field>: <n> kB" line of a /proc file, in MiB (None if the process is gone)."""
    try:
        with open(path) as f:
            for line in f:
                if line.startswith(field + ":"):
                    return int(line.split()[1]) / 1024
    except OSError:
        return None
    return None


def rss_mib(pid: int) -> float | None:
    """VmRSS of a process, MiB."""
    return _proc_field_mib(f"/proc/{pid}/status", "VmRSS")


def pss_mib(pid: int) -> float | None:
    """Pss from /proc/PID/smaps_rollup, MiB (shared pages divided among the processes mapping them)."""
    return _proc_field_mib(f"/proc/{pid}/smaps_rollup", "Pss")


def alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] not in ("Z", "X")
    except OSError:
        return False


def descendants(pid: int) -> list[int]:
    """All descendants of pid, from /proc (no psutil needed)."""
    children: dict[int, list[int]] = {}
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/stat") as f:
                ppid = int(f.read().rsplit(")", 1)[1].split()[1])
        except (OSError, ValueError, IndexError):
            continue
        children.setdefault(ppid, []).append(int(name))
    out, todo = [], [pid]
    while todo:
        for c in children.get(todo.pop(), []):
            out.append(c)
            todo.append(c)
    return out


def end_pids(pids: list[int], grace_s: float = 3.0) -> list[int]:
    """SIGTERM the given pids (ours), wait, SIGKILL survivors. Returns the pids that needed a signal."""
    live = [p for p in pids if alive(p)]
    _signal_all(live, signal.SIGTERM)
    deadline = time.monotonic() + grace_s
    rest = live
    while rest and time.monotonic() < deadline:
        time.sleep(0.05)
        rest = [p for p in rest if alive(p)]
    _signal_all(rest, signal.SIGKILL)
    return live


def _signal_all(pids: list[int], sig: int) -> None:
    for p in pids:
        try:
            os.kill(p, sig)
        except ProcessLookupError:
            pass


# -- a real Jupyter kernel --------------------------------------------------------------------
def anchor_python() -> str | None:
    """The throwaway venv's python (ipyparallel, nbdistributed), if it exists."""
    exe = os.path.join(ANCHOR_VENV, "bin", "python")
    return exe if os.path.exists(exe) else None


def has_module(python: str, module: str) -> tuple[bool, str]:
    import subprocess

    r = subprocess.run([python, "-c", f"import {module}"], capture_output=True, text=True)
    return r.returncode == 0, (r.stderr.strip().splitlines() or [""])[-1]


class Kernel:
    """An ipykernel started by jupyter_client; `run` times execute_request -> status idle."""

    def __init__(self, python: str | None = None, env: dict[str, str] | None = None, cwd: str | None = None):
        from jupyter_client import KernelManager

        self.km = KernelManager(kernel_name="python3")
        spec = self.km.kernel_spec
        assert spec is not None
        spec.argv[0] = python or sys.executable  # same ipykernel argv, chosen interpreter
        env = dict(env if env is not None else os.environ)
        if python:  # as after `source venv/bin/activate`
            env["PATH"] = os.path.dirname(python) + os.pathsep + env.get("PATH", "")
        env.pop("OMP_NUM_THREADS", None)
        t0 = time.perf_counter()
        self.km.start_kernel(env=env, cwd=cwd or REPO_DIR)
        self.kc = self.km.client()
        self.kc.start_channels()
        self.kc.wait_for_ready(timeout=120)
        self.startup_s = time.perf_counter() - t0
        self.pid = self.km.provisioner.process.pid  # type: ignore[union-attr]

    def run(self, code: str, timeout: float = 300) -> dict[str, Any]:
        """Execute one cell. Returns wall_s (submit -> idle), status, text (all output), error."""
        t0 = time.perf_counter()
        msg_id = self.kc.execute(code, store_history=True)
        text: list[str] = []
        error = None
        deadline = t0 + timeout
        while True:
            left = deadline - time.perf_counter()
            if left <= 0:
                return {"wall_s": time.perf_counter() - t0, "status": "driver-timeout", "text": "".join(text),
                        "error": error}
            try:
                msg = self.kc.get_iopub_msg(timeout=min(left, 5))
            except Empty:
                continue
            if msg["parent_header"].get("msg_id") != msg_id:
                continue
            mt, c = msg["msg_type"], msg["content"]
            if mt == "stream":
                text.append(c["text"])
            elif mt in ("execute_result", "display_data"):
                text.append(c["data"].get("text/plain", "") + "\n")
            elif mt == "error":
                error = f"{c['ename']}: {c['evalue']}"
                text.append("\n".join(c.get("traceback", [])) + "\n")
            elif mt == "status" and c["execution_state"] == "idle":
                break
        wall = time.perf_counter() - t0
        status = "unknown"
        while True:  # the matching shell reply (not timed)
            try:
                rep = self.kc.get_shell_msg(timeout=10)
            except Empty:
                break
            if rep["parent_header"].get("msg_id") == msg_id:
                status = rep["content"]["status"]
                break
        return {"wall_s": wall, "status": status, "text": "".join(text), "error": error}

    def must(self, code: str, timeout: float = 300) -> dict[str, Any]:
        r = self.run(code, timeout)
        if r["status"] != "ok":
            raise RuntimeError(f"cell failed ({r['status']}): {code[:80]!r}\n{r['text'][-2000:]}")
        return r

    def children(self) -> list[int]:
        return descendants(self.pid)

    def shutdown(self) -> list[int]:
        """Shut the kernel down, then end by pid any descendant it left behind; returns those pids."""
        kids = self.children()
        try:
            self.kc.stop_channels()
            self.km.shutdown_kernel(now=False)
        except Exception:
            try:
                self.km.shutdown_kernel(now=True)
            except Exception:
                pass
        return end_pids(kids + [self.pid])
