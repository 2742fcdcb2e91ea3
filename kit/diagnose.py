"""Turn a rank's error text into a plain-words hint: what happened, on which rank, what to do.

`hint(failure)` reads a RankFailure (its exception name, message and traceback, or for a
dead rank the stderr tail) and recognises the failures learners meet on GPUs and in
collectives: CUDA out of memory (with the numbers torch reports), NCCL watchdog timeouts,
"Duplicate GPU detected", device-side asserts, tensors on the wrong device, gloo timeouts and
a peer that crashed mid-collective. It returns None for anything it does not recognise, so
the traceback speaks for itself. Pure text: never imports torch, so it works in the kernel.

`is_consequence(failure)` says whether a failure is only the echo of another rank's problem
(a released pre-flight wait, a peer that vanished, a gloo timeout), so the root cause is
shown first.
"""
from __future__ import annotations

import re
from typing import Callable, Protocol


class RankFailure(Protocol):
    """The fields of kit.errors.RankFailure that hints read (a Protocol: errors.py imports this module)."""

    rank: int
    ename: str
    evalue: str
    traceback: str
    died: bool

__all__ = ["hint", "classify", "is_consequence", "MEMORY_REMEDIES"]

MEMORY_REMEDIES = (
    "Remedies, cheapest first: a smaller batch size (or gradient accumulation to keep the effective batch); "
    "mixed precision (torch.autocast(device_type='cuda', dtype=torch.bfloat16)); activation checkpointing "
    "(torch.utils.checkpoint) to trade compute for activation memory; sharding parameters, gradients and "
    "optimizer state across ranks (FSDP / ZeRO) instead of replicating them; and `del` big tensors left over "
    "from earlier cells, then torch.cuda.empty_cache()."
)
_SIZE = r"([\d.]+ (?:bytes|[KMGT]iB))"  # c10's format_size
_CUDA_OOM = re.compile(r"CUDA out of memory\. Tried to allocate " + _SIZE + r"\. GPU (\d+) has a total capacity of "
                       + _SIZE + r" of which " + _SIZE + r" is free\.")
_IN_USE = re.compile(r"this process has " + _SIZE + r" memory in use")
_BY_TORCH = re.compile(r"Of the allocated memory " + _SIZE + r" is allocated by PyTorch, (?:.*?)and " + _SIZE
                       + r" is reserved by PyTorch but unallocated")
_CPU_OOM = re.compile(r"DefaultCPUAllocator: (?:can't allocate memory|not enough memory): you tried to allocate "
                      r"(\d+) bytes")
_NCCL_WATCHDOG = re.compile(r"Watchdog caught collective operation timeout: WorkNCCL\(SeqNum=(\d+), OpType=(\w+)"
                            r".*?Timeout\(ms\)=(\d+)\) ran for (\d+) milliseconds")
_DUPLICATE_GPU = re.compile(r"Duplicate GPU detected ?: rank (\d+) and rank (\d+) both on CUDA device (\w+)")
_GLOO_TIMEOUT = re.compile(r"Timed out waiting (\d+)ms for (\w+) operation")


def _gib(size: str) -> str:
    return size.replace(" ", "\u00a0")  # keep "2.00 GiB" together when the message wraps


def _cuda_oom(rank: int, text: str) -> str | None:
    m = _CUDA_OOM.search(text)
    if not m and "CUDA out of memory" not in text:
        return None
    if not m:
        return f"rank {rank} ran out of GPU memory. " + MEMORY_REMEDIES
    tried, gpu, total, free = m.groups()
    used = _IN_USE.search(text)
    torch_part = _BY_TORCH.search(text)
    detail = f"it tried to allocate {_gib(tried)} on GPU {gpu}, which has {_gib(total)} in all and {_gib(free)} free"
    if used:
        detail += f"; this process holds {_gib(used.group(1))}"
    if torch_part:
        detail += f" ({_gib(torch_part.group(1))} in live tensors, {_gib(torch_part.group(2))} cached by PyTorch)"
    fragmented = ""
    if torch_part and "expandable_segments" in text:
        fragmented = (" If the cached part is large, memory is fragmented: set "
                      "PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True before the ranks start (`%dist restart`).")
    return (f"rank {rank} ran out of GPU memory: {detail}. {MEMORY_REMEDIES}{fragmented} The other ranks and their "
            f"variables are kept; rank {rank} keeps its variables too.")


