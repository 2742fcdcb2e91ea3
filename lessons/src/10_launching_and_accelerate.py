# %% [markdown]
# # 10 · Launching: from notebook cells to torchrun, Accelerate and a cluster
#
# Every lesson so far ran its ranks from this notebook. A real training job is a **script**
# started by a **launcher**: `torchrun` starts one process per GPU, tells each one who it is
# through environment variables, and watches them. Hugging Face **Accelerate** wraps the same
# loop in a few calls (`prepare`, `backward`, `gather_for_metrics`) so that one script runs on a
# laptop, on GPUs or on many machines.
#
# This lesson turns the notebook's cells into a script, runs it under `torchrun`, runs the same
# loop through Accelerate, checks that all of them compute the *same numbers*, and ends with the
# commands for several machines and Slurm. The insight: **Accelerate is DDP underneath, and the
# notebook and the cluster run the same code.**
#
# *On Colab?* Run the next cell first; elsewhere it does nothing.

# %%
import sys
if "google.colab" in sys.modules:
    %pip install -q "distributed-kit @ git+https://github.com/distributed-kit/distributed-kit" accelerate

# %%
%load_ext kit
%matplotlib inline
import os, tempfile
# the files this lesson writes (train.py, job.sbatch, ...) go here
os.chdir(tempfile.mkdtemp(prefix="kit-lesson10-"))

# %% [markdown]
# ## 1. Who am I? The launcher's environment
#
# This lesson compares losses between launchers to the last digit, and `accelerate launch --cpu`
# runs on the CPU, so every run here uses **CPU ranks with gloo** (`--cpus 2`), also on a GPU
# machine. The cell below prints what a process learns from its launcher. The kit sets the
# torchrun variables for its ranks (lesson 00), and of torch elastic's `TORCHELASTIC_*` only the
# run id. Keep this cell in mind: it runs again under torchrun in section 2.

# %%
%%distributed --cpus 2
import os
env = {k: os.environ.get(k) for k in ("RANK", "LOCAL_RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")}
elastic = sorted(k for k in os.environ if k.startswith("TORCHELASTIC_"))
print(f"pid {os.getpid()}: {env}; TORCHELASTIC_*: {elastic}")

# %% [markdown]
# ## 2. A training loop, then the same cells as a script under torchrun
#
# A small regression model trained with hand-written DDP: 96 samples in batches of 8; at step
# `k` rank 0 takes batch `2k` and rank 1 batch `2k + 1` (a global batch of 16), 6 steps per
# epoch, 2 epochs = 12 steps. The seed
# makes the data and the initial model the same on every rank and in every launcher. The last
# line prints the loss curve as JSON: that is how the torchrun run below hands its curve back.

# %%
%%distributed
import json
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel as DDP

