"""A real Jupyter kernel (jupyter_client) for tests of what a notebook user meets.

Why not nbclient: a test here interrupts a running cell, reads the kernel's memory, and
compares the execute_reply's execution_count (the number Jupyter shows) with the kit's labels.
The kernel runs this test's own interpreter (`sys.executable -m ipykernel_launcher`), so a
virtual environment with another IPython tests that IPython. Every wait is bounded.
"""
from __future__ import annotations

import json
import os
import queue
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from typing import Any

__all__ = ["Kernel", "Reply", "kernel_available"]


def kernel_available() -> str | None:
    """None when a kernel can start here, else the reason to skip."""
    try:
        import ipykernel  # noqa: F401
        import jupyter_client  # noqa: F401
    except ImportError as e:
        return f"needs ipykernel and jupyter_client ({e})"
    return None


@dataclass
class Reply:
    """One executed cell: its execute_reply and everything it published."""

    status: str
    execution_count: int | None
    stdout: str = ""
    stderr: str = ""
    error: dict[str, Any] | None = None
    displays: list[dict[str, Any]] = field(default_factory=list)

    @property
    def text(self) -> str:
        """stdout, stderr and the error's traceback, as the user reads them (no ANSI colours)."""
        import re

        tb = "\n".join(self.error["traceback"]) if self.error else ""
        return re.sub(r"\x1b\[[0-9;]*m", "", self.stdout + self.stderr + tb)


