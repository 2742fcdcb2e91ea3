"""The checks bench/gpu_check.py runs, one per fresh interpreter: those on torch alone (collectives,
timing, memory, the hand-written parallel strategies on NCCL). gpu_checks_kit.py holds those that go
through the kit's ranks, magics and lessons; gpu_checks_experiments.py those of kit.experiments' runs.

A check is `fn(figures, notes)`: it fills `figures` (label -> printed value, units in the label) and
`notes`, raises `Skip(why)` when it cannot apply here, and any other exception is a failure.
"""
from __future__ import annotations

import importlib
import json
import os
import signal
import subprocess
import sys
import tempfile
import traceback
from typing import Any, Callable

Figures = dict[str, Any]


class Skip(Exception):
    """The check does not apply on this machine (the message says why)."""


# name -> (module:function, time limit in s); run in this order
CHECKS: dict[str, tuple[str, float]] = {
    "magic": ("gpu_checks_kit:magic", 60),
    "forked_rank_cuda": ("gpu_checks_kit:forked_rank_cuda", 45),
    "cuda_oom_hint": ("gpu_checks_kit:cuda_oom_hint", 45),
    "tp_sp_cp_ep_nccl": ("gpu_checks:parallel_on_nccl", 60),
    "amp_fp16_run": ("gpu_checks_experiments:amp_fp16_run", 75),
    "stop_on_gpu": ("gpu_checks_experiments:stop_on_gpu", 45),
    "accelerate_on_gpu": ("gpu_checks_experiments:accelerate_on_gpu", 60),
    "memory_bytes": ("gpu_checks:memory_bytes", 45),
    "events_vs_profiler": ("gpu_checks:events_vs_profiler", 45),
    "nccl_all_reduce": ("gpu_checks_kit:nccl_all_reduce", 75),
    "collectives_on_gpu": ("gpu_checks_experiments:collectives_on_gpu", 45),
    "ddp_kit_vs_torchrun": ("gpu_checks_kit:ddp_kit_vs_torchrun", 90),
    "pytest_test_gpu": ("gpu_checks_kit:pytest_test_gpu", 120),
    "lesson_00": ("gpu_checks_kit:lesson_00", 60),
    "lesson_03": ("gpu_checks_kit:lesson_03", 60),
    "lesson_04": ("gpu_checks_kit:lesson_04", 60),
    "lesson_11": ("gpu_checks_kit:lesson_11", 60),
}


def run_one(name: str, result_path: str) -> int:
    """Run one check in this process and write its record; leaves with os._exit (no finalizers:
    NCCL's and gloo's threads may still hold the GIL at exit)."""
    mod, fn = CHECKS[name][0].split(":")
    figures: Figures = {}
    notes: list[str] = []
    status, error = "pass", None
    try:
        getattr(importlib.import_module(mod), fn)(figures, notes)
    except Skip as e:
        status, error = "skip", str(e)
    except BaseException as e:  # noqa: BLE001 - every failure is this check's result
        traceback.print_exc()
        status, error = "fail", f"{type(e).__name__}: {e}"[:1500]
    with open(result_path, "w") as f:
        json.dump({"status": status, "figures": figures, "notes": notes, "error": error}, f, default=str)
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