torch.manual_seed(0)
X = torch.randn(96, 8)
Y = X @ torch.linspace(-1, 1, 8).unsqueeze(1) + 0.1 * torch.randn(96, 1)
hand_model = DDP(nn.Sequential(nn.Linear(8, 16), nn.Tanh(), nn.Linear(16, 1)))
hand_opt = torch.optim.SGD(hand_model.parameters(), lr=0.1)
B = 8                                                       # samples per rank per step
hand_losses = []
for epoch in range(2):
    for k in range(len(X) // (B * world_size)):
        start = (k * world_size + rank) * B                 # batch k*N + rank of the dataset
        loss = nn.functional.mse_loss(hand_model(X[start:start + B]), Y[start:start + B])
        hand_opt.zero_grad()
        loss.backward()                                     # DDP averages the gradients here
        hand_opt.step()
        g = loss.detach().clone()
        dist.all_reduce(g)                                  # the global mean loss, for the curve
        hand_losses.append(g.item() / world_size)
hand_params = [p.detach().clone() for p in hand_model.module.parameters()]   # for the final check
if rank == 0:
    print("LOSSES hand-ddp", json.dumps(hand_losses))

# %% [markdown]
# `%dist export train.py` writes every `%%distributed` cell executed so far, in order, as a
# script: the process group set-up the kit does for a cell, then the cells' code. Cells that
# failed or ran with `--expect-error` would be left out with a comment.
#
# **Predict:** under `torchrun --nproc-per-node 2`, will the environment cell print the same
# variables as above? Will the loss curve be the same, to the last digit?

# %%
guess_same_env, guess_same_curve = None, None   # True or False: write them first

# %%
%dist export train.py --force
print(open("train.py").read()[:1400], "...")

# %% [markdown]
# Before the real launcher, a matter of memory. Binder guarantees 1 GB for the whole notebook:
# the kernel, our two ranks, and now torchrun's agent and its two workers, each a Python process
# with torch loaded. Six of them do not fit; the OS would kill one. So we pull what we still need
# from the ranks (the loss curve and the trained parameters) and shut the ranks down. Their
# variables are lost; fresh ranks start in section 3. On your own machine you could keep them.

# %%
%dist pull hand_losses hand_params --ranks 0
%dist shutdown

# %% [markdown]
# Now the real launcher, from a cell. `--standalone` runs the rendezvous on this machine,
# `--max-restarts 0` reports a failing rank instead of restarting the group.
# `KIT_EXPORT_BACKEND=gloo` keeps the script on CPU ranks like ours (on a GPU it would pick NCCL).

# %%
import os, subprocess, json, time

def launch(cmd, **env):
    t0 = time.monotonic()
    # a rank of a fresh torchrun job aborts at exit once in a while on a busy machine (gloo's threads
    # against Python's shutdown: docs/faults.md); it has twice in a row: say so, try up to 3 times
    for attempt in (1, 2, 3):
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=120,       # gloo on loopback,
                              env=dict(os.environ, GLOO_SOCKET_IFNAME="lo", **env))  # as the kit's ranks
        if proc.returncode == 0:
            break
        print(f"attempt {attempt} failed (exit {proc.returncode}); last stderr lines:\n"
              + "\n".join(proc.stderr.splitlines()[-6:]))
    assert proc.returncode == 0, proc.stderr[-4000:]
    print(f"$ {' '.join(cmd)}   ({time.monotonic() - t0:.1f} s)")
    return proc.stdout

def curve(stdout, name):
    return json.loads(next(line for line in stdout.splitlines()
                           if line.startswith(f"LOSSES {name} ")).split(" ", 2)[2])

TORCHRUN = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2",
            "--max-restarts", "0"]
out = launch(TORCHRUN + ["train.py"], KIT_EXPORT_BACKEND="gloo")
print("\n".join(line for line in out.splitlines() if "TORCHELASTIC_*" in line))
torchrun_losses = curve(out, "hand-ddp")

# %%
print("notebook:", [round(v, 6) for v in hand_losses[:4]], "...")
print("torchrun:", [round(v, 6) for v in torchrun_losses[:4]], "...")
print("largest difference over 12 steps:", max(abs(a - b) for a, b in zip(hand_losses, torchrun_losses)))

# %% [markdown]
# The same curve: the script *is* the cells. What torchrun adds is in the environment:
# `MASTER_ADDR`/`MASTER_PORT` point at the rendezvous it ran, `LOCAL_RANK` picks the GPU on a
# node, and the `TORCHELASTIC_*` variables belong to its agent (the run id, the restart count,
# the file where `torch.distributed.elastic`'s `@record` writes a failing rank's traceback). `torchrun` also sets
# `OMP_NUM_THREADS=1` when it starts several processes (it prints a warning saying so).

# %% [markdown]
# ### The legacy launcher: `--local-rank` as an argument
#
# Older tutorials use `python -m torch.distributed.launch`. It passes the local rank as a
# **command-line argument**, `--local-rank=N`, so those scripts parse it with argparse. Since
# torch 2.0 the spelling is dashed: a script that declares only `--local_rank` stops with
# "unrecognized arguments: --local-rank=0" (the launcher's docstring says to declare both).
# Under torchrun no argument comes at all, and `args.local_rank` stays at its default. torch
# 2.13's legacy launcher also sets `LOCAL_RANK`, and with `--use-env` it leaves the argument out;
# it is deprecated in favour of torchrun. Reading `LOCAL_RANK` from the environment works under
# both. A script that only prints what it got (it does not even import torch):

