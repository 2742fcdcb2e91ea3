"""GPU checks of the kit's experiments on one GPU: a profiled AMP run, stop, Accelerate beside the
single loop, and the collective sweeps (bench/gpu_check.py runs them; gpu_checks_kit.py has the ranks,
magics, collectives against bare torch, DDP against torchrun, the CUDA tests and the lessons)."""
from __future__ import annotations

import json
import math
import os
import tempfile
import threading
import time

from gpu_checks import Figures, Skip
from gpu_checks_kit import _cluster


def amp_fp16_run(fig: Figures, notes: list[str]) -> None:
    """kit.experiments.run on the GPU: gpt, fp16 autocast with a GradScaler, profiled. Figures: the
    CUDA-event step breakdown, the memory row beside max_memory_allocated, and the profile's kernels."""
    import kit.experiments as ke
    with tempfile.TemporaryDirectory() as tmp:
        folder = os.path.join(tmp, "trace")
        trace = os.path.join(folder, "all_ranks.json")  # the merged trace --profile DIR writes
        try:
            rec = ke.run({"strategy": "single", "world_size": 1, "workload": "gpt", "model_size": "base",
                          "precision": "fp16", "batch_size": 64, "steps": 8, "warmup_steps": 2},
                         device="gpu", profile=folder)
        finally:
            ke.shutdown()
        events = json.load(open(trace))["traceEvents"] if os.path.exists(trace) else []
    s, env, mem = rec["summary"], rec["env"], rec["memory"][0]
    fig["env"] = f"{env['backend']} {env['device_type']} {env['device_name']}"
    fig["step / fwd / bwd / opt ms (CUDA events, profiled)"] = (f"{s['step_ms']:.2f} / {s['fwd_ms']:.2f} / "
                                                                f"{s['bwd_ms']:.2f} / {s['opt_ms']:.2f}")
    fig["loss_final"] = f"{s['loss_final']:.3f}"
    fig["params / grads / optimizer / activations MiB"] = " / ".join(
        f"{mem[k]:.1f}" for k in ("params_mib", "grads_mib", "optimizer_mib", "activations_mib"))
    fig["peak MiB (max_memory_allocated)"] = f"{mem['peak_mib']:.1f}" if mem["peak_mib"] is not None else "None"
    kernels = [e for e in events if e.get("cat") == "kernel"]
    fig["profile: kernel events, kernel ms"] = f"{len(kernels)}, {sum(e['dur'] for e in kernels) / 1e3:.1f}"
    scaler = [n for n in rec["notes"] if "GradScaler" in n]
    notes += scaler[:1]
    assert env["backend"] == "nccl" and env["device_type"] == "cuda", env
    assert math.isfinite(s["loss_final"]) and scaler, (s["loss_final"], rec["notes"])
    four = sum(mem[k] for k in ("params_mib", "grads_mib", "optimizer_mib"))
    assert mem["peak_mib"] is not None and mem["peak_mib"] >= four, (mem["peak_mib"], four)
    assert kernels, "the profile has no CUDA kernel events"


def stop_on_gpu(fig: Figures, notes: list[str]) -> None:
    """`run(..., stop=event)` on the GPU: the Stop frame reaches a CUDA rank and the run ends at the
    next step boundary, its record marked incomplete (runner._agree_to_stop reads the flag from a
    tensor on the device; with one GPU there is one rank, so no NCCL MAX-reduce of the flag)."""
    import kit.experiments as ke
    stop = threading.Event()
    t0 = time.perf_counter()
    try:
        rec = ke.run({"strategy": "single", "world_size": 1, "model_size": "tiny", "steps": 100_000,
                      "warmup_steps": 0}, device="gpu", stop=stop, progress=lambda k, n: k >= 3 and stop.set())
    finally:
        ke.shutdown()
    took_s = time.perf_counter() - t0
    fig["steps run of 100000, s"] = f"{len(rec['steps'])}, {took_s:.2f}"
    fig["env"] = f"{rec['env']['backend']} {rec['env']['device_type']}"
    assert rec["env"]["device_type"] == "cuda", rec["env"]
    assert rec.get("complete") is False and any("stopped early" in n for n in rec["notes"]), rec["notes"]
    assert len(rec["steps"]) < 1000, len(rec["steps"])



