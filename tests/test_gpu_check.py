"""bench/gpu_check.py, the one command that runs every GPU check, on a machine without CUDA (CI's case):
one line that says so, exit status 0, nothing started or written. On a GPU host it runs the checks
(docs/gpu.md has what they measured there)."""
from __future__ import annotations

import os
import pathlib
import subprocess
import sys

ROOT = pathlib.Path(__file__).resolve().parent.parent


def _gpu_check(*args: str, tmp: pathlib.Path) -> subprocess.CompletedProcess:
    env = {**os.environ, "CUDA_VISIBLE_DEVICES": "", "PYTHONPATH": str(ROOT)}  # no GPU, even on a GPU host
    return subprocess.run([sys.executable, str(ROOT / "bench" / "gpu_check.py"), "--out", str(tmp), *args],
                          cwd=tmp, env=env, capture_output=True, text=True, timeout=120)


def test_without_cuda_it_says_so_in_one_line_and_exits_0(tmp_path):
    out = _gpu_check(tmp=tmp_path)
    assert out.returncode == 0, out.stderr
    lines = out.stdout.strip().splitlines()
    assert len(lines) == 1 and "no CUDA GPU here" in lines[0] and "nothing to check" in lines[0], out.stdout
    assert list(tmp_path.iterdir()) == []  # no results file claims checks that never ran


def test_an_unknown_check_is_refused_with_the_names(tmp_path):
    out = _gpu_check("--only", "nccl_all_reduce,no_such_check", tmp=tmp_path)
    assert out.returncode == 2 and "no_such_check" in out.stderr and "ddp_kit_vs_torchrun" in out.stderr