# %%
%%writefile show_env.py
import os, sys
print(f"argv {sys.argv[1:]}, LOCAL_RANK={os.environ.get('LOCAL_RANK')}, RANK={os.environ.get('RANK')}")

# %%
for module in ("torch.distributed.launch", "torch.distributed.run"):
    out = launch([sys.executable, "-m", module, "--nproc-per-node", "2", "show_env.py"])
    print("\n".join(sorted(out.splitlines())))

# %% [markdown]
# ## 3. The same loop through Accelerate
#
# With Accelerate, the loop loses its distributed lines: `prepare` wraps the model (in DDP when
# there are several processes), shards the loader (it must get the **unsharded** loader: rank `r`
# takes batches `r, r + N, ...`, the split we wrote by hand above) and wraps the optimizer;
# `accelerator.backward(loss)` replaces `loss.backward()`. `cpu=True` keeps it on the CPU like
# the rest of this lesson (on GPUs leave it out). The file is a complete script:

# %%
%%writefile accel_train.py
import json
import torch
import torch.nn as nn
from torch.utils.data import DataLoader, TensorDataset
from accelerate import Accelerator

accelerator = Accelerator(cpu=True)
torch.manual_seed(0)
X = torch.randn(96, 8)
Y = X @ torch.linspace(-1, 1, 8).unsqueeze(1) + 0.1 * torch.randn(96, 1)
net = nn.Sequential(nn.Linear(8, 16), nn.Tanh(), nn.Linear(16, 1))
opt = torch.optim.SGD(net.parameters(), lr=0.1)
loader = DataLoader(TensorDataset(X, Y), batch_size=8)      # unsharded: prepare() shards it
model, opt, loader = accelerator.prepare(net, opt, loader)
losses = []
for epoch in range(2):
    for x, y in loader:
        loss = nn.functional.mse_loss(model(x), y)
        opt.zero_grad()
        accelerator.backward(loss)
        opt.step()
        losses.append(accelerator.reduce(loss.detach(), "mean").item())
accelerator.print(f"{accelerator.num_processes} process(es), model wrapped as {type(model).__name__}, "
                  f"{len(losses)} steps")
accelerator.print("LOSSES accelerate", json.dumps(losses))

# %% [markdown]
# **Predict:** `accelerate launch --cpu --num_processes 2 accel_train.py` looks like "two CPU
# processes". How many processes will print, and how many steps will the curve have?
# (Below it is spelled `python -m accelerate.commands.launch`, the same entry point, with three
# flags that only silence its note about defaults.)
#
# Accelerate is optional here: where it is not installed, the Accelerate cells say so and skip.

# %%
guess_processes, guess_steps = None, None   # write them first

# %%
import importlib.util
HAVE_ACCELERATE = importlib.util.find_spec("accelerate") is not None
if HAVE_ACCELERATE:
    out = launch([sys.executable, "-m", "accelerate.commands.launch", "--cpu", "--num_processes", "2",
                  "--num_machines", "1", "--mixed_precision", "no", "--dynamo_backend", "no",
                  "accel_train.py"])
    print("\n".join(line for line in out.splitlines() if not line.startswith("LOSSES")))
    launch_cpu_losses = curve(out, "accelerate")
else:
    print("skipped: accelerate is not installed (pip install accelerate)")

# %% [markdown]
# One process, 24 steps: the whole dataset in batches of 8, no DDP. `accelerate launch` starts
# several processes through torch's own launcher only for GPUs (`--multi_gpu` calls
# `torch.distributed.run` in-process); with `--cpu` it runs the script **once**, and several CPU
# processes need MPI (`--mpirun_hostfile`). (Read in `accelerate/commands/launch.py`, version
# 1.15: `--cpu` goes to `simple_launcher`, one `subprocess.Popen`.) It does not fail; it quietly
# trains on one process. The count in the first printed line is the thing to check.
#
# Accelerate itself works with any launcher that sets torchrun's variables. Under torchrun:

# %%
if HAVE_ACCELERATE:
    out = launch(TORCHRUN + ["accel_train.py"])
    print("\n".join(line for line in out.splitlines() if not line.startswith("LOSSES")))
    accel_torchrun_losses = curve(out, "accelerate")
else:
    print("skipped: accelerate is not installed")

# %% [markdown]
# And inside the notebook's ranks, the very same file (the kit's CPU ranks set
# `ACCELERATE_USE_CPU`, which `accelerate launch --cpu` also sets, so a plain `Accelerator()`
# sees both ranks too; without it, Accelerate on CPU would make each rank a separate
# single-process run). The launches are done, so two fresh ranks start here:

# %%
%%distributed --cpus 2
import importlib.util
HAVE_ACCELERATE = importlib.util.find_spec("accelerate") is not None
if HAVE_ACCELERATE:
    exec(open("accel_train.py").read())
else:
    print("skipped: accelerate is not installed")

# %% [markdown]
# The same numbers as the hand-written loop, and the model Accelerate handed back is torch's
# `DistributedDataParallel`. The loss curves of the four 2-process runs lie on top of each
# other; the single process of `accelerate launch --cpu` is a different run (24 steps of 8):

# %%
import kit
import matplotlib.pyplot as plt
fig, ax = plt.subplots(figsize=(7, 3.5))
ax.plot(hand_losses, "o-", lw=4, alpha=0.4, label="hand-written DDP in the notebook")
ax.plot(torchrun_losses, "s--", label="the exported script under torchrun")
if HAVE_ACCELERATE:
    ranks_losses = kit.current_cluster().run("losses").values[0]      # rank 0's curve, into the kernel
    ax.plot(ranks_losses, "x:", ms=9, label="Accelerate in the notebook's ranks")
    ax.plot(accel_torchrun_losses, "+-.", ms=12, label="Accelerate under torchrun")
    ax.plot([i / 2 for i in range(len(launch_cpu_losses))], launch_cpu_losses, ".", color="grey",
            label="accelerate launch --cpu: 1 process, 24 steps (x axis halved)")
ax.set(xlabel="step (global batch 16)", ylabel="training loss (mse)",
       title="one loop, four 2-process runs, one curve")
ax.legend(fontsize="small")
plt.show()

# %% [markdown]
# ## 4. What Accelerate adds: metrics without the padding
#
# Evaluation has a trap that training hides. Every rank must run the **same number** of steps
# (a rank that runs fewer would leave the others waiting in a collective), so a sharded loader
# **pads** a dataset that does not divide evenly, by repeating samples from its beginning.
# `DistributedSampler` pads to a multiple of the world size. Accelerate's prepared loader hands
# out whole batches, batch `i` to rank `i mod N`, and pads to a whole number of batches per rank.
# Gather the per-sample errors with a plain all-gather (`accelerator.gather`) and the repeats are
# counted too. `accelerator.gather_for_metrics` knows the dataset's length and drops them.
#
# **Predict** (write the numbers down; 11 samples, 2 ranks, batches of 4): how many samples does
# each rank get from `DistributedSampler`, and how many from Accelerate's loader? How many values
# does `gather` return, how many `gather_for_metrics`? Which samples are repeated?

# %%
guess_counts = {"DistributedSampler per rank": None, "Accelerate per rank": None, "gather": None,
                "gather_for_metrics": None}

# %%
%%distributed
from torch.utils.data import DistributedSampler
print(f"DistributedSampler, 11 samples: this rank gets "
      f"{list(DistributedSampler(range(11), num_replicas=world_size, rank=rank, shuffle=False))}")
