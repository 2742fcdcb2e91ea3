# %% [markdown]
# # 03 · Hiding communication: overlap and gradient buckets
#
# Lesson 01 showed that every training step must all-reduce the gradients, and that on a slow
# network this takes time. DistributedDataParallel (**DDP**) cannot make the network faster, but
# it can **hide** part of the communication: it starts sending gradients while backward is still
# computing the rest. This lesson looks at how it does that and measures how much it hides.
#
# Words used below:
# - **Overlap**: communication that runs *while* backward computes. It costs no extra time.
# - **Exposed** communication: the part that runs after compute has finished. The step waits
#   for it, so it makes the step longer.
# - **Bucket**: a group of gradients that DDP all-reduces in one message.
#
# *On Colab?* Run the next cell first; elsewhere it does nothing.

# %%
import sys
if "google.colab" in sys.modules:
    %pip install -q "distributed-kit @ git+https://github.com/distributed-kit/distributed-kit"

# %%
%load_ext kit
%matplotlib inline

# %%
%%distributed --gpus 2
print(f"rank {rank}: {dist.get_backend()} on {device}")

# %% [markdown]
# ## 1. Gradients arrive in reverse layer order
#
# Forward runs the layers first to last. Backward runs them **last to first**: the chain rule
# needs the gradient of the layer above before it can compute the one below. So the last layer's
# gradients are ready first, long before backward is over.
#
# **Predict:** a model has three `Linear` layers, named `0`, `2` and `4` (`1` and `3` are ReLUs,
# which have no parameters). In which order do the six parameter gradients become ready?
#
# The cell stamps each gradient as it lands, with a hook that autograd calls after it has
# written the parameter's `.grad`.

# %%
%%distributed
from torch import nn
torch.manual_seed(0)
net = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 16), nn.ReLU(), nn.Linear(16, 4))
name_of = {p: n for n, p in net.named_parameters()}
ready = []
for p in net.parameters():
    p.register_post_accumulate_grad_hook(lambda p: ready.append(name_of[p]))
net(torch.randn(32, 8)).sum().backward()
if rank == 0:
    print("defined in this order:", [n for n, _ in net.named_parameters()])
    print("gradients ready in:   ", ready)

# %% [markdown]
# The last layer (`4`) comes first, the first layer (`0`) last. This is the chance DDP takes:
# while backward still works on layers `2` and `0`, the gradients of layer `4` could already be
# on the network.
#
# ## 2. Buckets: how DDP uses that order
#
# Sending each gradient on its own would pay the latency α (lesson 01) once per parameter.
# DDP instead groups the gradients into **buckets** of about `bucket_cap_mb` MiB (torch's
# default: 25 MiB), in **reverse parameter order**, so that bucket 0 holds the last layers.
# All ranks use the same buckets. During backward, as soon as every gradient in a bucket is
# ready, DDP starts that bucket's all-reduce **asynchronously** (it does not wait for it) and
# backward carries on. At the end of backward, DDP waits for any bucket still in flight.
#
# Our model for this lesson is the kit's `mlp` workload: layers 256 → 1024 → 1024 → 1024 → 1024
# → 10. Its gradients, in fp32 (4 bytes each):
#
# | layer | parameters | gradient bytes |
# |---|---|---|
# | Linear(256, 1024) | 263,168 | 1.0 MiB |
# | 3 × Linear(1024, 1024) | 3 × 1,049,600 | 3 × 4.0 MiB |
# | Linear(1024, 10) | 10,250 | 0.04 MiB |
# | **total** | **3,422,218** | **13.1 MiB** |
#
# **Predict:** with the default cap of 25 MiB, how many buckets will DDP make? When can the
# first all-reduce start?

# %%
import kit
from kit.experiments import ExperimentConfig, run, sweep, table

P = 256 * 1024 + 1024 + 3 * (1024 * 1024 + 1024) + 1024 * 10 + 10
print(f"{P:,} parameters -> {4 * P / 2**20:.1f} MiB of fp32 gradients per step")

base = ExperimentConfig(strategy="ddp", workload="mlp", batch_size=64, steps=8, warmup_steps=2)