def script(code: str, *args: str, timeout_s: float = 60, env: dict[str, str] | None = None) -> dict[str, Any]:
    """Run `code` in a fresh interpreter; its last stdout line is JSON. From a file, not `-c`: processes
    it spawns (torch.multiprocessing) import its functions from __main__'s file."""
    with tempfile.TemporaryDirectory(prefix="kit-gpu-script-") as tmp:
        path = os.path.join(tmp, "script.py")
        with open(path, "w") as f:
            f.write(code)
        proc = subprocess.Popen([sys.executable, path, *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                text=True, env={**os.environ, **(env or {})}, start_new_session=True)
        try:
            stdout, stderr = proc.communicate(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)  # its own session: the script and every process it started
            proc.communicate()
            raise
    if proc.returncode != 0:
        raise RuntimeError(f"script exited {proc.returncode}: {stderr[-1500:]}")
    return json.loads(stdout.strip().splitlines()[-1])


def _nccl_world_of_one(tmp: str) -> None:
    import torch
    import torch.distributed as dist
    torch.cuda.set_device(0)
    dist.init_process_group("nccl", store=dist.FileStore(os.path.join(tmp, "store"), 1), rank=0, world_size=1,
                            device_id=torch.device("cuda", 0))


def parallel_on_nccl(fig: Figures, notes: list[str]) -> None:
    """check_tp/sp/ring_attention/ep on an NCCL group with the models on the GPU. One GPU: world size 1
    (the kit places one NCCL rank per GPU; nccl_all_reduce tries two on one), so every collective runs but
    carries nothing to a peer: this checks the GPU code paths and the arithmetic, not the splits."""
    import torch.distributed as dist
    from kit.experiments import check_ep, check_ring_attention, check_sp, check_tp
    with tempfile.TemporaryDirectory() as tmp:
        _nccl_world_of_one(tmp)
        runs: list[tuple[str, Callable[..., dict[str, Any]], dict[str, Any]]] = [
            ("tp hand", check_tp, {"impl": "hand"}), ("tp torch", check_tp, {"impl": "torch"}), ("sp", check_sp, {}),
            ("ring_attention", check_ring_attention, {"zigzag": False}),
            ("ring_attention zigzag", check_ring_attention, {"zigzag": True}),
            ("ep", check_ep, {"capacity_factor": None}), ("ep capacity 1.0", check_ep, {"capacity_factor": 1.0})]
        failed = []
        for label, fn, kw in runs:
            try:
                got = fn(device="cuda", **kw)
            except Exception as e:  # noqa: BLE001 - one strategy failing must not hide the others
                traceback.print_exc()
                fig[f"{label}: error"] = f"{type(e).__name__}: {str(e)[:300]}"
                failed.append(label)
                continue
            diff = got["max_abs_diff"]
            fig[f"{label}: max|diff| from one process (world size 1, NCCL, cuda)"] = f"{diff:.1e}"
            if diff > 1e-3:
                failed.append(f"{label} differs by {diff:.1e}")
        dist.destroy_process_group()
    notes.append("world size 1 (one NCCL rank per GPU): no collective carried data to a peer")
    assert not failed, f"failed: {failed}"


def memory_bytes(fig: Figures, notes: list[str]) -> None:
    """The kit's byte counts (tensor_bytes, optimizer_bytes, ActivationMeter) against what the CUDA
    caching allocator says was allocated for each (memory_stats' allocated_bytes.all.current)."""
    import torch
    from kit.experiments.measure.memory import ActivationMeter, optimizer_bytes, tensor_bytes

    def alloc() -> int:
        torch.cuda.synchronize()
        return torch.cuda.memory_stats()["allocated_bytes.all.current"]

    width, batch = 4096, 1024
    a = alloc()
    model = torch.nn.Sequential(*[torch.nn.Sequential(torch.nn.Linear(width, width), torch.nn.GELU())
                                  for _ in range(4)]).cuda()
    ratios = {}

    def row(kind: str, kit: int, allocator: int) -> None:
        fig[f"{kind}: kit MiB / allocator MiB"] = f"{kit / 2**20:.2f} / {allocator / 2**20:.2f} = {kit / allocator:.4f}x"
        ratios[kind] = kit / allocator

    row("parameters", tensor_bytes(model.parameters()), alloc() - a)
    # cuBLAS takes a workspace from the caching allocator at its first matmul on each handle (forward's
    # thread and autograd's backward thread have one each): one warm-up step takes them before we count
    w = alloc()
    model(torch.randn(batch, width, device="cuda")).square().mean().backward()
    model.zero_grad(set_to_none=True)
    fig["left allocated by the first step (cuBLAS workspaces; the kit counts none of it), MiB"] = \
        f"{(alloc() - w) / 2**20:.2f}"
    a = alloc()
    x = torch.randn(batch, width, device="cuda")
    meter = ActivationMeter(model.parameters())
    with meter.record():
        loss = model(x).square().mean()
    row("activations (saved for backward, input included)", meter.bytes, alloc() - a - 512)  # 512: the loss
    loss.backward()
    del loss
    grads = tensor_bytes(p.grad for p in model.parameters())
    row("gradients (after backward freed the activations)", grads, alloc() - a - x.numel() * 4)
    opt = torch.optim.Adam(model.parameters(), lr=1e-4)
    a = alloc()
    opt.step()
    row("optimizer state (Adam)", optimizer_bytes(opt), alloc() - a)
    fig["max_memory_allocated MiB"] = f"{torch.cuda.max_memory_allocated() / 2**20:.1f}"
    notes.append("Adam's `step` counters are CPU tensors (not capturable): counted by the kit, not by the allocator")
    bad = {k: v for k, v in ratios.items() if not 0.98 <= v <= 1.02}
    assert not bad, f"kit bytes off the allocator's by more than 2 %: {bad}"


def events_vs_profiler(fig: Figures, notes: list[str]) -> None:
    """The kit's StepClock (CUDA events) around GPU-bound steps against torch.profiler's kernel time."""
    import torch
    from torch.profiler import ProfilerActivity, profile
    from kit.experiments.measure.timing import StepClock
    a = torch.randn(4096, 4096, device="cuda", dtype=torch.bfloat16)
    clock = StepClock(True, "cuda")
    for _ in range(5):
        a @ a
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        for step in range(5):
            clock.begin()
            with clock.phase("forward"):
                for _ in range(40):
                    a @ a
            clock.end(step, 0, 0.0, 1, keep=True)
    torch.cuda.synchronize()
    events_ms = sum(r["fwd_ms"] for r in clock.rows)
    with tempfile.TemporaryDirectory() as tmp:  # the trace's kernel rows, as the kit's --profile merges them
        prof.export_chrome_trace(os.path.join(tmp, "t.json"))
        with open(os.path.join(tmp, "t.json")) as f:
            trace = json.load(f)["traceEvents"]
    kernel_ms = sum(e.get("dur", 0) for e in trace if e.get("cat") == "kernel") / 1e3
    flops = 5 * 40 * 2 * 4096 ** 3
    fig["forward phase by CUDA events, 5 steps of 40 bf16 4096^3 matmuls, ms"] = f"{events_ms:.2f}"
    fig["kernel time by torch.profiler, ms"] = f"{kernel_ms:.2f}"
    fig["profiler / events"] = f"{kernel_ms / events_ms:.3f}x"
    fig["bf16 matmul TFLOP/s (events)"] = f"{flops / events_ms / 1e9:.0f}"
    assert 0.85 <= kernel_ms / events_ms <= 1.05, "events and profiler disagree on back-to-back kernels"
