# %% [markdown]
# # 02 · Data parallel: DataParallel against DistributedDataParallel
#
# **Data parallelism** trains one model on several devices at once: every device holds a full
# copy (a **replica**) of the model, each gets a different slice of the batch, and before the
# optimizer step the replicas **average their gradients**, so that all copies stay identical.
#
# PyTorch has two ways to do it:
# - `nn.DataParallel` (**DP**): *one* process drives all devices with threads. Easy to use, slow.
# - `DistributedDataParallel` (**DDP**): *one process per device* and an all_reduce of the
#   gradients, overlapped with the backward pass. The one everybody uses.
#
# We will build data parallelism by hand first, check that it equals one big batch, then measure
# DP against DDP.
#
# *On Colab?* Run the next cell first; elsewhere it does nothing.

# %%
import sys
if "google.colab" in sys.modules:
    %pip install -q "distributed-kit @ git+https://github.com/distributed-kit/distributed-kit"

# %%
%load_ext kit

# %%
%%distributed --gpus 2
print(f"rank {rank} of {world_size} on {device}")

# %% [markdown]
# ## 1. Data parallelism by hand
#
# The same seed gives every rank the same initial model. Each rank takes its half of a global
# batch of 16 samples, computes gradients, and an all_reduce averages them.
#
# **Predict:** will the averaged gradients equal the gradients of one process that sees all 16
# samples at once? (The loss is a mean over samples.)

# %%
%%distributed
import torch.nn as nn
torch.manual_seed(0)
model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 1))
X, Y = torch.randn(16, 8), torch.randn(16, 1)            # the same global batch on every rank
mine = slice(rank * 8, (rank + 1) * 8)                    # this rank's half

loss = nn.functional.mse_loss(model(X[mine]), Y[mine])
loss.backward()
for p in model.parameters():                              # the naive data-parallel step:
    dist.all_reduce(p.grad)                               #   sum the gradients over ranks,
    p.grad /= world_size                                  #   then average
hand_grads = [p.grad.clone() for p in model.parameters()]

model.zero_grad()
nn.functional.mse_loss(model(X), Y).backward()            # one process, the whole batch
full_grads = [p.grad.clone() for p in model.parameters()]
max(float((a - b).abs().max()) for a, b in zip(hand_grads, full_grads))

# %% [markdown]
# The difference is at the level of float rounding (about 1e-8): the mean of two half-batch
# means *is* the full-batch mean when the halves are equal in size. So two ranks with 8 samples
# each train exactly like one process with 16: the **global batch size** is what matters.
#
# ## 2. Giving each rank different data: DistributedSampler
#
# In a real loop the split comes from `DistributedSampler`: each rank sees a disjoint
# `1/world_size` share of the dataset, shuffled. Call `sampler.set_epoch(epoch)` every epoch, or
# every epoch repeats the same shuffle.
#
# **Predict:** without `set_epoch`, which indices does rank 0 get in epoch 0 and in epoch 1?

# %%
%%distributed
from torch.utils.data import DistributedSampler
data = list(range(12))
sampler = DistributedSampler(data, num_replicas=world_size, rank=rank, shuffle=True, seed=0)
without = [list(sampler) for epoch in range(2)]
with_epoch = []
for epoch in range(2):
    sampler.set_epoch(epoch)
    with_epoch.append(list(sampler))
print("without set_epoch:", without)
print("with set_epoch:   ", with_epoch)

# %% [markdown]
# Without `set_epoch` both epochs are the same order; with it, each epoch is a fresh shuffle.
# In every epoch the two ranks' indices are disjoint and together cover the whole dataset.
#
# ## 3. DataParallel against DDP, measured
#
# Now the real strategies on a small MLP, the same per-device batch of 32 samples:
# - `single`: one process, the baseline;
# - `dp`: DataParallel with 2 replicas. With two GPUs the kit runs the real `nn.DataParallel`;
#   on a CPU machine it re-enacts its algorithm (scatter the inputs, replicate the module, run
#   the replicas in threads of one process, gather the outputs, reduce the gradients onto the
#   first replica), and the run is labelled **emulated**;
# - `naive_dp`: our by-hand version (all_reduce after backward, one tensor at a time);
# - `ddp`: DistributedDataParallel (gradient buckets, all_reduce overlapped with backward).
#
# **Predict:** which one has the highest throughput (samples per second)?

