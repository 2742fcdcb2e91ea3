# %% [markdown]
# # 02 · Data parallel: DataParallel against DistributedDataParallel
#
# **Data parallelism** trains one model on several devices at once: every device holds a full
# copy (a **replica**) of the model, each gets a different slice of the batch, and before the
# optimizer step the replicas **average their gradients**, so that all copies stay identical.
#
# PyTorch has two ways to do it:
# - `nn.DataParallel` (**DP**): *one* process drives all devices with threads. One line to add,
#   but on GPUs slower than DDP, and PyTorch's documentation recommends DDP instead.
# - `DistributedDataParallel` (**DDP**): *one process per device* and an all_reduce of the
#   gradients, overlapped with the backward pass. The one everybody uses.
#
# We will build data parallelism by hand first, check that it equals one big batch, then measure
# what DP and DDP each pay, and what a CPU machine can and cannot show about it.
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
guess_equal = None   # True or False: write it first

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

# %% [markdown]
# ## 2. Giving each rank different data: DistributedSampler
#
# In a real loop the split comes from `DistributedSampler`: each rank sees a disjoint
# `1/world_size` share of the dataset, shuffled. Call `sampler.set_epoch(epoch)` every epoch, or
# every epoch repeats the same shuffle.
#
# **Predict:** without `set_epoch`, which indices does rank 0 get in epoch 0 and in epoch 1?

# %%
guess_epoch0, guess_epoch1 = None, None   # rank 0's indices

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

# %% [markdown]
# ## 3. DataParallel against DDP: what each one pays
#
# Both designs compute the same thing: 2 replicas, each with its share of the batch (32 samples
# for the mlp below, 64 for the cnn), one averaged gradient. They differ in *who* does the work
# and *what has to move*:
# - **DP**, one process: every step it scatters the inputs, copies the parameters into each
#   replica, runs the replicas in threads, gathers the outputs, sums the replicas' gradients onto
#   replica 0 (autograd does this), then takes **one** optimizer step.
# - **DDP**, one process per device: each rank computes its samples, an all_reduce averages
#   the gradients (4 bytes per parameter, sent in buckets), then **every rank** takes the same
#   optimizer step on the same averaged gradients.

# %% [markdown]
# So on this machine the question is: is an all_reduce of the gradients (plus a repeated
# optimizer step) cheaper than the compute that the second process takes off the first? That
# depends on how much compute each gradient byte carries, so we try two workloads:
# - **mlp**: 3.42 M parameters, 13.1 MiB of fp32 gradients, little compute per sample (about
#   6 FLOP per parameter per sample, so 6 × 32 / 4 = 48 FLOP per gradient byte at batch 32);
# - **cnn**: 0.11 M parameters, 0.43 MiB of gradients, but every convolution weight is used at
#   every pixel: about 62 MFLOP per sample, some 8,700 FLOP per gradient byte at batch 64.
#
# First the pieces, each measured on its own: one process with one replica's batch, and an
# all_reduce of each model's gradient bytes over loopback.

# %%
import kit
from kit.experiments import ExperimentConfig, run, compare, conclude, table

cluster = kit.current_cluster()
mlp = ExperimentConfig(workload="mlp", batch_size=32, steps=6, warmup_steps=2)
cnn = mlp.replace(workload="cnn", batch_size=64)   # more compute per step: see the text above
def med(record, phase):                   # medians: a busy spell on a shared machine moves a mean
    return record["spread"][phase]["median"]

# 3 short repeats each: one run can land on a busy spell, and these numbers feed a prediction.
single = {w: run(c.replace(strategy="single", world_size=1), cluster=cluster, repeats=3)
          for w, c in (("mlp", mlp), ("cnn", cnn))}
for w, r in single.items():
    print(f"{w}: one process, batch {r['config']['batch_size']}: forward {med(r, 'fwd_ms'):.1f} ms, "
          f"backward {med(r, 'bwd_ms'):.1f} ms, optimizer (Adam) {med(r, 'opt_ms'):.1f} ms")