def accelerate_on_gpu(fig: Figures, notes: list[str]) -> None:
    """`strategy="accelerate"` (Hugging Face Accelerate places the model and casts) on the GPU beside the
    kit's own `single` loop, same seed and batches: the loss curves must agree (fp32 to float rounding,
    bf16 to bf16's). World size 1, the only one besides `single` that one GPU can run: every other strategy
    needs two ranks or shards over them (config_rules)."""
    try:
        import accelerate  # noqa: F401
    except ImportError as e:
        raise Skip(f"accelerate is not installed ({e})")
    import kit.experiments as ke
    losses: dict[tuple[str, str], list[float]] = {}
    grads_mib: dict[tuple[str, str], float] = {}
    try:
        for precision in ("fp32", "bf16"):
            for strategy in ("single", "accelerate"):
                rec = ke.run({"strategy": strategy, "world_size": 1, "model_size": "tiny", "steps": 6,
                              "warmup_steps": 1, "precision": precision}, device="gpu")
                assert rec["env"]["device_type"] == "cuda", rec["env"]
                losses[strategy, precision] = [st["loss"] for st in rec["steps"]]
                grads_mib[strategy, precision] = rec["memory"][0]["grads_mib"]
                fig[f"{strategy} {precision}: step ms, loss_final"] = (
                    f"{rec['summary']['step_ms']:.2f}, {rec['summary']['loss_final']:.4f}")
    finally:
        ke.shutdown()
    for precision, tol in (("fp32", 1e-4), ("bf16", 3e-2)):
        a, b = losses["single", precision], losses["accelerate", precision]
        diff = max(abs(x - y) for x, y in zip(a, b))
        fig[f"{precision}: max |loss difference| accelerate vs single over {len(a)} steps"] = f"{diff:.1e}"
        assert len(a) == len(b) and all(math.isfinite(x) for x in a + b) and diff <= tol, (precision, a, b)
        # one process is not wrapped in DDP: no bucket copy of the gradients may be counted beside them
        assert grads_mib["single", precision] == grads_mib["accelerate", precision], grads_mib


def collectives_on_gpu(fig: Figures, notes: list[str]) -> None:
    """The kit's collective sweep (`collective_benchmark`, lessons 01-02's alpha-beta fit) on a `--gpus 1`
    rank: its CUDA path (tensors on the rank's GPU, synchronize around each timed call) runs and gives
    finite times. World size 1, so NCCL carries nothing to a peer: the times are issue costs and copies."""
    from kit.experiments.benchmarks.allreduce_algos import allreduce_algorithms_benchmark
    from kit.experiments.benchmarks.collectives import OPS, collective_benchmark
    with _cluster() as c:
        recs = collective_benchmark(cluster=c, world_size=1, sizes=[2**10, 2**20, 2**24], iters=10)
        algos = allreduce_algorithms_benchmark(cluster=c, world_size=1, sizes=[2**12, 2**20], iters=5)
    for r in algos:
        fig[f"all-reduce by {r['op']}: ms at 4 KiB / 1 MiB"] = " / ".join(
            f"{p['time_ms']:.3f}" for p in r["points"])
    for r in recs:
        fig[f"{r['op']} ms at 1 KiB / 1 MiB / 16 MiB"] = " / ".join(f"{p['time_ms']:.3f}" for p in r["points"])
    notes.append("world size 1: no peer, so these are not bus bandwidths (bench/bench_collectives.py on 2+ GPUs)")
    assert {r["op"] for r in recs} == set(OPS), recs
    assert all(r["backend"] == "nccl" and r["device_type"] == "cuda" for r in recs), recs
    assert all(math.isfinite(p["time_ms"]) and p["time_ms"] > 0 for r in recs + algos for p in r["points"]), recs