if HAVE_ACCELERATE:
    g = torch.Generator().manual_seed(1)
    EX, EY = torch.randn(11, 8, generator=g), torch.randn(11, 1, generator=g)
    eval_loader = accelerator.prepare(DataLoader(TensorDataset(EX, EY, torch.arange(11)), batch_size=4))
    seen, padded, exact = [], [], []
    with torch.no_grad():
        for x, y, i in eval_loader:
            seen.append(i.tolist())
            err = ((model(x) - y) ** 2).squeeze(1)                 # one value per sample
            padded.append(accelerator.gather(err))                 # everything every rank computed
            exact.append(accelerator.gather_for_metrics(err))      # the repeats dropped
        # one process, 11 samples
        reference = ((accelerator.unwrap_model(model)(EX) - EY) ** 2).squeeze(1)
    padded, exact = torch.cat(padded), torch.cat(exact)
    print(f"Accelerate's loader: this rank's batches {seen}")
    if rank == 0:
        print(f"gather: {len(padded)} values, mean {padded.mean():.4f}\n"
              f"gather_for_metrics: {len(exact)} values, mean {exact.mean():.4f}\n"
              f"one process on the 11 samples: mean {reference.mean():.4f}")
else:
    print("skipped: accelerate is not installed")

# %% [markdown]
# `DistributedSampler` gives each rank 6 indices (12 = 11 + sample 0 again). Accelerate's loader
# has 3 batches (4, 4, 3 samples) for 2 ranks; each rank gets 2 batches of 4, so 16 slots for 11
# samples: the last batch is filled up and a fourth one made, with samples 0 to 4 repeated.
# `gather` returns all 16 errors, and their mean weighs samples 0-4 twice: here it misses
# the one-process mean, in whichever direction those five samples' errors pull it.
# `gather_for_metrics` returns exactly the 11, and its mean is the one-process mean. By hand the
# fix is to gather and cut at `len(dataset)`, which is what Accelerate does for you.
#
# Everything else `prepare` did is DDP: the model is torch's `DistributedDataParallel`, the
# gradients are averaged by its all-reduce in `backward`, and the numbers match the hand-written
# loop. Accelerate also handles device placement, mixed precision (`mixed_precision="bf16"`) and
# gradient accumulation, and switches to FSDP or DeepSpeed by configuration.

# %% [markdown]
# ## 5. Several machines and Slurm (shown, not run)
#
# The exported script runs on a cluster unchanged: its header has the multi-node torchrun
# command. The other way round, torchrun on other machines can start the kit's ranks and
# **attach** them to this notebook, so the cells you are reading run there. `%dist attach
# --world-size 8 --host 0.0.0.0 --port 29650` waits for them and prints the command for each
# node (it would wait here, so we print the command only; the quotes keep `~` for the rank to
# expand on its own node):

# %%
from kit import attach_command
print(attach_command("notebook-host", 29650, "~/.distributed-kit/attach.key", nnodes=2,
                     nproc_per_node=4))

# %% [markdown]
# Under Slurm, `%dist slurm-script` writes an sbatch script that runs that command once per node
# (`srun` starts one torchrun per node, node 0 hosts the rendezvous). Nothing is submitted: this
# machine has no Slurm.

# %%
%dist slurm-script job.sbatch --nodes 2 --gpus-per-node 4 --host notebook-host --port 29650 --force
print(open("job.sbatch").read())

# %% [markdown]
# In both cases torchrun sets the variables of section 1 on every node (`RANK` from 0 to 7,
# `LOCAL_RANK` from 0 to 3 on each node, `WORLD_SIZE` 8), and the ranks run the same cells.

# %% [markdown]
# ## Exercises

# %% [markdown]
# **1.** A dataset of 10 samples on 3 ranks, batches of 4. How many samples does each rank get
# from `DistributedSampler` (`drop_last=False`), and from Accelerate's loader? How many values
# does `gather` return, and how many `gather_for_metrics`?
#
# <details><summary>Answer</summary>
#
# `DistributedSampler`: ceil(10 / 3) = 4 per rank, 3 × 4 = 12 in all, samples 0 and 1 twice.
# Accelerate's loader: ceil(10 / 4) = 3 batches (4, 4, 2), one per rank, the last filled up
# with samples 0 and 1: also 4 per rank. `gather` returns 12 values, `gather_for_metrics` 10.
# </details>

