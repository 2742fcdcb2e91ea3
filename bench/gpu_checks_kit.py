"""The GPU checks that go through the kit: the magic, forked ranks, the OOM hint, an fp16 run with
its profile, collectives and DDP under the kit beside bare torch, tests/test_gpu.py and the lessons.
Each is `fn(figures, notes)` (bench/gpu_checks.py says how they are run)."""
from __future__ import annotations

import contextlib
import io
import json
import math
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any, Iterator

from gpu_checks import Figures, Skip, script

ROOT = Path(__file__).resolve().parent.parent


def _quiet(*_: object) -> None:
    pass


@contextlib.contextmanager
def _cluster(world_size: int = 1, **kw: Any) -> Iterator[Any]:
    from kit.config import LaunchConfig
    from kit.engine.cluster import Cluster
    c = Cluster(LaunchConfig(world_size=world_size, device="gpu", **kw)).start()
    try:
        yield c
    finally:
        c.shutdown()


def magic(fig: Figures, notes: list[str]) -> None:
    """`%%distributed --gpus 2` with one GPU visible (banner, gloo CPU ranks, --strict refused), then
    `--gpus 1` on the GPU, through IPython's InteractiveShell as a notebook user types them."""
    try:
        from IPython.core.error import UsageError
        from IPython.testing.globalipapp import start_ipython
    except ImportError as e:
        raise Skip(f"IPython is not installed ({e})")
    from kit.engine.devices import visible_gpu_count
    gpus = visible_gpu_count()
    if gpus != 1:
        notes.append(f"{gpus} GPUs visible: --gpus 2 is not the one-GPU fallback here")
    ip = start_ipython() or __import__("IPython").get_ipython()
    ip.run_line_magic("load_ext", "kit")
    from kit.notebook.magics import get_cluster
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        ip.run_cell_magic("distributed", "--gpus 2", "(dist.get_backend(), str(device))")
    c = get_cluster()
    text = out.getvalue()
    fig["--gpus 2: backend, device"] = f"{c.backend}, {c.device_type}"
    fig["--gpus 2: banner"] = (c.banner or "")[:160]
    assert c.backend == "gloo" and c.device_type == "cpu" and "FALLBACK" in text and "Duplicate GPU" in text, text
    t0 = time.perf_counter()
    try:
        ip.run_cell_magic("distributed", "--gpus 2 --strict", "1")
        raise AssertionError("--gpus 2 --strict ran with one GPU")
    except UsageError as e:
        fig["--gpus 2 --strict"] = f"refused: {str(e)[:120]}"
        assert "--strict forbids" in str(e)
    ip.run_line_magic("unload_ext", "kit")  # stops the two CPU ranks
    ip.run_line_magic("load_ext", "kit")
    out = io.StringIO()
    t0 = time.perf_counter()
    with contextlib.redirect_stdout(out):
        ip.run_cell_magic("distributed", "--gpus 1",
                          "x = torch.ones(1024, 1024, device=device)\ndist.all_reduce(x)\n"
                          "print('RESULT', dist.get_backend(), device, torch.cuda.get_device_name(device), "
                          "x[0, 0].item(), torch.cuda.memory_allocated() // 2**20)")
    fig["--gpus 1: first cell s (start + cell)"] = f"{time.perf_counter() - t0:.2f}"
    line = next((ln for ln in out.getvalue().splitlines() if "RESULT" in ln), out.getvalue()[-300:])
    fig["--gpus 1: rank says"] = line.split("RESULT", 1)[-1].strip()
    c = get_cluster()
    assert c.backend == "nccl" and c.device_type == "cuda" and c.banner is None, (c.backend, c.banner)
    assert "nccl cuda:0" in line and " 1.0 " in line, line
    ip.run_line_magic("unload_ext", "kit")


def forked_rank_cuda(fig: Figures, notes: list[str]) -> None:
    """A rank forked from the rank template (which never touched CUDA) uses CUDA; so does the rank
    forked again by a restart."""
    from kit.engine import template as templates
    code = ("a = torch.randn(2048, 2048, device=device)\nb = (a @ a.T).diagonal().sub(a.square().sum(1))\n"
            "import os\n(os.getppid(), torch.cuda.is_initialized(), b.abs().max().item(), str(device))")
    t0 = time.perf_counter()
    with _cluster() as c:
        start_s = time.perf_counter() - t0
        ranks = list(c.status()["ranks"].values())
        assert all(info["started"] == "forked" for info in ranks), "the rank is not a fork of the template"
        assert all(info["template_saw"]["cuda_initialized"] is False for info in ranks), ranks
        parent, inited, err, dev = c.run(code, on_output=_quiet).values[0]
        assert parent in {t.pid for t in templates._TEMPLATES.values()} and inited and err < 1e-2, (parent, inited, err)
        fig["start of 1 forked GPU rank, s"] = f"{start_s:.2f}"
        fig["forked rank: device, |A A^T diag - row norms| max"] = f"{dev}, {err:.1e}"
        t1 = time.perf_counter()
        c.restart()
        parent, inited, err, dev = c.run(code, on_output=_quiet).values[0]
        fig["restart + first CUDA cell, s"] = f"{time.perf_counter() - t1:.2f}"
        assert c.status()["ranks"][0]["started"] == "forked" and inited and err < 1e-2


