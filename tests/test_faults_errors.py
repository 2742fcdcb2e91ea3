"""Faults 1, 2 and 9: a cell raises on every rank, on one rank while the others wait in a collective
(with the pre-flight check on, and with check=False where gloo really blocks), or runs out of GPU memory."""
from __future__ import annotations

import time


from kit.engine.cluster import Cluster
from kit.errors import CellError
from conftest import quiet

PG_TIMEOUT_S = 3.0
ONE_RANK_RAISES = (
    "x = 1\n"
    "y = 2\n"
    "if rank == 1:\n"
    "    raise ValueError('bad batch on rank 1')\n"
    "t = torch.ones(2)\n"
    "dist.all_reduce(t)\n"
)
# The message torch's CUDA caching allocator writes (c10/cuda/CUDACachingAllocator.cpp), recorded on an 80 GB GPU.
CUDA_OOM_TEXT = (
    "CUDA out of memory. Tried to allocate 2.00 GiB. GPU 0 has a total capacity of 79.15 GiB of which 1.25 GiB is "
    "free. Including non-PyTorch memory, this process has 77.89 GiB memory in use. Of the allocated memory 75.12 GiB "
    "is allocated by PyTorch, and 1.23 GiB is reserved by PyTorch but unallocated. If reserved but unallocated memory "
    "is large try setting PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True to avoid fragmentation.  See documentation "
    "for Memory Management  (https://pytorch.org/docs/stable/notes/cuda.html#environment-variables)"
)


WALL_CLOCK_S = 30  # conftest's autouse wall_clock fixture enforces it




def _sum_after_all_reduce(c: Cluster) -> dict[int, float]:
    return c.run("t = torch.ones(2) * (rank + 1)\ndist.all_reduce(t)\nt.sum().item()", on_output=quiet).values


def test_exception_on_every_rank_is_grouped_and_state_kept(cluster):
    cluster.run("kept = 7", on_output=quiet)
    r = cluster.run("a = 1\nb = 2\nundefined_name + 1", on_output=quiet)
    assert set(r.failures) == {0, 1} and all(f.ename == "NameError" and f.line == 3 for f in r.failures.values())
    text = str(CellError(r.failures, r.notes))
    assert "NameError at line 3" in text and "the same NameError" in text
    assert text.count("Traceback") == 1  # one traceback for identical failures, not one per rank
    assert cluster.run("kept", on_output=quiet).values == {0: 7, 1: 7}


def test_one_rank_raises_others_released_by_the_preflight_check(cluster):
    cluster.run("kept = rank + 100", on_output=quiet)
    t0 = time.monotonic()
    r = cluster.run(ONE_RANK_RAISES, on_output=quiet)
    assert time.monotonic() - t0 < 2.0
    err = CellError(r.failures, r.notes)
    assert err.root.rank == 1 and str(err).startswith("CellError: rank 1 raised ValueError at line 4")
    waiter = r.failures[0]
    assert waiter.line == 6 and "all_reduce(float32[2]) at line 6" in waiter.evalue
    assert "rank 1 raised ValueError at line 4" in waiter.evalue and "still usable" in waiter.evalue
    assert cluster.state == "ready"
    assert cluster.run("kept", on_output=quiet).values == {0: 100, 1: 101}
    assert _sum_after_all_reduce(cluster) == {0: 6.0, 1: 6.0}