# %% [markdown]
# **2.** torchrun on 2 nodes with `--nproc-per-node 4`. The second process on the second node:
# what are its `RANK`, `LOCAL_RANK` and `WORLD_SIZE`? What would the legacy
# `torch.distributed.launch` pass on its command line?
#
# <details><summary>Answer</summary>
#
# `RANK` = 1 × 4 + 1 = 5, `LOCAL_RANK` = 1, `WORLD_SIZE` = 2 × 4 = 8; the legacy launcher passes
# `--local-rank=1` (the local rank, not the global one: it picks the GPU on the node).
# </details>

# %% [markdown]
# **3.** Why did `accelerate launch --cpu --num_processes 2` train 24 steps, and the 2-process
# runs 12?
#
# <details><summary>Answer</summary>
#
# One process sees all 96 samples in batches of 8: 96 / 8 = 12 steps per epoch, 24 in 2 epochs.
# Two processes each take every other batch: 6 steps per epoch, each on a global batch of
# 2 × 8 = 16, so 12 steps in 2 epochs.
# </details>

# %% [markdown]
# **4.** In section 4 the plain `gather` returned 16 values, 5 of them repeats. If sample `j` has
# error `e_j` and the true mean over the 11 samples is `m`, what is the padded mean?
#
# <details><summary>Answer</summary>
#
# (11 m + e₀ + e₁ + e₂ + e₃ + e₄) / 16: five of sixteen values are samples 0-4 again. It equals
# `m` only when those five samples happen to average `m`; with one repeat out of 12
# (`DistributedSampler`) the error is smaller, (e₀ − m) / 12, but still there.
# </details>

# %% [markdown]
# ## Check against a reference
#
# First the curves: the exported script under torchrun and Accelerate under torchrun must give
# the notebook's curve.

# %%
assert max(abs(a - b) for a, b in zip(hand_losses, torchrun_losses)) < 1e-6
if HAVE_ACCELERATE:
    assert len(ranks_losses) == len(accel_torchrun_losses) == len(hand_losses) == 12
    assert max(abs(a - b) for a, b in zip(hand_losses, ranks_losses + accel_torchrun_losses)) < 1e-6
    assert len(launch_cpu_losses) == 24
print("curves agree")

# %% [markdown]
# Then the parameters: one process training on the whole global batch of 16 at every step must
# end where hand-written DDP and Accelerate end, and `gather_for_metrics` must give the
# one-process metric.

# %%
%dist push hand_params

# %%
%%distributed
import torch.nn as nn
torch.manual_seed(0)
RX = torch.randn(96, 8)
RY = RX @ torch.linspace(-1, 1, 8).unsqueeze(1) + 0.1 * torch.randn(96, 1)
ref = nn.Sequential(nn.Linear(8, 16), nn.Tanh(), nn.Linear(16, 1))          # no DDP, one process
ref_opt = torch.optim.SGD(ref.parameters(), lr=0.1)
for epoch in range(2):
    for k in range(6):
        ref_opt.zero_grad()
        nn.functional.mse_loss(ref(RX[16 * k:16 * (k + 1)]), RY[16 * k:16 * (k + 1)]).backward()
        ref_opt.step()
for a, b in zip(hand_params, ref.parameters()):
    assert torch.allclose(a, b, atol=1e-6), (a - b).abs().max()
if HAVE_ACCELERATE:
    for a, b in zip(accelerator.unwrap_model(model).parameters(), hand_params):
        assert torch.allclose(a, b, atol=1e-6), (a - b).abs().max()
    assert len(padded) == 16 and len(exact) == 11 and \
        torch.allclose(exact.mean(), reference.mean(), atol=1e-6)
"check passed"