def cuda_oom_hint(fig: Figures, notes: list[str]) -> None:
    """A CUDA OOM in a cell gives the kit's plain-words hint, and the rank lives on."""
    from kit.diagnose import hint
    from kit.errors import CellError
    with _cluster() as c:
        res = c.run("big = torch.empty(1 << 50, dtype=torch.uint8, device=device)", on_output=_quiet)
        assert res.failures, "a 1 PiB allocation succeeded"
        e = CellError(res.failures, res.notes)  # what the magic raises (kit/notebook/show.py)
        h = hint(e.root) or ""
        rendered = "\n".join(e._render_traceback_())
        fig["error"] = f"{e.root.ename}: {e.root.evalue[:120]}"
        fig["hint"] = h[:260]
        fig["hint shown with the error"] = h[:60] in rendered
        assert "ran out of GPU memory" in h and "tried to allocate" in h, h
        assert h[:60] in rendered, rendered[-800:]
        assert c.run("torch.ones(2, device=device).sum().item()", on_output=_quiet).values[0] == 2.0


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
    try:
        for precision in ("fp32", "bf16"):
            for strategy in ("single", "accelerate"):
                rec = ke.run({"strategy": strategy, "world_size": 1, "model_size": "tiny", "steps": 6,
                              "warmup_steps": 1, "precision": precision}, device="gpu")
                assert rec["env"]["device_type"] == "cuda", rec["env"]
                losses[strategy, precision] = [st["loss"] for st in rec["steps"]]
                fig[f"{strategy} {precision}: step ms, loss_final"] = (
                    f"{rec['summary']['step_ms']:.2f}, {rec['summary']['loss_final']:.4f}")
    finally:
        ke.shutdown()
    for precision, tol in (("fp32", 1e-4), ("bf16", 3e-2)):
        a, b = losses["single", precision], losses["accelerate", precision]
        diff = max(abs(x - y) for x, y in zip(a, b))
        fig[f"{precision}: max |loss difference| accelerate vs single over {len(a)} steps"] = f"{diff:.1e}"
        assert len(a) == len(b) and all(math.isfinite(x) for x in a + b) and diff <= tol, (precision, a, b)


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

_AR = """
import time, torch, torch.distributed as dist
x = torch.ones(64 * 2**20, device=device)  # 256 MiB of fp32
out = torch.empty_like(x)
for _ in range(5):
    dist.all_reduce(x)
    dist.all_gather_into_tensor(out, x)
# torch's own function under the kit's ledger wrapper (in a bare process there is none: the same one)
own = getattr(dist.all_reduce, "__wrapped__", dist.all_reduce)
per_call_us = {"called": [], "own": []}
for _ in range(5):  # interleaved rounds, so a slow moment of the host hits both alike
    for key, fn in (("called", dist.all_reduce), ("own", own)):
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        for _ in range(200):
            fn(x)  # NCCL moves nothing at world size 1: this is the cost of issuing one
        torch.cuda.synchronize()
        per_call_us[key].append((time.perf_counter() - t0) / 200 * 1e6)
s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
s.record()
for _ in range(20):
    dist.all_gather_into_tensor(out, x)  # world size 1: one 256 MiB device copy
e.record()
torch.cuda.synchronize()
ar_ms = (min(per_call_us["called"]), s.elapsed_time(e) / 20, min(per_call_us["own"]))
"""
_BARE = """
import json, os, sys, torch, torch.distributed as dist
torch.cuda.set_device(0)
device = torch.device("cuda", 0)
dist.init_process_group("nccl", store=dist.FileStore(sys.argv[1], 1), rank=0, world_size=1, device_id=device)
{body}
print(json.dumps({{"ms": list(ar_ms)}}))
os._exit(0)
"""
_TWO_ON_ONE = """
import json, os, sys, torch, torch.distributed as dist, torch.multiprocessing as mp
def rank(r, path):
    try:
        torch.cuda.set_device(0)
        dist.init_process_group("nccl", store=dist.FileStore(path, 2), rank=r, world_size=2)
        t = torch.ones(4, device="cuda")
        dist.all_reduce(t)
        torch.cuda.synchronize()
    except Exception as e:
        with open(f"{path}.err{r}", "w") as f:
            f.write(f"{type(e).__name__}: {e}")
        os._exit(1)
    os._exit(0)
try:
    mp.spawn(rank, args=(sys.argv[1],), nprocs=2, join=True)
    print(json.dumps({"ok": True}))
except Exception as e:
    errs = [open(p).read() for p in (sys.argv[1] + ".err0", sys.argv[1] + ".err1") if os.path.exists(p)]
    print(json.dumps({"ok": False, "error": (errs[0] if errs else str(e))[-600:]}))
"""


