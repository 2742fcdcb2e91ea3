"""The GPU checks that go through the kit: the magic, forked ranks, the OOM hint, an fp16 run with
its profile, collectives and DDP under the kit beside bare torch, tests/test_gpu.py and the lessons.
Each is `fn(figures, notes)` (bench/gpu_checks.py says how they are run)."""
from __future__ import annotations

import contextlib
import io
import json
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
        assert parent in {t.pid for t in templates.live_templates()} and inited and err < 1e-2, (parent, inited, err)
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


_AR = """
import time, torch, torch.distributed as dist
x = torch.ones(64 * 2**20, device=device)  # 256 MiB of fp32
out = torch.empty_like(x)
for _ in range(5):
    dist.all_reduce(x)
    dist.all_gather_into_tensor(out, x)
# torch's own function under the kit's ledger wrapper (in a bare process: dist.all_reduce itself; torch's
# own decorator sets a __wrapped__ too, so the kit's mark says which is which)
own = dist.all_reduce.__wrapped__ if getattr(dist.all_reduce, "_kit_ledger", False) else dist.all_reduce
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