class Kernel:
    """`with Kernel() as k: k.run("%load_ext kit")` — a kernel in its own temporary directory."""

    def __init__(self, cwd: str | None = None, env: dict[str, str] | None = None, prefix: tuple[str, ...] = ()):
        """`env`: the kernel's whole environment (this process's by default); `prefix`: a command the kernel
        runs under (("taskset", "-c", "0"))."""
        from jupyter_client.kernelspec import KernelSpecManager
        from jupyter_client.manager import KernelManager

        self._dir = tempfile.TemporaryDirectory(prefix="kit-kernel-")
        spec_dir = os.path.join(self._dir.name, "kernels", "kit-test")
        os.makedirs(spec_dir)
        with open(os.path.join(spec_dir, "kernel.json"), "w") as f:
            json.dump({"argv": [*prefix, sys.executable, "-m", "ipykernel_launcher", "-f", "{connection_file}"],
                       "display_name": "kit test", "language": "python"}, f)
        ksm = KernelSpecManager(kernel_dirs=[os.path.join(self._dir.name, "kernels")])
        # Unix sockets in this directory, not TCP ports: jupyter_client picks a free port, closes it and hands
        # it to the kernel, and another process (a rank, the other test worker) can take it in between.
        self.km = KernelManager(kernel_name="kit-test", kernel_spec_manager=ksm, transport="ipc",
                                ip=os.path.join(self._dir.name, "k"))
        self.cwd = cwd or self._dir.name
        self.env = dict(os.environ) if env is None else env
        self.kc: Any = None
        self._read_early: dict[str, list[dict[str, Any]]] = {}  # iopub messages read by wait_for_text, per cell

    def __enter__(self) -> "Kernel":
        self.km.start_kernel(cwd=self.cwd, env=self.env)
        self.kc = self.km.client()
        self.kc.start_channels()
        self.kc.wait_for_ready(timeout=60)
        return self

    def __exit__(self, *exc: object) -> None:
        try:
            self.run("import kit; kit.current_cluster() and kit.current_cluster().shutdown()", timeout_s=20)
        except Exception:
            pass
        self.kc.stop_channels()
        self.km.shutdown_kernel(now=False)
        self._dir.cleanup()

    @property
    def pid(self) -> int:
        return self.km.provisioner.process.pid  # type: ignore[union-attr]

    def submit(self, code: str) -> str:
        """Send a cell and return its message id (wait for it with `wait`)."""
        return self.kc.execute(code)

    def wait(self, msg_id: str, timeout_s: float = 120.0, interrupted_at_a_timed_moment: bool = False) -> Reply:
        """The cell's reply and everything it printed. `interrupted_at_a_timed_moment`: the test sent SIGINT after
        a sleep, so it may land after the cell's code, while ipykernel wraps the execution up. ipykernel then
        logs "KeyboardInterrupt caught in kernel.", reports idle and sends no execute_reply (its
        `dispatch_shell` catches the KeyboardInterrupt around the whole handler): seen once in 14 `.ci/run`s (2026-11-28).
        Waiting for that reply would fail the test on ipykernel's race, so once the kernel is idle the reply gets
        10 s and, missing, the Reply says "no reply" with what the cell printed (the test checks that)."""
        out: dict[str, list[str]] = {"stdout": [], "stderr": []}
        error: dict[str, Any] | None = None
        displays: list[dict[str, Any]] = []
        deadline = time.monotonic() + timeout_s
        idle = False
        early = self._read_early.pop(msg_id, [])
        while not idle:
            try:
                msg = early.pop(0) if early else self._next(self.kc.get_iopub_msg, deadline)
            except TimeoutError:
                raise TimeoutError(self._stuck(out, error)) from None
            if msg["parent_header"].get("msg_id") != msg_id:
                continue
            kind, content = msg["msg_type"], msg["content"]
            if kind == "stream":
                out[content["name"]].append(content["text"])
            elif kind == "error":
                error = content
            elif kind in ("display_data", "execute_result"):
                displays.append(content["data"])
            elif kind == "status" and content["execution_state"] == "idle":
                idle = True
        if interrupted_at_a_timed_moment:
            deadline = min(deadline, time.monotonic() + 10.0)
        while True:
            try:
                reply = self._next(self.kc.get_shell_msg, deadline)
            except TimeoutError:
                if not interrupted_at_a_timed_moment:
                    raise
                return Reply("no reply", None, "".join(out["stdout"]), "".join(out["stderr"]), error, displays)
            if reply["parent_header"].get("msg_id") == msg_id:
                break
        content = reply["content"]
        return Reply(content["status"], content.get("execution_count"), "".join(out["stdout"]),
                     "".join(out["stderr"]), error, displays)

    def wait_for_text(self, msg_id: str, needle: str, timeout_s: float = 60.0) -> str:
        """Read a running cell's stdout and stderr as they stream until `needle` appears or the cell ends;
        return what it printed so far. The messages stay for `wait`, which still returns the whole cell."""
        seen = self._read_early.setdefault(msg_id, [])
        text = "".join(m["content"]["text"] for m in seen if m["msg_type"] == "stream")
        deadline = time.monotonic() + timeout_s
        while needle not in text:
            if any(m["msg_type"] == "status" and m["content"]["execution_state"] == "idle" for m in seen):
                break  # the cell ended without printing it
            msg = self._next(self.kc.get_iopub_msg, deadline)
            if msg["parent_header"].get("msg_id") != msg_id:
                continue
            seen.append(msg)
            if msg["msg_type"] == "stream":
                text += msg["content"]["text"]
        return text

    def run(self, code: str, timeout_s: float = 120.0) -> Reply:
        return self.wait(self.submit(code), timeout_s)

    def interrupt(self) -> None:
        self.km.interrupt_kernel()

    def value(self, expr: str) -> Any:
        """The kernel-side value of `expr` (JSON-able), read through a silent print."""
        r = self.run(f"import json as _j; print('@@' + _j.dumps({expr}))")
        line = [x for x in r.stdout.splitlines() if x.startswith("@@")]
        assert line, f"no value for {expr!r}: {r.text[-2000:]}"
        return json.loads(line[-1][2:])

    def _stuck(self, out: dict[str, list[str]], error: dict[str, Any] | None) -> str:
        """Why a cell never ended, for the failure report: what it printed, and the Python stacks of the
        kernel and every process under it (py-spy, from the test extras) taken now, while it still hangs.
        A hang seen once in CI must be explainable from that run's report alone."""
        printed = ("".join(out["stdout"]) + "".join(out["stderr"]))[-3000:]
        report = [f"the kernel did not answer in time; the cell printed so far:\n{printed or '(nothing)'}"]
        if error:
            report.append(f"its error: {error.get('ename')}: {error.get('evalue')}")
        spy = shutil.which("py-spy") or shutil.which("py-spy", path=os.path.dirname(sys.executable))
        if spy is None:
            return "\n".join(report + ["(no py-spy here to show the stacks)"])
        try:
            import psutil

            pids = [self.pid] + [p.pid for p in psutil.Process(self.pid).children(recursive=True)]
        except Exception as e:  # the kernel itself is gone
            return "\n".join(report + [f"(no stacks: {e})"])
        for pid in pids:
            try:
                # --nonblocking: read the stacks without pausing the process. A paused (ptrace) dump of a
                # many-threaded process left a later SIGINT to another thread in 5 of 100 trials, while the main
                # thread slept on (0 of 100 without the pause): the test's own interrupt was lost in CI.
                dumped = subprocess.run([spy, "dump", "--nonblocking", "--pid", str(pid)], capture_output=True,
                                        text=True, timeout=30)
                report.append(f"--- pid {pid} ---\n{(dumped.stdout + dumped.stderr)[-6000:]}")
            except (OSError, subprocess.TimeoutExpired) as e:
                report.append(f"--- pid {pid}: no stack ({e}) ---")
        return "\n".join(report)

    @staticmethod
    def _next(get: Any, deadline: float) -> dict[str, Any]:
        left = deadline - time.monotonic()
        if left <= 0:
            raise TimeoutError("the kernel did not answer in time")
        try:
            return get(timeout=left)
        except queue.Empty:
            raise TimeoutError("the kernel did not answer in time") from None