# %%
%%distributed
import time, statistics
from kit.experiments import build_workload
ar_ms = {}
for w in ("mlp", "cnn"):
    sizes = [p.numel() for p in build_workload(w).model.parameters()]
    g = torch.zeros(sum(sizes))  # one fp32 gradient per parameter
    for _ in range(2):  # warm-up
        dist.all_reduce(g)
    ts = []
    for _ in range(7):
        dist.barrier()
        t0 = time.perf_counter()
        dist.all_reduce(g)
        ts.append((time.perf_counter() - t0) * 1e3)
    ar_ms[w] = statistics.median(ts)
    if rank == 0:
        print(f"{w}: {len(sizes)} parameter tensors, {sum(sizes) / 1e6:.2f} M gradients "
              f"({4 * sum(sizes) / 2**20:.2f} MiB): one all_reduce {ar_ms[w]:.2f} ms")
        if w == "mlp":
            print(f"     tensor sizes (MiB): {[round(4 * n / 2**20, 3) for n in sizes]}")

# %% [markdown]
# With two GPUs the kit runs the real `nn.DataParallel`; here it **re-enacts** its algorithm in
# one CPU process (labelled *emulated*): one process does both replicas' compute (CPU autograd
# runs both replicas' backward on the one thread that called `backward()`), the per-step
# parameter copies and the gradient sum. Those copies are in-process memory copies inside
# forward and backward, so DP has no communication bar of its own. DDP here pays a real
# all_reduce over loopback (lesson 01 measured it at about 1 GB/s), and both ranks repeat the
# optimizer step.

# %% [markdown]
# **Predict** (write the four numbers down): DP does both replicas' forward and backward in one
# process, DDP does one replica's on each rank and adds the all_reduce; each process takes one
# Adam step:
#
#     DP  step ≈ 2 × (forward + backward) + optimizer
#     DDP step ≈ (forward + backward) + all_reduce + optimizer
#
# (DP's is an upper bound: its threads can run the two forwards side by side when both cores
# are free; its backward runs on one thread.)
#
# With the numbers above, which is faster for the mlp, and which for the cnn? By how much?
#
# `compare` runs DP and DDP alternately, 9 times each, and pairs each DP run with the DDP run
# next to it, so a busy spell hits both sides of a pair. It names a winner only when the 95%
# interval of the pair ratios excludes 1 and the difference is over 2% (`docs/measuring.md`).

# %%
guess_winner = {"mlp": None, "cnn": None}   # "dp" or "ddp", and by how much: write it first

# %%
print(f"your guesses: {guess_winner}")
ar_ms = cluster.run("ar_ms").values[0]        # rank 0's all_reduce times, into this kernel
pred = {}
for w, r in single.items():
    fb = med(r, "fwd_ms") + med(r, "bwd_ms")
    pred[w] = {"dp": 2 * fb + med(r, "opt_ms"), "ddp": fb + ar_ms[w] + med(r, "opt_ms")}
mlp_cmp = compare(mlp.replace(strategy="dp"), mlp.replace(strategy="ddp"), repeats=9, cluster=cluster)
print(f"mlp predicted: dp {pred['mlp']['dp']:.0f} ms, ddp {pred['mlp']['ddp']:.0f} ms per step; "
      f"measured medians: dp {mlp_cmp['a']['spread']['step_ms']['median']:.0f} ms, "
      f"ddp {mlp_cmp['b']['spread']['step_ms']['median']:.0f} ms")
conclude(mlp_cmp,
         slower="For the mlp, DDP's all_reduce of 13 MiB (and its second Adam step) costs more than the "
                "compute the second rank takes off the first: on this CPU the one-process design wins.",
         faster="For the mlp, DDP wins even here: the compute it splits outweighs its all_reduce.",
         same="For the mlp, this machine cannot tell them apart: the all_reduce costs about what DDP "
              "saves.")

# %%
# 6 pairs of short runs: the cnn's steps are long, and this verdict is not assumed below.
cnn_cmp = compare(cnn.replace(strategy="dp"), cnn.replace(strategy="ddp"), cluster=cluster, steps=4,
                  warmup_steps=1)
print(f"cnn predicted: dp {pred['cnn']['dp']:.0f} ms, ddp {pred['cnn']['ddp']:.0f} ms per step; "
      f"measured medians: dp {cnn_cmp['a']['spread']['step_ms']['median']:.0f} ms, "
      f"ddp {cnn_cmp['b']['spread']['step_ms']['median']:.0f} ms")
