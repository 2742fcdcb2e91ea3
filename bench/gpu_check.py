"""Every GPU check of the kit in one command, each in its own process with its own time limit.

    python bench/gpu_check.py --out DIR [--only NAME,NAME] [--budget-s 420]

On a machine without CUDA it says so in one line and exits 0. Otherwise it runs each check of
bench/gpu_checks.py (and gpu_checks_kit.py, gpu_checks_experiments.py) in a fresh interpreter, in order, each bounded by its
own timeout and by what is left of the whole budget, so one failure or hang never stops the others;
prints each check's figures with the GPU's name as it finishes, then a table, and writes everything
to DIR/gpu_check.json. Exit status 1 when a check failed or timed out (a skip is not a failure).
"""
from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT / "bench"), str(ROOT)]

from gpu_checks import CHECKS, run_one  # noqa: E402

_INFO = ("import json, torch\nok = torch.cuda.is_available()\n"
         "print(json.dumps({'cuda': ok, 'torch': torch.__version__, 'count': torch.cuda.device_count() if ok else 0,"
         " 'name': torch.cuda.get_device_name(0) if ok else None,"
         " 'nccl': '.'.join(map(str, torch.cuda.nccl.version())) if ok else None,"
         " 'memory_gib': torch.cuda.get_device_properties(0).total_memory / 2**30 if ok else None}))")


def _env() -> dict[str, str]:
    path = [str(ROOT)] + [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]
    return {**os.environ, "PYTHONPATH": os.pathsep.join(path), "PYTHONUNBUFFERED": "1"}


def cuda_info() -> dict:
    """Asked in a child process, so this driver never holds a CUDA context (it would count in the
    lessons' GPU memory)."""
    out = subprocess.run([sys.executable, "-c", _INFO], capture_output=True, text=True, timeout=120, env=_env())
    if out.returncode != 0:
        return {"cuda": False, "why": (out.stderr.strip().splitlines() or ["torch failed to import"])[-1]}
    return json.loads(out.stdout.strip().splitlines()[-1])


def _run_child(name: str, timeout_s: float, tmp: str) -> dict:
    result = os.path.join(tmp, f"{name}.json")
    t0 = time.perf_counter()
    # its own session, so a timeout ends the child and everything it started (by its group id)
    proc = subprocess.Popen([sys.executable, str(Path(__file__).resolve()), "--one", name, "--result", result],
                            cwd=ROOT, env=_env(), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            start_new_session=True)
    try:
        output, _ = proc.communicate(timeout=timeout_s)
        status = None
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        output, _ = proc.communicate()
        status = "timeout"
    seconds = time.perf_counter() - t0
    try:
        with open(result) as f:
            rec = json.load(f)
    except (OSError, ValueError):
        rec = {"status": "fail", "figures": {}, "notes": [], "error": f"no result (exit code {proc.returncode})"}
    if status:
        rec["status"], rec["error"] = status, f"stopped after {timeout_s:.0f} s (its time limit)"
    rec.update(name=name, seconds=round(seconds, 1), timeout_s=round(timeout_s))
    if rec["status"] in ("fail", "timeout"):
        rec["output_tail"] = (output or "")[-2500:]
    return rec


def _print_check(rec: dict, gpu: str) -> None:
    print(f"\n== {rec['name']}: {rec['status'].upper()} in {rec['seconds']} s (limit {rec['timeout_s']} s) on {gpu}",
          flush=True)
    for k, v in rec.get("figures", {}).items():
        print(f"   {k}: {v}  [{gpu}]")
    for n in rec.get("notes", []):
        print(f"   note: {n}")
    if rec.get("error"):
        print(f"   error: {rec['error']}")
    if rec.get("output_tail"):
        print("   output (tail):\n      " + rec["output_tail"].rstrip().replace("\n", "\n      "))


def table(results: list[dict], gpu: str) -> str:
    lines = [f"GPU checks on {gpu}", f"{'check':<22} {'status':<8} {'s':>6}  headline"]
    for r in results:
        head = next(iter(r.get("figures", {}).items()), ("", r.get("error") or ""))
        text = (f"{head[0]}: {head[1]}" if head[0] else str(head[1])).replace("\n", " ")
        lines.append(f"{r['name']:<22} {r['status']:<8} {r['seconds']:>6}  {text[:90]}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default="bench/results", help="folder for gpu_check.json")
    ap.add_argument("--only", default="", help="comma-separated check names (default: all)")
    ap.add_argument("--budget-s", type=float, default=420.0, help="wall-clock budget for all checks together (about 340 s for the 17 on an H200: 313 s for 15, 25 s for 2)")
    ap.add_argument("--anyway", action="store_true", help="run the checks without CUDA too (they fail: tries the harness)")
    ap.add_argument("--one", help=argparse.SUPPRESS)
    ap.add_argument("--result", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.one:
        return run_one(args.one, args.result)
    names = [n for n in args.only.split(",") if n] or list(CHECKS)
    unknown = [n for n in names if n not in CHECKS]
    if unknown:
        ap.error(f"unknown check(s) {unknown}; choose among {list(CHECKS)}")
    info = cuda_info()
    out_dir = Path(args.out)
    if not info.get("cuda") and not args.anyway:
        why = info.get("why") or f"torch {info.get('torch')} sees no CUDA device"
        print(f"gpu_check: no CUDA GPU here ({why}); nothing to check, run it on a GPU machine.")
        return 0
    if not info.get("cuda"):
        info.update(name="no GPU (--anyway)", memory_gib=0.0)
    gpu = f"{info['name']} ({info['memory_gib']:.0f} GiB, torch {info['torch']}, NCCL {info['nccl']})"
    print(f"gpu_check: {info['count']} GPU(s) visible; checks run on {gpu}", flush=True)
    deadline = time.monotonic() + args.budget_s
    results = []
    with tempfile.TemporaryDirectory(prefix="kit-gpu-check-") as tmp:
        for name in names:
            left = deadline - time.monotonic()
            if left < 5:
                rec = {"name": name, "status": "not run", "seconds": 0.0, "timeout_s": 0, "figures": {}, "notes": [],
                       "error": f"the {args.budget_s:.0f} s budget was spent before it"}
            else:
                rec = _run_child(name, min(CHECKS[name][1], left), tmp)
            rec["gpu"] = info["name"]
            results.append(rec)
            _print_check(rec, info["name"])
    print("\n" + table(results, info["name"]))
    out_dir.mkdir(parents=True, exist_ok=True)
    path = out_dir / "gpu_check.json"
    path.write_text(json.dumps({"gpu": info, "results": results}, indent=1))
    print(f"\nwritten: {path}")
    return 1 if any(r["status"] in ("fail", "timeout") for r in results) else 0


if __name__ == "__main__":
    sys.exit(main())
