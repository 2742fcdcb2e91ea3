"""Faults 9, 10 and 15 on CPU: kit.diagnose turns recorded GPU/collective error texts (real torch and NCCL
formats) into plain-words hints naming the rank, the memory in use and the remedy; CellError shows them."""
from __future__ import annotations

import pytest

from kit.diagnose import classify, hint, is_consequence
from kit.errors import CellError, RankFailure
from test_faults_errors import CUDA_OOM_TEXT

NCCL_WATCHDOG = (
    "[Rank 1] Watchdog caught collective operation timeout: WorkNCCL(SeqNum=12, OpType=ALLREDUCE, NumelIn=1048576, "
    "NumelOut=1048576, Timeout(ms)=600000) ran for 600041 milliseconds before timing out.\n"
    "[Rank 1] Some NCCL operations have failed or timed out. Due to the asynchronous nature of CUDA kernels, "
    "subsequent GPU operations might run on corrupted/incomplete data.\n"
    "[Rank 1] To avoid data inconsistency, we are taking the entire process down."
)
DUPLICATE_GPU = ("DistBackendError: NCCL error in: ../torch/csrc/distributed/c10d/ProcessGroupNCCL.cpp:1970, invalid "
                 "usage (run with NCCL_DEBUG=WARN for details), NCCL version 2.21.5\nncclInvalidUsage: This usually "
                 "reflects invalid usage of NCCL library.\nLast error:\nDuplicate GPU detected : rank 1 and rank 0 "
                 "both on CUDA device 1000")
PRIVATE_POOL_OOM = ("CUDA out of memory. Tried to allocate 512.00 MiB. GPU 1 has a total capacity of 15.77 GiB of "
                    "which 301.12 MiB is free. Process 4242 has 15.47 GiB memory in use. Of the allocated memory "
                    "14.10 GiB is allocated by PyTorch, with 1.00 GiB allocated in private pools (e.g., CUDA Graphs), "
                    "and 980.00 MiB is reserved by PyTorch but unallocated.")


@pytest.mark.parametrize("text, kind, words", [
    (CUDA_OOM_TEXT, "cuda_oom", ["rank 1 ran out of GPU memory", "77.89\u00a0GiB", "smaller batch"]),
    (PRIVATE_POOL_OOM, "cuda_oom", ["512.00\u00a0MiB on GPU 1", "14.10\u00a0GiB in live tensors",
                                    "980.00\u00a0MiB cached"]),
    ("RuntimeError: [enforce fail at alloc_cpu.cpp:117] data. DefaultCPUAllocator: not enough memory: you tried to "
     "allocate 858993459200 bytes.", "cpu_oom", ["800.0 GiB of host memory", "shape"]),
    (NCCL_WATCHDOG, "nccl_timeout", ["allreduce (collective #12 on this group) waited 600 s", "`%dist where`",
                                     "lose their variables"]),
    (DUPLICATE_GPU, "duplicate_gpu", ["ranks 0 and 1 both use CUDA device 1000", "--gpus 1", "--cpus 2"]),
    ("RuntimeError: CUDA error: device-side assert triggered\nCUDA kernel errors might be asynchronously reported",
     "device_assert", ["index out of range", "CUDA_LAUNCH_BLOCKING=1"]),
    ("RuntimeError: Expected all tensors to be on the same device, but found at least two devices, cuda:0 and cpu!",
     "wrong_device", ["device=device", ".to(device)"]),
    ("RuntimeError: [../third_party/gloo/gloo/transport/tcp/unbound_buffer.cc:78] Timed out waiting 60000ms for recv "
     "operation to complete", "gloo_timeout", ["waited 60 s", "re-creates the process group"]),
    ("RuntimeError: [../third_party/gloo/gloo/transport/tcp/pair.cc:553] Connection closed by peer "
     "[127.0.0.1]:4996", "peer_gone", ["that rank died"]),
    ("terminate called after throwing an instance of 'gloo::EnforceNotMet'\n  what():  [enforce fail at "
     "../third_party/gloo/gloo/transport/tcp/pair.cc:446] op.preamble.length <= op.nbytes. 16 vs 20. Is there a "
     "distributed collective mismatch", "gloo_mismatch", ["mismatched collectives", "drop --no-check"]),
    # a learner's input() in a %%distributed cell: the rank has no keyboard
    ("EOFError: EOF when reading a line\nTraceback (most recent call last):\n  File \"<cell In [13]>\", line 1, in "
     "<module>\n    x = input(\"name? \")\nEOFError: EOF when reading a line", "no_stdin",
     ["input()", "%dist push", "no keyboard"]),
])
def test_classifier_on_recorded_texts(text, kind, words):
    found = classify(1, text)
    assert found is not None and found[0] == kind
    for w in words:
        assert w in found[1], (w, found[1])