def _cpu_oom(rank: int, text: str) -> str | None:
    m = _CPU_OOM.search(text)
    if not m:
        return None
    gib = int(m.group(1)) / 2**30
    return (f"rank {rank} could not get {gib:.1f} GiB of host memory for one tensor. Check the shape you asked for "
            f"(a typo in a size multiplies fast); otherwise use a smaller batch or model, or fewer ranks (each rank "
            f"holds its own copy). Variables are kept.")


def _nccl_watchdog(rank: int, text: str) -> str | None:
    m = _NCCL_WATCHDOG.search(text)
    if not m and "Watchdog caught collective operation timeout" not in text:
        return None
    what = f"{m.group(2).lower()} (collective #{m.group(1)} on this group) waited {int(m.group(4)) / 1000:.0f} s" if m \
        else "a collective timed out"
    return (f"rank {rank}: NCCL's watchdog gave up: {what} because at least one other rank never joined it. Usual "
            f"causes: a rank raised or is stuck before the collective, ranks call collectives in a different order, "
            f"or one step is far slower on one rank. NCCL then tears the process down, so GPU ranks lose their "
            f"variables: run `%dist restart`. Next time, `%dist where` while it hangs shows who waits where; raise "
            f"--pg-timeout only if a step is legitimately that slow.")


def _duplicate_gpu(rank: int, text: str) -> str | None:
    m = _DUPLICATE_GPU.search(text)
    if not m and "Duplicate GPU detected" not in text:
        return None
    pair = f"ranks {m.group(2)} and {m.group(1)} both use CUDA device {m.group(3)}" if m else "two ranks share a GPU"
    return (f"NCCL refuses two ranks on one GPU ({pair}). Use at most one rank per visible GPU (`%dist restart "
            f"--gpus 1`), or CPU ranks with gloo (`%dist restart --cpus 2`).")


def _device_assert(rank: int, text: str) -> str | None:
    if "device-side assert triggered" not in text:
        return None
    return (f"rank {rank}: a CUDA kernel failed an assertion, usually an index out of range (a class label >= the "
            f"number of classes, or a token id >= the vocabulary size). The GPU context is now unusable: run "
            f"`%dist restart`; to see the exact line, run the same code on CPU ranks or with CUDA_LAUNCH_BLOCKING=1.")


def _wrong_device(rank: int, text: str) -> str | None:
    if "Expected all tensors to be on the same device" not in text:
        return None
    return (f"rank {rank} mixed tensors on different devices. Each rank has a predefined `device`; create tensors "
            f"with device=device and move models with .to(device). Variables are kept.")


def _gloo_timeout(rank: int, text: str) -> str | None:
    m = _GLOO_TIMEOUT.search(text)
    if not m:
        return None
    return (f"rank {rank} waited {int(m.group(1)) / 1000:g} s (the process-group timeout) inside a collective that "
            f"another rank never joined; the other ranks' reports say why. The kit re-creates the process group "
            f"afterwards, so variables are kept.")


def _peer_gone(rank: int, text: str) -> str | None:
    if not any(s in text for s in ("Connection closed by peer", "Connection reset by peer")):
        return None
    if "so the kit closed their connections" in text:  # kit.engine.watch ended an uneven wait: it said so
        return None
    return (f"rank {rank} lost its connection to another rank in the middle of a collective: that rank died (its "
            f"own report gives the signal and likely cause).")


def _gloo_mismatch(rank: int, text: str) -> str | None:
    if "Is there a distributed collective mismatch" not in text and "EnforceNotMet" not in text:
        return None
    return (f"rank {rank}: gloo found ranks sending different amounts of data, which means mismatched collectives "
            f"(different ops, shapes or dtypes). Keep the kit's pre-flight check on (drop --no-check) to have this "
            f"named before it reaches gloo.")