def describe(rec):
    """One line per run: the buckets (in the order DDP reduces them) and where comm went."""
    sizes = [b["bytes"] / 2**20 for b in rec["comm"]["buckets"]]
    s = rec["summary"]
    print(f"bucket_cap_mb={rec['config']['bucket_cap_mb']:<4g} {len(sizes)} bucket(s): "
          f"{' + '.join(f'{x:.1f}' for x in sizes)} MiB | step {s['step_ms']:5.1f} ms, "
          f"all-reduce {s['comm_ms']:5.1f} ms = {s['comm_overlap_ms']:4.1f} overlapped + "
          f"{s['comm_exposed_ms']:4.1f} exposed")


one_bucket = run(base, cluster=kit.current_cluster())
describe(one_bucket)

# %% [markdown]
# 13.1 MiB fits in one 25 MiB bucket, so there is **one** bucket, and it is complete only when
# the very last gradient (layer 0's) has landed: at the end of backward. Nothing can overlap.
#
# The question the next plot answers: **on each rank, does the all-reduce run during backward,
# or after it?** Each rank has two lanes: compute on top, communication below. Time runs left
# to right through one training step.

# %%
from kit.plots import step_timeline
step_timeline(one_bucket, title="One bucket: the all-reduce starts only after backward (loopback)")

# %% [markdown]
# The communication bar begins where backward ends, and the optimizer waits for it: all of it
# is exposed.
#
# ## 3. Bucket size sweep on this machine
#
# Smaller buckets fill earlier, so their all-reduces can start during backward.
#
# **Predict:** how many buckets do `bucket_cap_mb` = 1 and 5 give? Hint: DDP never splits one
# parameter across buckets, and it closes a bucket as soon as it reaches the cap.

# %%
loopback = sweep(base, "bucket_cap_mb", [1, 5], cluster=kit.current_cluster()) + [one_bucket]
for rec in loopback:
    describe(rec)

# %% [markdown]
# With a 1 MiB cap, each 4 MiB weight already overfills a bucket, so every `Linear` gets its own
# bucket (the little output layer shares one with the layer before it): 4 buckets. With 5 MiB, 2 buckets.
# Smaller buckets give more of the all-reduce a chance to run during backward (the "overlapped"
# column).
#
# Did it make the step shorter? Look at the step column above. Here it may not help much, and
# the reason is this machine: the "network" is loopback, and the gloo all-reduce is memory copies
# done **by the same 2 CPU cores** that compute backward. Overlap then just shares the cores.
# On a real GPU cluster, the all-reduce runs on the network and its own GPU stream while backward
# keeps the GPU's compute units busy, so overlapped time is nearly free (NCCL itself uses only
# a few of those units).
#
# ## 4. Feel a slow network: the virtual interconnect
#
# A GPU computes this step 100 to 1000 times faster than this CPU (lesson 01), so on a real
# cluster the network, not compute, sets the pace. To give this CPU the **balance** a GPU cluster
# has (communication comparable to compute), we slow the network down instead: the kit's
# **virtual interconnect** runs the real all-reduce, then sends each bucket across an emulated
# link, which adds the link's time. Buckets queue on the link one after another. Runs that
# use it are marked **emulated** (hatched in the plots).
#
# We use a custom link of α = 50 µs and β = 0.25 GB/s (2 Gb/s, slower than any data-centre
# network, on purpose). It is ring all-reduce time on 2 ranks, `t = α + 2(p−1)/p × n / β`.
#
# **Predict:** how many milliseconds of link time per step for our 13.7 MB (13.1 MiB) of
# gradients? Can overlap hide all of it, given the backward times you measured above?

# %%
slow = base.replace(interconnect="custom", link_alpha_us=50, link_gbps=0.25)
n, p = one_bucket["summary"]["bytes_per_step"], 2
print(f"predicted link time: {(50e-6 + 2 * (p - 1) / p * n / 0.25e9) * 1e3:.0f} ms per step (one bucket)")

emulated = sweep(slow, "bucket_cap_mb", [1, 5, 25], cluster=kit.current_cluster())
for rec in emulated:
    describe(rec)

# %% [markdown]
# The all-reduce column is never below the predicted link time, whatever the bucket size:
# buckets do not change how many bytes cross the link. What they change is **when** the bytes
# start. The question the next plot
# answers: **how much of each step is compute, and how much is communication we waited for?**
# The narrow box drawn inside backward is the overlapped (hidden) communication; the orange
# segment above backward is the exposed communication (hatched: it went over the emulated link).