def test_unknown_text_gives_no_hint():
    assert classify(0, "ZeroDivisionError: division by zero") is None
    assert hint(RankFailure(0, "CollectiveMismatchError", "collective #1 differs")) is None


def test_nccl_abort_in_a_dead_rank_stderr_tail_is_explained():
    dead = RankFailure(1, "WorkerDied", "the process was killed by SIGABRT (signal 6). ...", died=True,
                       traceback="----- stderr tail -----\n" + NCCL_WATCHDOG, time_s=2.0)
    waiter = RankFailure(0, "RuntimeError", "[pair.cc:553] Connection closed by peer [127.0.0.1]:1", time_s=1.0)
    assert is_consequence(waiter) and not is_consequence(dead)
    err = CellError({0: waiter, 1: dead})
    text = str(err)
    assert err.root is dead and text.startswith("CellError: rank 1 died: the process was killed by SIGABRT")
    assert "hint: rank 1: NCCL's watchdog gave up" in text
    assert "also rank 0 raised RuntimeError: Connection closed by peer" in text  # native prefix trimmed
    assert "  hint: rank 0 lost its connection" in text


def test_a_dead_rank_is_said_in_words_not_by_the_kits_label():
    """A death reads `rank 1 died at line 3 of In [7]: the process was killed ...`, and two ranks killed alike
    `rank 0: died the same way`: never the kit's label for a death (`died WorkerDied`) as if it were an exception."""
    text = "the process was killed by SIGKILL (signal 9). Most often the machine ran out of memory"
    dead = RankFailure(1, "WorkerDied", text, died=True, line=3, cell="In [7]", time_s=1.0)
    assert dead.summary() == f"rank 1 died at line 3 of In [7]: {text}"
    both = str(CellError({0: RankFailure(0, "WorkerDied", text, died=True, time_s=2.0), 1: dead}))
    assert "WorkerDied" not in both and "rank 0: died the same way" in both, both
    assert both.count("ran out of memory") == 1, both


@pytest.mark.parametrize("line, says", [
    ("%time y = torch.ones(3).sum()", "`%time` on line 2 is an IPython magic, which only the kernel understands; the ranks "
                                      "run plain Python. Time it on the ranks with `t0 = time.perf_counter()`"),
    ("%%time", "`%%time` on line 2 is an IPython magic"),
    ("%matplotlib inline", "`plt.show()` on a rank shows that rank's figure under the cell"),
    ("!pip install tqdm", "`!pip ...` on line 2 is a shell command, which only the kernel runs; the ranks run plain "
                          "Python. Run it in a cell without %%distributed, or on the ranks with "
                          "`subprocess.run('pip ...', shell=True)`"),
])
def test_ipython_syntax_in_a_rank_cell_says_the_ranks_run_plain_python(line, says):
    """`%time`, `%matplotlib inline` or `!pip` in a %%distributed cell: each rank's SyntaxError (`invalid syntax`
    pointing at the `%`) comes with a hint that the ranks run plain Python and what to write there instead."""
    tb = f'  File "<cell In [8]>", line 2\n    {line}\n    ^\nSyntaxError: invalid syntax'
    failure = RankFailure(0, "SyntaxError", "invalid syntax (<cell In [8]>, line 2)", tb, 2)
    assert says in (hint(failure) or ""), hint(failure)
    assert says in str(CellError({0: failure, 1: RankFailure(1, "SyntaxError", failure.evalue, tb, 2)}))
    plain = RankFailure(0, "SyntaxError", "expected ':'", tb.replace(line, "for i in range(3)"), 2)
    assert hint(plain) is None