conclude(cnn_cmp,
         faster="For the cnn, DDP wins: 0.43 MiB of gradients cost far less to all_reduce than the "
                "backward the second rank takes off the first (DP runs both replicas' backward on one "
                "thread).",
         slower="For the cnn, DP wins on this machine: the compute DDP splits did not pay for its "
                "all_reduce.",
         same="For the cnn, this machine cannot tell them apart within its noise (other work on the "
              "cores takes from DDP's two ranks the parallelism its win depends on).")

# %% [markdown]
# Compare your predictions with the measured medians. The sentence printed under each verdict
# is the one that holds for your run; what decides them is compute per gradient byte. The mlp
# carries 48 FLOP per gradient byte, and lesson 01 printed this CPU's F/W, its FLOP per byte of
# loopback bandwidth (about 100 in our runs; read yours there), so its all_reduce costs about as
# much as the compute it saves, or more. The cnn carries about 8,700 FLOP per gradient byte: its
# all_reduce is almost free, and DDP gains what its second process computes, *if* both ranks get
# a core at the same time.
#
# The DDP prediction usually comes out low here, and the table in section 4 shows why: every
# DDP phase is slower than the same phase in a lone process, because the two ranks share two
# cores with everything else running here, and an all_reduce finishes only when the slower rank
# arrives, so a rank that lost its core shows up as communication time on the other.

# %% [markdown]
# What this does not show:
# - **DP's real costs on GPUs.** Every step `nn.DataParallel` copies the parameters from GPU 0
#   to every other GPU, scatters the inputs and gathers the outputs through GPU 0 and reduces
#   the gradients onto it, one after another, from one process whose threads share the GIL
#   (GPU 0 also holds extra memory). DDP moves only the gradients, spread over every link and
#   hidden behind backward (lesson 03). That is why PyTorch's documentation recommends DDP even
#   on one machine, and why on GPUs you should expect DDP to win in both cases; our CPU numbers
#   say nothing about the size of those costs.
# - **How the pieces add up on GPUs**, where each rank has its own device: much more closely.

# %% [markdown]
# <details><summary>Our runs (numbers you will not see in yours)</summary>
#
# On the busy 2-core machine this lesson was written on, DDP came out 1.2x to 2.3x slower for
# the mlp in most Run Alls, and "same within noise" now and then, when other jobs kept the cores
# busy. The cnn verdict said "faster" (up to 1.8x) in about half of the Run Alls and "same within
# noise" in the others.
# </details>

# %% [markdown]
# ## 4. Where the step goes, and the repeated optimizer step
#
# The mlp's records from the comparison, with one process and our by-hand `naive_dp` beside them:

# %%
from kit.plots import step_breakdown
naive = run(mlp.replace(strategy="naive_dp"), cluster=cluster)
records = [single["mlp"], mlp_cmp["a"], naive, mlp_cmp["b"]]
for r, name in zip(records, ("single", "dp (emulated)", "naive_dp", "ddp")):
    r["label"] = name                      # short x labels: the four configs differ only in strategy
print(table(records))
fig = step_breakdown(records, title="mlp, batch 32 per replica: where does each step go?")
fig.axes[0].annotate("copies and gradient sum\nare inside forward and\nbackward: no comm bar",
                     (1, 0), xytext=(0, -30), textcoords="offset points", ha="center", va="top",
                     fontsize="x-small", annotation_clip=False)
fig

