# %% [markdown]
# # 00 · Quickstart: ranks, a first all_reduce, and what errors look like
#
# Distributed training runs **the same program in several processes at once**. Each process is
# called a **rank** and knows two numbers: its own `rank` (0, 1, ...) and the `world_size` (how
# many ranks there are). The ranks cooperate through **collectives**: operations that every rank
# calls together, like "add up this tensor across all ranks".
#
# In this lesson you will start two ranks from this notebook, run a first collective, see that
# each rank keeps its variables between cells, and see what an error and an interrupt look like.
# Every lesson follows the same rhythm: **predict, run, measure, compare**.
#
# *On Colab?* Run the next cell first; elsewhere it does nothing.

# %%
import sys
if "google.colab" in sys.modules:  # installs the kit without upgrading anything Colab ships
    %pip install -q "distributed-kit @ git+https://github.com/distributed-kit/distributed-kit"

# %% [markdown]
# ## 1. Start two ranks
#
# `%load_ext kit` adds the `%%distributed` cell magic (after a kernel restart, run it again: without it a
# `%%distributed` cell fails with IPython's `Cell magic %%distributed not found`). `%%distributed --gpus 2`
# asks for two ranks with one GPU each. On a machine with fewer GPUs (Binder has none, Colab has one) the kit
# prints a **FALLBACK** banner and runs two CPU ranks with the gloo backend instead: everything in
# this lesson works the same way, only the timings are CPU timings.
#
# Each rank is a separate Python process. The kit predefines `rank`, `world_size`, `local_rank`,
# `device`, `torch` and `dist` (that is `torch.distributed`, already initialised) on every rank.

# %%
%load_ext kit

# %%
%%distributed --gpus 2
print(f"I am rank {rank} of {world_size}, running on {device} with the {dist.get_backend()} backend")

# %% [markdown]
# Every line of output carries the rank that printed it. The two ranks ran the cell at the same
# time, so their lines may come in either order.
#
# Where do `rank` and `world_size` come from? When you launch a script with
# `torchrun --nproc-per-node 2 train.py`, torchrun starts the processes and tells each one who it
# is through environment variables, which `dist.init_process_group()` reads. The kit sets the same
# ones, so a tutorial script pasted into a cell finds what it expects:

# %%
%%distributed
import os
{k: os.environ[k] for k in ("RANK", "LOCAL_RANK", "WORLD_SIZE", "MASTER_ADDR")}

# %% [markdown]
# `RANK` is the rank among all processes, `LOCAL_RANK` among the processes on this machine
# (it picks the GPU: rank 5 on a machine with 4 GPUs has local rank 1), `WORLD_SIZE` the number of
# ranks, and `MASTER_ADDR` the machine where rank 0 waits for the others to join.

# %% [markdown]
# ## 2. A first collective: all_reduce
#
# `dist.all_reduce(t)` adds up the tensor `t` across all ranks and leaves the sum **on every
# rank** (in place). Rank 0 will hold `[1, 1, 1]` and rank 1 will hold `[2, 2, 2]`.
#
# **Predict:** what does each rank print after the all_reduce?

# %%
guess_after = {0: None, 1: None}   # what each rank prints after the all_reduce: write it first

# %%
%%distributed
t = torch.ones(3) * (rank + 1)
print("before:", t.tolist())
dist.all_reduce(t)
print("after: ", t.tolist())

# %% [markdown]
# Both ranks hold `[3.0, 3.0, 3.0]` = 1 + 2. This one operation is the heart of data-parallel
# training: each rank computes gradients on its own slice of the data, and an all_reduce adds
# them up so that every rank takes the same optimizer step.

# %% [markdown]
# ## 3. State persists between cells
#
# The ranks are persistent processes, like a Python REPL per rank: `t` is still there. The value
# of a cell's last expression is shown per rank, and once when all ranks agree.

# %%
%%distributed
t * 10

# %%
%%distributed
rank * 100

# %% [markdown]
# ## 4. What an error looks like
#
# Real programs fail on one rank and not the others. Here rank 1 raises before the collective, so
# rank 0 would wait in `all_reduce` for a partner that never comes. Before every collective the
# kit compares what each rank is about to do; instead of hanging, rank 0 is told why.
#
# (`--expect-error` marks a cell that fails on purpose so that "Run All" keeps going. Without
# it, a failing cell raises an error and stops "Run All", like any failing cell.)