# %%
from kit.plots import step_breakdown
step_breakdown(emulated, title="Slow emulated link: smaller buckets hide part of the all-reduce")

# %% [markdown]
# Now the timeline of the 4-bucket run. A bucket's bar runs from the moment DDP launched it to
# the moment it was delivered; bars stack in sub-lanes when several buckets are queued on the
# link at once (the link still carries them one after another).

# %%
step_timeline(emulated[0], title="4 buckets on a slow emulated link: the first all-reduces start during backward")

# %% [markdown]
# The first buckets launch while backward is still computing. Now compare what was measured:

# %%
small, big = emulated[0]["summary"], emulated[-1]["summary"]
print(f"exposed all-reduce: {big['comm_exposed_ms']:.1f} ms with 1 bucket, {small['comm_exposed_ms']:.1f} ms with 4 buckets")
print(f"step: {big['step_ms']:.1f} ms with 1 bucket, {small['step_ms']:.1f} ms with 4 buckets "
      f"({'shorter' if small['step_ms'] < big['step_ms'] else 'not shorter: noise on a busy machine? run the cell again'})")
print(f"upper bound on what overlap can hide: the backward time, {small['bwd_ms']:.1f} ms, "
      f"against {small['comm_ms']:.1f} ms of all-reduce")

# %% [markdown]
# Overlap can hide at most as much communication as there is backward compute to hide it
# behind, and the last bucket always waits for the last gradient. When the all-reduce takes
# longer than backward, as on this slow link, part of it stays exposed whatever the bucket size.
#
# Smaller is not always better: every bucket pays the latency α once, and a small message uses
# the link poorly (lesson 01's n½). The DDP paper reports that a well-chosen bucket size
# "could lead to more than 2X speedup", with the best size growing with the model, more
# slowly than the model does.
#
# A detail: when you leave `bucket_cap_mb` unset, torch also makes the bucket with the
# first-defined layers (whose gradients come last) small, 1 MiB, so that little communication is
# left after backward ends. The kit always passes `bucket_cap_mb`, so all its buckets use that one
# cap.
#
# ## 5. Gradient accumulation with `no_sync`
#
# Another way to pay for less communication: send it less often. With **gradient accumulation**
# each rank runs k micro-batches, adding up their gradients locally, and all-reduces only once,
# after the last one. DDP's `no_sync()` context skips the all-reduce:
#
# ```python
# for i, (x, y) in enumerate(micro_batches):               # k micro-batches
#     with model.no_sync() if i < k - 1 else nullcontext():
#         (loss_fn(model(x), y) / k).backward()             # / k: the mean over the k
# optimizer.step(); optimizer.zero_grad()
# ```
#
# The gradient is exactly that of one k times bigger batch, so this changes the batch size of the
# optimizer step, not the math (the check at the end of this lesson verifies it). The kit's
# `grad_accum_steps` does this, with `batch_size` samples per micro-batch.
#
# **Predict:** on the slow link, what happens to the all-reduce time per step with k = 1, 2, 4?
# And per sample?

# %%
# k = 1 is the 5 MiB run of section 4; k = 2 and 4 are new
accum = [emulated[1]] + sweep(emulated[1]["config"], "grad_accum_steps", [2, 4], cluster=kit.current_cluster())
for rec in accum:
    s, k = rec["summary"], rec["config"]["grad_accum_steps"]
    samples = rec["config"]["batch_size"] * 2 * k
    print(f"k={k}: {samples:3d} samples per step, {s['bytes_per_step'] / 2**20:.1f} MiB sent, all-reduce "
          f"{s['comm_ms']:5.1f} ms per step = {s['comm_ms'] / samples * 1e3:5.0f} µs per sample, "
          f"{s['throughput_samples_s']:6.0f} samples/s")

# %% [markdown]
# The bytes per step stay the same, and so does the link time (the all-reduce column moves only
# when the busy machine slows the real all-reduce underneath). But they are spread over k times
# more samples, so the cost per sample falls about k times. The question the next plot answers:
# **as k grows, what fraction of the step is exposed communication, and how many samples per
# second do we train?**

# %%
from kit.plots import comm_vs_knob
comm_vs_knob(accum, title="Gradient accumulation on a slow emulated link: one all-reduce per k micro-batches")