def nccl_all_reduce(fig: Figures, notes: list[str]) -> None:
    """Collectives on NCCL (world size 1) in a kit rank (checks on, as a cell runs by default, and off)
    beside a bare torch process: the cost of issuing an all_reduce, and all_gather_into_tensor's
    bandwidth (a device copy at world size 1), as ratios; then whether NCCL lets two ranks share the GPU."""
    size = 256 * 2**20
    with tempfile.TemporaryDirectory() as tmp:
        bare = [script(_BARE.format(body=_AR), os.path.join(tmp, f"s{i}"), timeout_s=60)["ms"] for i in range(2)]
        with _cluster() as c:
            kit = [c.run(_AR + "ar_ms", on_output=_quiet).values[0] for _ in range(2)]
            unchecked = [c.run(_AR + "ar_ms", on_output=_quiet, check=False).values[0] for _ in range(2)]
        try:
            two = script(_TWO_ON_ONE, os.path.join(tmp, "two"), timeout_s=45, env={"NCCL_DEBUG": "WARN"})
        except subprocess.TimeoutExpired:
            two = {"ok": False, "error": "no answer within 45 s (stopped)"}
    call = {n: min(r[0] for r in runs) for n, runs in (("kit", kit), ("unchecked", unchecked), ("bare", bare))}
    copy = {n: min(r[1] for r in runs) for n, runs in (("kit", kit), ("unchecked", unchecked), ("bare", bare))}
    own = min(r[2] for r in kit + unchecked)  # torch's own all_reduce, called in the kit's rank
    fig["all_reduce issue cost us/call: kit (checks on) / kit (check=False) / bare"] = (
        f"{call['kit']:.1f} / {call['unchecked']:.1f} / {call['bare']:.1f}")
    # Where the difference lies: the ledger's wrapper (kit/rank/ledger.py), or the rank process itself.
    fig["all_reduce us/call in the kit rank: torch's own function / bare process"] = f"{own:.1f} / {call['bare']:.1f}"
    fig["all_gather_into_tensor 256 MiB (world 1) GB/s: kit / bare"] = (
        f"{size / copy['kit'] / 1e6:.0f} / {size / copy['bare'] / 1e6:.0f} = {copy['bare'] / copy['kit']:.3f}x")
    fig["two NCCL ranks on one GPU"] = "run" if two["ok"] else f"refused: {two['error'][-300:]}"
    notes.append("one GPU: bus bandwidth needs >= 2 ranks (busbw = algbw x 2(n-1)/n is 0 at n = 1); at world "
                 "size 1 NCCL's all_reduce moves nothing, so its figure is the cost of issuing one")
    assert 0.9 <= copy["bare"] / copy["kit"] <= 1.1, copy
    assert call["kit"] <= 3 * call["bare"] + 20, call  # no kernel round trip at world size 1 (kit/rank/ledger.py)


_DDP = """
import time, torch
from torch.nn.parallel import DistributedDataParallel as DDP
torch.manual_seed(0)
model = torch.nn.Sequential(*[torch.nn.Sequential(torch.nn.Linear(4096, 4096), torch.nn.GELU()) for _ in range(6)]).to(device)
ddp = DDP(model, device_ids=[device.index])
opt = torch.optim.AdamW(ddp.parameters(), lr=1e-4)
x = torch.randn(1024, 4096, device=device)
times = []
for i in range(40):
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    ddp(x).square().mean().backward()
    opt.step()
    opt.zero_grad(set_to_none=True)
    torch.cuda.synchronize()
    times.append((time.perf_counter() - t0) * 1e3)
step_ms = sorted(times[10:])[15]
del ddp, model, opt
"""
_TORCHRUN = """
import json, os, torch, torch.distributed as dist
local = int(os.environ["LOCAL_RANK"])
torch.cuda.set_device(local)
device = torch.device("cuda", local)
dist.init_process_group("nccl", device_id=device)
{body}
if dist.get_rank() == 0:
    print("RESULT", json.dumps(step_ms))
dist.destroy_process_group()
"""


def _torchrun_ms(path: str) -> float:
    tr = os.path.join(os.path.dirname(sys.executable), "torchrun")
    cmd = [tr] if os.path.exists(tr) else [sys.executable, "-m", "torch.distributed.run"]
    out = subprocess.run(cmd + ["--standalone", "--nproc-per-node", "1", path], capture_output=True, text=True,
                         timeout=60)
    line = [ln for ln in out.stdout.splitlines() if ln.startswith("RESULT")]
    if not line:
        raise RuntimeError(f"torchrun: {out.stderr[-1500:]}")
    return json.loads(line[-1].split(None, 1)[1])