# %% [markdown]
# Three things to read off the bars and the lines below:
# - **The optimizer.** Both DDP ranks run Adam on all 3.42 M parameters with the same averaged
#   gradients: the same update computed twice, and Adam's two state tensors (8 bytes per
#   parameter) stored twice. On 8 GPUs it is computed 8 times. Giving each rank 1/p of the
#   parameters to update and then sharing the results is ZeRO (the sharding lesson).
# - **DDP's communication.** The gradients travel in buckets of up to 25 MiB (the sizes this run
#   used are printed below), not tensor by tensor. `naive_dp` sends the same bytes as one
#   all_reduce per parameter tensor after the whole backward: 10 all_reduces (three 4 MiB
#   weights, one 1 MiB weight, and six small tensors: the biases and the 40 KiB head), so it
#   pays the latency ten times and overlaps nothing. On this CPU, with little backward to hide
#   behind, the difference between their **comm** columns is small and may go either way from
#   run to run; lesson 03 measures buckets and overlap. Compare that column, not the whole bars:
#   `naive_dp` and `single` are runs of their own, made at other moments than the interleaved
#   dp/ddp pairs, so their forward, backward and optimizer moved with the machine's load (the
#   same compute can take half or twice the time from one minute to the next on a shared machine).
# - **Buffers.** By default DDP also broadcasts the module's *buffers* (BatchNorm's running
#   statistics, for example) from rank 0 at the start of every forward (`broadcast_buffers=True`;
#   torch 2.13 renames it `forward_sync_buffers`). These models have no buffers, so it costs
#   nothing here; a ResNet pays one broadcast per forward unless you turn it off.

# %%
opt = {name: med(r, "opt_ms") for name, r in zip(("single", "dp", "naive_dp", "ddp"), records)}
n_params = sum(b["bytes"] for b in mlp_cmp["b"]["comm"]["buckets"]) / 4
print(f"DDP buckets per step: {[round(b['bytes'] / 2**20, 2) for b in mlp_cmp['b']['comm']['buckets']]} "
      "MiB")
print(f"Adam step: dp {opt['dp']:.1f} ms in its one process; ddp {opt['ddp']:.1f} ms on each of 2 ranks "
      f"= {2 * opt['ddp']:.1f} ms of CPU time for one update")
print(f"Adam state: {8 * n_params / 2**20:.1f} MiB on every DDP rank (sharded over 2 ranks: "
      f"{8 * n_params / 2 / 2**20:.1f} MiB each)")

# %% [markdown]
# ## Exercises

# %% [markdown]
# **1.** With 4 ranks and `batch_size=32` per rank, what is the global batch size? What should
# you do with the learning rate compared with one process at batch 32?
#
# <details><summary>Answer</summary>
#
# 128. The gradient is now an average over 128 samples, less noisy than over 32. A common
# starting point is the **linear scaling rule**: multiply the learning rate by 4, with a warm-up
# over the first epochs (Goyal et al. 2017, "Accurate, large minibatch SGD", for SGD with
# momentum on ImageNet). It has limits: it breaks down past the statistical critical batch size
# (McCandlish et al. 2018), where a bigger batch stops buying progress per step, and for Adam the
# square-root rule, √4 = 2x, fits better (Malladi et al. 2022, "On the SDEs and scaling rules
# for adaptive gradient algorithms"). Tune it; no rule replaces a check of the loss curve.
# </details>

# %% [markdown]
# **2.** The dataset has 10 samples and there are 3 ranks. How many samples does each rank get
# from `DistributedSampler` (default `drop_last=False`)?
#
# <details><summary>Answer</summary>
#
# 4 each (12 in total): the sampler pads by repeating samples so every rank gets the same count,
# because ranks that run different numbers of steps would wait forever in a collective.
# </details>

# %% [markdown]
# **3.** Why does DDP not need to copy the parameters every step, when DataParallel does?
#
# <details><summary>Answer</summary>
#
# Each DDP process owns its replica and applies the same averaged gradients with the same
# optimizer, so the replicas stay identical by construction. DataParallel's replicas are
# temporary copies made from the master module at every forward.
# </details>

# %% [markdown]
# **4.** A model with 1 billion parameters is trained with fp32 Adam (two 4-byte states per
# parameter) by DDP on 8 GPUs. How much optimizer state does each GPU hold, and how much do the
# 8 GPUs hold together? How much would each hold if the optimizer step were sharded (ZeRO-1)?
#
# <details><summary>Answer</summary>
#
# 8 bytes × 1e9 = 8 GB per GPU, 64 GB in all: eight identical copies, updated eight times with
# the same numbers. Sharded over 8 ranks: 8 GB / 8 = 1 GB per GPU, and each GPU does 1/8 of the
# update (then the updated parameters are all-gathered).
# </details>

# %% [markdown]
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