# %%
%%distributed --expect-error
x = torch.arange(4.0)
if rank == 1:
    raise ValueError("a bug that only shows up on rank 1")
dist.all_reduce(x)

# %% [markdown]
# Read it from the top: the **root cause** comes first (the first rank that failed, with its own
# traceback and the cell's line numbers), then what happened on the other ranks. Nothing was lost:

# %%
%%distributed
(t.tolist(), x.tolist())

# %% [markdown]
# Calling *different* collectives on different ranks is the other classic bug. In plain PyTorch
# it hangs until the process group's timeout (by default 30 minutes with gloo, 10 with NCCL, as
# `init_process_group`'s documentation says) or crashes the process; here both ranks get a message
# naming what each one called, and the group stays usable. (The kit's own collective timeout is
# 60 seconds: `--pg-timeout` changes it.)

# %%
%%distributed --expect-error
if rank == 0:
    dist.all_reduce(torch.ones(4))
else:
    dist.broadcast(torch.ones(4), src=0)

# %% [markdown]
# ## 5. What an interrupt looks like
#
# The interrupt button (■) stops a running cell **on every rank**, and the ranks keep their
# variables. Pressing it twice shows each rank's stack (the "hang doctor"; `%dist where` shows it
# too); a third press stops waiting. Here `--timeout 2` presses the button for us after two
# seconds, so that "Run All" works:

# %%
%%distributed --timeout 2 --expect-error
import time
while True:
    time.sleep(0.1)

# %%
%%distributed
f"rank {rank} still has t = {t.tolist()}"

# %% [markdown]
# `%dist status` lists the ranks' processes and memory. `%dist restart` gives fresh ranks (all
# variables are lost); `%dist shutdown` stops them.

# %%
%dist status

# %% [markdown]
# ## 6. The lab bench in one cell
#
# Later lessons measure real training runs. The lab bench is a control panel for that: choose a
# strategy and knobs, press **Run**, and finished runs appear in a table and a plot. Try one run
# of the default configuration now (it takes a few seconds on a CPU).

# %%
from kit.widgets import lab_bench
lab_bench()

# %% [markdown]
# After a run the plot shows where each step's time went. Choose **Memory per rank** in the
# **plot** menu: it puts each measured part beside the formula's prediction (dotted).
# With the default DDP run, the measured **gradients** bar is about twice the formula's
# (4 bytes per parameter). That is not a measuring error: DDP keeps its own flat *bucket* buffers
# to all_reduce from, a second copy of every gradient beside `.grad`, unless you pass
# `gradient_as_bucket_view=True`. Lesson 04 measures what that option saves.

# %% [markdown]
# ## Exercises

# %% [markdown]
# **1.** With 2 ranks, rank `r` holds `torch.ones(3) * (r + 1)`. What would every rank hold after
# `dist.all_reduce(t)` with **4** ranks? Check with `%dist restart --cpus 4` if you like (then
# `%dist restart --cpus 2` to come back).
#
# <details><summary>Answer</summary>
#
# 1 + 2 + 3 + 4 = 10, so `[10., 10., 10.]` on every rank. In general `world_size * (world_size + 1) / 2`.
# </details>

# %% [markdown]
# **2.** `dist.all_reduce(t, op=dist.ReduceOp.MAX)` keeps the largest value instead of the sum.
# What does rank 0 hold afterwards if rank `r` starts with `torch.tensor([float(r)])`?
#
# <details><summary>Answer</summary>
#
# `tensor([1.])`: the largest value over ranks 0 and 1, on every rank.
# </details>

# %% [markdown]
# **3.** Why is it important that *every* rank calls the collective?
#
# <details><summary>Answer</summary>
#
# A collective is a meeting: each rank sends its part and waits for the others' parts. A rank that
# never arrives leaves the others waiting, in plain PyTorch until the process group's timeout
# (30 minutes by default with gloo, 10 with NCCL), then the waiting ranks fail.
# </details>

# %% [markdown]
# ## Check against a reference
#
# The all_reduce result must equal the sum computed by one process. This cell asserts it on
# every rank: if the assertion fails the cell raises; if not, both ranks show `'check passed'`.

# %%
%%distributed
ref = sum(torch.ones(3) * (r + 1) for r in range(world_size))   # what one process computes
y = torch.ones(3) * (rank + 1)
dist.all_reduce(y)
assert torch.equal(y, ref), (y, ref)
"check passed"