def test_one_rank_raises_others_block_in_gloo_then_soft_reset(cluster):
    """check=False: rank 0 really sits in gloo until the PG timeout; the kit says so, then re-creates the group."""
    cluster.run("kept = rank + 100", on_output=quiet)
    notes: list[tuple[float, str]] = []
    t0 = time.monotonic()
    r = cluster.run(ONE_RANK_RAISES, check=False,
                    on_output=lambda rank, stream, text: notes.append((time.monotonic() - t0, text)) if rank < 0 else None)
    elapsed = time.monotonic() - t0
    assert PG_TIMEOUT_S - 0.5 < elapsed < PG_TIMEOUT_S + 3
    said = [(t, text) for t, text in notes if "rank 1 raised ValueError at line 4" in text]
    assert said and said[0][0] < PG_TIMEOUT_S, notes  # reported while rank 0 still waits
    assert "rank 0 is blocked inside all_reduce(float32[2]) at line 6" in said[0][1]
    assert any("gloo cannot be interrupted inside a collective" in text for _, text in notes)
    err = CellError(r.failures, r.notes)
    assert err.root.rank == 1  # the gloo timeout on rank 0 is an echo, not the cause
    assert "hint: rank 0 waited 3 s" in str(err) and "re-created the process group" in str(err)
    assert cluster.state == "ready"
    assert cluster.run("kept", on_output=quiet).values == {0: 100, 1: 101}
    assert _sum_after_all_reduce(cluster) == {0: 6.0, 1: 6.0}


def test_cuda_out_of_memory_on_one_rank_gets_a_memory_hint(cluster):
    cluster.push({"OOM_TEXT": CUDA_OOM_TEXT})
    r = cluster.run("if rank == 1:\n    raise torch.OutOfMemoryError(OOM_TEXT)\nt = torch.ones(1)\ndist.all_reduce(t)",
                    on_output=quiet)
    assert r.failures[1].ename == "OutOfMemoryError"
    text = str(CellError(r.failures, r.notes))
    assert "rank 1 raised OutOfMemoryError at line 2" in text
    hint = next(line for line in text.splitlines() if line.startswith("hint: "))
    for words in ("rank 1 ran out of GPU memory", "2.00\u00a0GiB on GPU 0", "77.89\u00a0GiB", "smaller batch",
                  "mixed precision", "activation checkpointing", "FSDP", "expandable_segments"):
        assert words in hint, words
    assert _sum_after_all_reduce(cluster) == {0: 6.0, 1: 6.0}


def test_a_collective_torch_refuses_shows_the_cell_then_torch_not_the_kits_wrapper():
    """`dist.all_reduce(5)` in a cell: the rank's traceback goes from the cell's line straight to torch's
    frames; the kit's collective wrapper it passed through (kit/rank/ledger.py) is never shown between them."""
    import torch.distributed as dist

    from kit.rank.cell import execute, format_exception
    from kit.rank.ledger import Ledger

    wrapped = Ledger(0).wrap("all_reduce", dist.all_reduce, lambda *a: None)
    try:
        execute("t = 5\nall_reduce(t)\n", {"all_reduce": wrapped}, "<cell In [3]>")
    except TypeError as e:
        text = format_exception(e)
    else:
        raise AssertionError("torch took an int")
    files = [line.split('"')[1] for line in text.splitlines() if line.startswith('  File "')]
    assert files[0] == "<cell In [3]>" and "line 2" in text, text
    assert all("/torch/" in f for f in files[1:]) and files[-1].endswith("distributed_c10d.py"), text
    assert "ledger.py" not in text and "wrapper" not in text.split("c10d_logger")[0], text


def test_a_long_message_is_said_once_not_again_at_the_traceback_end():
    """The collective-mismatch message (naming every rank's call) is printed once: in the headline, not
    again, word for word, as the traceback's last line."""
    from kit.errors import RankFailure

    msg = ("collective #1 of this cell differs across ranks: rank 0 called all_reduce(float32[4]) at line 3; "
           "rank 1 called broadcast(float32[4], src=0) at line 5. Every rank must call the same collectives.")
    tb = ('Traceback (most recent call last):\n  File "<cell In [1]>", line 5, in <module>\n'
          f'    dist.broadcast(torch.ones(4), src=0)\nkit.errors.CollectiveMismatchError: {msg}')
    failure = RankFailure(1, "CollectiveMismatchError", msg, tb, line=5)
    text = "\n".join(CellError({1: failure})._render_traceback_())
    assert text.count("differs across ranks") == 1
    assert text.splitlines()[-1] == "kit.errors.CollectiveMismatchError: (the message above)"
    short = RankFailure(1, "ValueError", "bad batch", "Traceback ...\nValueError: bad batch")
    assert "\n".join(CellError({1: short})._render_traceback_()).count("bad batch") == 2  # short ones stay