def ddp_kit_vs_torchrun(fig: Figures, notes: list[str]) -> None:
    """The same DDP training step (6 x 4096 MLP, batch 1024, AdamW) in a kit rank and under torchrun,
    one GPU, alternating kit, torchrun, kit, torchrun; median of 30 steps each."""
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "ddp_torchrun.py")
        Path(path).write_text(_TORCHRUN.format(body=_DDP))
        kit, bare = [], []
        with _cluster() as c:
            for _ in range(2):
                kit.append(c.run(_DDP + "step_ms", on_output=_quiet).values[0])
                bare.append(_torchrun_ms(path))
    k, b = statistics.median(kit), statistics.median(bare)
    fig["DDP step ms: kit / torchrun"] = f"{k:.2f} / {b:.2f} = {k / b:.3f}x"
    fig["runs (kit; torchrun)"] = f"{[round(v, 2) for v in kit]}; {[round(v, 2) for v in bare]}"
    assert k / b <= 1.05, "the kit's DDP step is slower than torchrun's by more than 5 %"


# every test that skips without CUDA (conftest.requires_cuda, or test_gpu.py's own mark)
GPU_TESTS = ["tests/test_gpu.py", "tests/test_template.py::test_forked_ranks_use_cuda_and_nccl",
             "tests/test_template_random.py::test_cuda_draws_of_forked_ranks_behave_as_fresh_ones"]


def pytest_test_gpu(fig: Figures, notes: list[str]) -> None:
    try:
        import pytest  # noqa: F401
    except ImportError as e:
        raise Skip(f"pytest is not installed ({e})")
    out = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", *GPU_TESTS],
                         cwd=ROOT, capture_output=True, text=True, timeout=115)
    print(out.stdout[-4000:], out.stderr[-2000:])
    last = (out.stdout.strip().splitlines() or ["(no output)"])[-1]
    fig["tests that need CUDA"] = last
    assert out.returncode == 0, out.stdout[-1500:]


class _GpuMemory:
    """Peak of the device's used memory (NVML) while a lesson runs, minus what was used before."""

    def __init__(self) -> None:
        import pynvml  # nvidia-ml-py
        pynvml.nvmlInit()
        self.nvml, self.handle = pynvml, pynvml.nvmlDeviceGetHandleByIndex(0)
        self.base = self.peak = self.used()
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._sample, daemon=True)
        self.thread.start()

    def used(self) -> int:
        return self.nvml.nvmlDeviceGetMemoryInfo(self.handle).used

    def _sample(self) -> None:
        while not self.stop.wait(0.1):
            self.peak = max(self.peak, self.used())

    def close(self) -> float:
        self.stop.set()
        self.thread.join()
        return (self.peak - self.base) / 2**20


def _lesson(name: str, fig: Figures, notes: list[str]) -> None:
    try:
        import nbclient
        import nbformat
    except ImportError as e:
        raise Skip(f"nbclient/nbformat are not installed ({e}): lesson {name} not run")
    path = next((ROOT / "lessons").glob(f"{name}_*.ipynb"))
    try:
        mem = _GpuMemory()
    except Exception as e:  # noqa: BLE001 - the lesson still runs; its GPU memory is then unknown
        mem = None
        notes.append(f"no NVML ({type(e).__name__}: {e}): GPU memory not measured")
    nb = nbformat.read(path, as_version=4)
    t0 = time.perf_counter()
    try:
        nbclient.NotebookClient(nb, timeout=50, kernel_name="python3",
                                resources={"metadata": {"path": str(ROOT / "lessons")}}).execute()
    finally:
        fig["wall s (Run All, one GPU visible)"] = f"{time.perf_counter() - t0:.1f}"
        if mem:
            fig["peak GPU memory MiB (device used, NVML, above the start)"] = f"{mem.close():.0f}"
    gpu_cells = sum("--gpus" in "".join(c.source) for c in nb.cells if c.cell_type == "code")
    notes.append(f"{gpu_cells} cells name --gpus; with one GPU, --gpus 2 runs gloo CPU ranks (the fallback)")


def lesson_00(fig: Figures, notes: list[str]) -> None:
    _lesson("00", fig, notes)


def lesson_03(fig: Figures, notes: list[str]) -> None:
    _lesson("03", fig, notes)


def lesson_04(fig: Figures, notes: list[str]) -> None:
    _lesson("04", fig, notes)


def lesson_11(fig: Figures, notes: list[str]) -> None:
    _lesson("11", fig, notes)