# %%
import kit
from kit.experiments import ExperimentConfig, run, table

base = ExperimentConfig(workload="mlp", batch_size=32, steps=10, warmup_steps=3)
records = [run(base.replace(strategy="single", world_size=1), cluster=kit.current_cluster())]
records += [run(base.replace(strategy=s, world_size=2), cluster=kit.current_cluster()) for s in ("dp", "naive_dp", "ddp")]
print(table(records))

# %% [markdown]
# What does each strategy spend its step on?

# %%
from kit.plots import step_breakdown
step_breakdown(records, title="Where does each data-parallel strategy spend its step?")

# %% [markdown]
# Reading the numbers (they are measured on this machine, so yours will differ a little):
# - **DP** does its forward and backward for both replicas inside one process: threads share one
#   Python interpreter (the GIL lets one thread run Python at a time), and every step it copies
#   the parameters to each replica and gathers the outputs back. On GPUs the first device also
#   does extra work (the gather, the loss, the gradient reduce), so it is slower and fuller than
#   the others.
# - **DDP** runs one process per device: no GIL sharing, the parameters are copied once at the
#   start, and only gradients travel.
# - **naive_dp** sends the same bytes as DDP, but one small all_reduce per parameter after the
#   whole backward: more latency and no overlap. DDP's buckets fix both (next lesson).
#
# On this 2-core CPU, two DDP ranks compete for the same two cores, and loopback
# "communication" is a memory copy; on real GPUs each rank has its own device and the
# differences between strategies are much larger. Throughput here:

# %%
for r in records:
    print(f"{r['label']:<32} {r['summary']['throughput_samples_s']:8.0f} samples/s  {'(emulated)' if r['emulated'] else ''}")

# %% [markdown]
# ## Exercises
#
# **1.** With 4 ranks and `batch_size=32` per rank, what is the global batch size? What should
# you do with the learning rate compared with one process at batch 32?
#
# <details><summary>Answer</summary>
#
# 128. The gradient is now an average over 128 samples; a common rule of thumb scales the
# learning rate with the global batch (linear scaling, with a warm-up).
# </details>
#
# **2.** The dataset has 10 samples and there are 3 ranks. How many samples does each rank get
# from `DistributedSampler` (default `drop_last=False`)?
#
# <details><summary>Answer</summary>
#
# 4 each (12 in total): the sampler pads by repeating samples so every rank gets the same count,
# because ranks that run different numbers of steps would wait forever in a collective.
# </details>
#
# **3.** Why does DDP not need to copy the parameters every step, when DataParallel does?
#
# <details><summary>Answer</summary>
#
# Each DDP process owns its replica and applies the same averaged gradients with the same
# optimizer, so the replicas stay identical by construction. DataParallel's replicas are
# temporary copies made from the master module at every forward.
# </details>
#
# ## Check against a reference
#
# DDP on 2 ranks, each with half of a global batch, must produce the same gradients as one
# process on the whole batch.

# %%
%%distributed
from torch.nn.parallel import DistributedDataParallel as DDP
torch.manual_seed(0)
net = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 1))
reference = [p.detach().clone() for p in net.parameters()]
ddp = DDP(net)
nn.functional.mse_loss(ddp(X[mine]), Y[mine]).backward()           # DDP averages for us
ddp_grads = [p.grad.clone() for p in net.parameters()]

ref_net = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 1))
with torch.no_grad():
    for p, q in zip(ref_net.parameters(), reference):
        p.copy_(q)
nn.functional.mse_loss(ref_net(X), Y).backward()                    # one process, whole batch
assert all(torch.allclose(a, p.grad, atol=1e-6) for a, p in zip(ddp_grads, ref_net.parameters()))
"check passed"