def _accelerate_state(rank: int, text: str) -> str | None:
    # Accelerate's AcceleratorState is one per process, and the kit's ranks outlive cells.
    if "AcceleratorState has already been initialized" not in text:
        return None
    return (f"rank {rank}: an Accelerator already exists in these ranks (Accelerate keeps one state per process "
            f"and the ranks live across cells). To change mixed_precision or cpu, run `from accelerate.state "
            f"import AcceleratorState; AcceleratorState._reset_state(reset_partial_state=True)` first and stop "
            f"using the old Accelerator, or `%dist restart` for fresh ranks (that loses the ranks' variables).")


def _no_stdin(rank: int, text: str) -> str | None:
    # A rank's stdin is not the notebook (in the kit and under torchrun alike): input() reads end-of-file.
    if "EOFError: EOF when reading a line" not in text:
        return None
    return (f"rank {rank}: input() found no keyboard: a rank's stdin is not the notebook. Set the value in the "
            f"kernel and `%dist push` it to the ranks, or write it into the cell.")


_IPYTHON_LINE = re.compile(r'^SyntaxError: .*\n(?:.*\n)*?\s*File "<cell[^"]*", line (\d+)\n\s*((%%?|!)[\w.-]*)', re.M)


def _ipython_syntax(rank: int, text: str) -> str | None:
    # `%time`, `%%time`, `%matplotlib inline` or `!pip install` in a %%distributed cell: IPython's syntax, which
    # the kernel translates in its own cells; the ranks run the cell as plain Python, so it is a SyntaxError.
    found = _IPYTHON_LINE.search(text)
    if not found:
        return None
    line, word, sign = found.group(1), found.group(2), found.group(3)
    if sign == "!":
        return (f"rank {rank}: `{word} ...` on line {line} is a shell command, which only the kernel runs; the ranks "
                f"run plain Python. Run it in a cell without %%distributed, or on the ranks with "
                f"`subprocess.run('{word[1:]} ...', shell=True)`.")
    name = word.lstrip("%")
    if name in ("time", "timeit"):
        todo = ("Time it on the ranks with `t0 = time.perf_counter()` before and `print(time.perf_counter() - t0)` "
                "after (`import time`)")
    elif name == "matplotlib":
        todo = "It is not needed there: `plt.show()` on a rank shows that rank's figure under the cell"
    else:
        todo = "Run it in a cell without %%distributed"
    return (f"rank {rank}: `{word}` on line {line} is an IPython magic, which only the kernel understands; the "
            f"ranks run plain Python. {todo}.")


_RULES: tuple[tuple[str, Callable[[int, str], str | None]], ...] = (
    ("accelerate_state", _accelerate_state), ("no_stdin", _no_stdin), ("ipython_syntax", _ipython_syntax),
    ("cuda_oom", _cuda_oom), ("cpu_oom", _cpu_oom), ("nccl_timeout", _nccl_watchdog),
    ("duplicate_gpu", _duplicate_gpu), ("device_assert", _device_assert), ("wrong_device", _wrong_device),
    ("gloo_timeout", _gloo_timeout), ("peer_gone", _peer_gone), ("gloo_mismatch", _gloo_mismatch),
)


def classify(rank: int, text: str) -> tuple[str, str] | None:
    """(kind, hint) for a rank's error text, or None when nothing is recognised."""
    for kind, rule in _RULES:
        found = rule(rank, text)
        if found:
            return kind, found
    return None


def hint(failure: RankFailure) -> str | None:
    """A plain-words hint for one rank's failure (its message, traceback or stderr tail), or None."""
    if failure.ename == "CollectiveMismatchError":
        return None  # the kit wrote that message itself
    found = classify(failure.rank, f"{failure.ename}: {failure.evalue}\n{failure.traceback}")
    return found[1] if found else None


def is_consequence(failure: RankFailure) -> bool:
    """True when this failure only echoes another rank's problem."""
    if failure.ename == "CollectiveMismatchError":
        return "without calling it" in failure.evalue
    if failure.died:
        return False
    found = classify(failure.rank, failure.evalue)
    return found is not None and found[0] in ("gloo_timeout", "peer_gone")