# %% [markdown]
# Expect the left panel to fall and the right one to rise. The right one is the noisier: on this
# shared 2-core machine, a burst of other work slows a whole run, so if one point is out of line,
# run the sweep again.
#
# The price: k times bigger batches per optimizer step (or k times smaller micro-batches for the
# same batch), and k times fewer optimizer steps for the same data. The DDP paper reports that
# skipping synchronisation this way cut communication "without noticeably degrading
# convergence" in its experiments; it is a choice to check for your model.
#
# ## What differs on real GPUs
#
# - The all-reduce (NCCL) runs on its own GPU stream and on the network, beside backward's
#   kernels, so overlapped time is nearly free. On this CPU, gloo and backward share 2 cores.
# - Compute is 100 to 1000 times faster, so a real network (not an emulated one) is what makes
#   communication comparable to compute. The emulated link above stands in for that.
# - The mechanism does not change: buckets in reverse parameter order, all-reduce launched when
#   a bucket is full, `no_sync` to skip it.
#
# ## Exercises
#
# **1.** How many buckets does `bucket_cap_mb=0.25` give for this MLP? Try it:
# `describe(run(base.replace(bucket_cap_mb=0.25), cluster=kit.current_cluster()))`.
#
# <details><summary>Answer</summary>
#
# Still 4. A parameter is never split between buckets, and each 1024 × 1024 weight is already
# 4 MiB, more than the cap: every `Linear` gets its own bucket (with the tiny last layer sharing
# the first). Below about 1 MiB, the cap no longer changes anything for this model.
# </details>
#
# **2.** One 25 MB bucket, ring all-reduce over 8 H100s at the measured 370 GB/s, and over 16
# nodes on 100 GbE (12.5 GB/s). How long is the transfer (bandwidth term only)?
#
# <details><summary>Answer</summary>
#
# 2 × 7/8 × 25e6 / 370e9 ≈ 118 µs on NVLink; 2 × 15/16 × 25e6 / 12.5e9 ≈ 3.75 ms on 100 GbE,
# 32 times longer. On NVLink a bucket hides easily behind backward; on Ethernet it may not.
# </details>
#
# **3.** Backward takes 30 ms and the all-reduce of all gradients 50 ms. What is the least
# exposed communication any bucket size can give?
#
# <details><summary>Answer</summary>
#
# 20 ms: overlap hides at most the 30 ms that backward lasts. In practice a bit more is exposed,
# because the last bucket can only start after the last gradient.
# </details>
#
# **4.** With k = 4 micro-batches of 32 samples per rank on 2 ranks, what single-process batch
# gives the same gradient? How many all-reduces per optimizer step?
#
# <details><summary>Answer</summary>
#
# 4 × 32 × 2 = 256 samples. One all-reduce (per bucket) per optimizer step, after the last
# micro-batch; the first three run inside `no_sync()`.
# </details>
#
# ## Check against a reference
#
# Overlap, buckets and `no_sync` must not change the result. Here DDP on 2 ranks, each rank
# with its half of a 16-sample batch in 2 micro-batches (`no_sync` on the first), tiny buckets
# (one per parameter), must give the same gradients as one process on the full batch.

# %%
%%distributed
import copy
from contextlib import nullcontext
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP
torch.manual_seed(0)
ref = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 4)).to(device)  # same weights on every rank
ddp = DDP(copy.deepcopy(ref), device_ids=[device.index] if device.type == "cuda" else None,
          bucket_cap_mb=1e-4)                                   # about 100 bytes: one bucket per parameter
g = torch.Generator().manual_seed(1)
x, y = torch.randn(16, 8, generator=g).to(device), torch.randn(16, 4, generator=g).to(device)
loss_fn = nn.MSELoss()
loss_fn(ref(x), y).backward()                                   # one process, the full batch
k = 2
mine = list(zip(x.chunk(world_size)[rank].chunk(k), y.chunk(world_size)[rank].chunk(k)))
for i, (xm, ym) in enumerate(mine):                             # this rank's half, k micro-batches
    with ddp.no_sync() if i < k - 1 else nullcontext():
        (loss_fn(ddp(xm), ym) / k).backward()
for a, b in zip(ref.parameters(), ddp.module.parameters()):
    assert torch.allclose(a.grad, b.grad, atol=1e-6), (a.grad - b.grad).abs().max()
"check passed"
