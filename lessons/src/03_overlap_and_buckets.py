# %% [markdown]
# # 03 · Hiding communication: overlap and gradient buckets
#
# Lesson 01 showed that every training step must all-reduce the gradients, and that on a slow
# network this takes time. DistributedDataParallel (**DDP**) cannot make the network faster, but
# it can **hide** part of it: it starts sending gradients while backward still computes the rest.
# This lesson looks at how, and measures how much it hides.
#
# Words used below:
# - **Overlap**: communication that runs *while* backward computes.
# - **Exposed** communication: the part that runs after compute has finished; the step waits for it.
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
# Forward runs the layers first to last; backward runs them **last to first**, because the chain
# rule needs the gradient of the layer above before it can compute the one below. So the last
# layer's gradients are ready first, long before backward is over.
#
# **Predict:** a model has three `Linear` layers, named `0`, `2` and `4` (`1` and `3` are ReLUs,
# which have no parameters). In which order do the six parameter gradients become ready? The cell
# stamps each gradient with a hook that autograd calls once it has written the parameter's `.grad`.

# %%
guess_order = None   # e.g. ["0.weight", "0.bias", ...]: your order, then compare with the printout

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

# %% [markdown]
# ## 2. Buckets: how DDP uses that order
#
# Sending each gradient on its own would pay the latency α (lesson 01) once per parameter. DDP
# instead groups the gradients into **buckets**, the same on every rank, in **reverse parameter
# order**: bucket 0 holds the last layers, whose gradients are ready first. As soon as every
# gradient in a bucket is ready, DDP starts that bucket's all-reduce **asynchronously** and
# backward carries on; at the end of backward it waits for any bucket still in flight. Three rules
# of torch's DDP (torch 2.13, `torch/nn/parallel/distributed.py`) decide what you will see:
# - **The cap**: a bucket closes as soon as it holds at least `bucket_cap_mb` MiB (default 25),
#   and a parameter is never split between buckets.
# - **A small first bucket**, only when you leave `bucket_cap_mb` unset: the first bucket *in
#   gradient-ready order* is capped at 1 MiB, so the first all-reduce starts early in backward.
# - **Step 1 uses one bucket**: DDP does not know yet the order gradients arrive in, so it puts
#   them all in one bucket, records the order and **rebuilds** the buckets before step 2 (with
#   DDP's defaults; the exceptions are in `docs/going-further.md`).

# %% [markdown]
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
# **Predict** (write the sizes down, in MiB, in the order the buckets are reduced):
# 1. torch's defaults (`bucket_cap_mb` unset): the buckets of step 1, and of step 2.
# 2. `bucket_cap_mb=25`, `5` and `1`, from step 2 on.

# %%
guess_buckets_mib = {"unset, step 1": None, "unset, step 2": None, 25: None, 5: None, 1: None}

# %%
%%distributed
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.distributed.algorithms.ddp_comm_hooks.default_hooks import allreduce_hook
from kit.experiments import build_workload

def buckets_per_step(cap, steps=2):
    """Bucket sizes (MiB) DDP reduces in each of the first `steps` steps: a fresh DDP copy of the
    model, whose all-reduce hook notes the size of every bucket it is handed."""
    model = build_workload("mlp").model.to(device)          # the kit's MLP, same weights everywhere
    kw = {} if cap is None else {"bucket_cap_mb": cap}
    ddp = DDP(model, device_ids=[device.index] if device.type == "cuda" else None, **kw)
    seen = []
    def noting_allreduce(state, bucket):                    # DDP's own all-reduce, plus a note
        seen.append(bucket.buffer().numel() * 4 / 2**20)
        return allreduce_hook(state, bucket)
    ddp.register_comm_hook(None, noting_allreduce)
    out = []
    for _ in range(steps):
        seen.clear()
        ddp(torch.randn(8, 256, device=device)).sum().backward()
        out.append(" + ".join(f"{x:.2f}" for x in seen))
    return out

for cap in (None, 25, 5, 1):
    first, second = buckets_per_step(cap)
    if rank == 0:
        name = "unset (torch default)" if cap is None else f"{cap} MiB"
        print(f"bucket_cap_mb {name}:")
        print(f"   step 1: {first} MiB")
        print(f"   step 2: {second} MiB")

# %% [markdown]
# What happened:
# - **Step 1**: one 13.05 MiB bucket whatever the cap (DDP did not know the order yet).
# - **torch's default**, from step 2: 4.04 + 9.01 MiB. The output layer (0.04 MiB) is ready first
#   and below the 1 MiB first-bucket cap, so the last 4 MiB layer joins it; the other 9.01 MiB
#   fit in one 25 MiB bucket.
# - **`bucket_cap_mb=25`** (what the kit passes unless you change it): **one** 13.05 MiB bucket.
#   **5**: 8.05 + 5.01. **1**: each 4 MiB layer fills a bucket on its own (the little output
#   layer shares one with the layer before it): 4 buckets.

# %%
import kit
from kit.experiments import ExperimentConfig, bucket_report, compare, conclude, run, sweep
# warmup_steps=1: the first step's single bucket is never measured
base = ExperimentConfig(strategy="ddp", workload="mlp", batch_size=64, steps=4, warmup_steps=1)

# %% [markdown]
# ## 3. Does overlap help on this machine?
#
# With one bucket nothing can overlap: it is complete only when the last gradient (layer 0's)
# lands, at the end of backward. With 4 buckets, three could be reduced while backward computes.
#
# **Predict:** you will measure the step with one bucket (cap 25) and with 4 (cap 1), six runs
# each, interleaved, on this machine's loopback "network". What ratio step(4 buckets) /
# step(1 bucket) do you expect (0.8? 1.0? 1.3?)? Think about who does the all-reduce here:
# gloo's memory copies and sums run on **the same 2 CPU cores** that compute backward.

# %%
guess_ratio = None   # step(4 buckets) / step(1 bucket)

# %% tags=["verdict"]
loop = compare(base, base.replace(bucket_cap_mb=1), cluster=kit.current_cluster())
one_bucket, four_buckets = loop["a"], loop["b"]
for rec in (one_bucket, four_buckets):
    print(bucket_report(rec))      # the buckets, then where the step and the all-reduce went
print(f"your guess: {guess_ratio}")
conclude(loop,
         faster="Here 4 buckets shortened the step: what they hid (the 'hidden' column) was more "
                "than they cost backward on the shared cores.",
         slower="Here 4 buckets made the step longer: overlap cannot hide work on cores that are "
                "already busy, and every extra bucket costs a fixed amount.",
         same="Here the overlap bought nothing you can measure: whatever 4 buckets hid (the "
              "'hidden' column) was paid back on the shared cores.");

# %% [markdown]
# The verdict is your machine's and moves with the load (our runs gave all three:
# `docs/going-further.md`). On the 2 shared cores, gloo can reduce early buckets in the idle
# moments there are even here (a rank waiting for its partner, Python between operations), but
# every bucket pays a fixed cost (starting the collective, waking gloo's thread, both ranks
# meeting at it), and whatever gloo does during backward, backward waits for.
#
# The question the next plot answers: **on each rank, does the all-reduce run during backward,
# or after it?** Each rank has two lanes, compute above communication; time runs left to right
# through the last measured step of the one-bucket run.

# %%
from kit.plots import step_timeline
step_timeline(one_bucket, title="One bucket: the all-reduce starts only after backward (loopback)")

# %% [markdown]
# The communication bar begins where backward ends, and the optimizer waits for it: all of it
# is exposed.

# %% [markdown]
# ## 4. Feel a slow network: the virtual interconnect
#
# A GPU computes this step in a small fraction of this CPU's time (lesson 01), so on a real
# cluster the network, not compute, sets the pace. To give this CPU a GPU cluster's **balance**,
# we slow the network down instead: the kit's **virtual interconnect** runs the real all-reduce,
# then sends each bucket across an emulated link, one after another, adding the link's time.
# Runs on it are marked **emulated** (hatched in plots). Ours has α = 50 µs per ring step and
# β = 0.25 GB/s (2 Gb/s, slower than any data-centre network, on purpose), and charges a ring
# all-reduce of n bytes on p ranks `t = 2(p−1)·α + 2(p−1)/p · n / β` (lesson 01).
#
# **Predict:** (1) how many ms of link time per step, with 1 bucket and with section 3's 4?
# (2) How many ms at most can 4 buckets save per step? Each bucket goes on the wire *after* its
# real all-reduce, so link time can hide behind backward, and behind the next bucket's loopback
# all-reduce (a two-stage pipeline one bucket cannot form): the bound is about section 3's
# backward plus its one-bucket loopback all-reduce.

# %%
guess_link_ms, guess_saving_ms = None, None   # (1) link time per step, (2) the most 4 buckets can save

# %%
from kit.experiments import alpha_beta_allreduce_s

slow = base.replace(interconnect="custom", link_alpha_us=50, link_gbps=0.25)
p = 2
for rec in (one_bucket, four_buckets):
    sizes = [b["bytes"] for b in rec["comm"]["buckets"]]
    per_bucket = [1e3 * alpha_beta_allreduce_s(n, p, 50, 0.25) for n in sizes]
    print(f"{len(sizes)} bucket(s): link time {' + '.join(f'{t:.1f}' for t in per_bucket)} "
          f"= {sum(per_bucket):.1f} ms per step")
bwd, loop_ar = four_buckets["summary"]["bwd_ms"], one_bucket["summary"]["comm_ms"]
print(f"section 3: backward {bwd:.0f} ms, one-bucket loopback all-reduce {loop_ar:.0f} ms")
print(f"-> 4 buckets can save at most about {bwd + loop_ar:.0f} ms per step; "
      f"your guesses: {guess_link_ms} ms of link time, {guess_saving_ms} ms saved")

# %% [markdown]
# The link time hardly depends on the number of buckets (the bytes are the same; each extra
# bucket adds 2 × 50 µs). What buckets change is **when** the bytes start. Now measure both:

# %% tags=["verdict"]
# nine pairs: the saving is small beside the step; one pair hit by other work must not decide
emu = compare(slow, slow.replace(bucket_cap_mb=1), repeats=9, cluster=kit.current_cluster())
slow_one, slow_four = emu["a"], emu["b"]
for rec in (slow_one, slow_four):
    print(bucket_report(rec))
saved = sorted(pr["a_ms"] - pr["b_ms"] for pr in emu["pairs"])
bound = slow_four["summary"]["bwd_ms"] + one_bucket["summary"]["comm_ms"]
print(f"saved per step, pair by pair (ms): {', '.join(f'{x:.0f}' for x in saved)}")
print(f"most that overlap can save: about {bound:.0f} ms (backward + loopback all-reduce)")
conclude(emu,
         faster="On the slow link, 4 buckets shortened the step: part of the link time now runs "
                "while backward computes, or while the next bucket is being reduced.",
         slower="On the slow link, 4 buckets made the step longer on this run: the cost of the "
                "shared cores (section 3) outweighed what the link could hide.",
         same="On this run the difference is within the noise: the saving overlap can make is "
              "about the size of the run-to-run noise here.");

# %% [markdown]
# Read the pairs against your prediction: overlap can hide at most as much communication as
# there is other work to hide it behind, and the last bucket (layer 0, 1 MiB, 4.3 ms on this
# link) always waits for the last gradient. A pair that "saved" more than the bound is this
# shared machine's noise, which is why the verdict, not one pair, decides.
#
# The question the next plot answers: **how much of each step is compute, and how much is
# communication we waited for?** The narrow box inside backward is the overlapped (hidden)
# communication; the orange segment above it the exposed one (hatched: over the emulated link).

# %%
from kit.plots import step_breakdown
# short labels: the records' own labels collide under two bars
step_breakdown([{**slow_one, "label": "1 bucket\n(cap 25 MiB)"},
                {**slow_four, "label": "4 buckets\n(cap 1 MiB)"}],
               title="Slow emulated link: 1 bucket vs 4 buckets")

# %% [markdown]
# Now one step of the 4-bucket run. A bucket's bar runs from DDP's launch to delivery: first
# (light) the real loopback all-reduce and the wait for a free link, then (hatched) its own time
# on the wire, from the link's formula. Bars stack in sub-lanes when several buckets are in
# flight; the wire carries them one after another.

# %%
step_timeline(slow_four, title="4 buckets on a slow emulated link: queueing, then the wire")

# %% [markdown]
# A wire segment inside backward is hidden link time; the last bucket's always comes after
# backward. A light part under the previous bucket's wire segment is this section's pipeline; it
# shares the cores with backward and can be slow, pushing a bucket's wire time past backward's end.

# %% [markdown]
# ## 5. Gradient accumulation with `no_sync`
#
# Another way to pay for less communication: send it less often. With **gradient accumulation**
# each rank runs k micro-batches, adding up their gradients locally, and all-reduces once, after
# the last; DDP's `no_sync()` context skips the all-reduce of the others:
#
# ```python
# for i, (x, y) in enumerate(micro_batches):               # k micro-batches
#     with model.no_sync() if i < k - 1 else nullcontext():
#         (loss_fn(model(x), y) / k).backward()             # / k: the mean over the k
# optimizer.step(); optimizer.zero_grad()
# ```
#
# The gradient is exactly that of one k times bigger batch (the final check verifies it). The
# kit's `grad_accum_steps` does this, with `batch_size` samples per micro-batch.
#
# **Predict:** on the slow link with one bucket (54.9 ms of link time per step, section 4), 64
# samples per micro-batch per rank and 2 ranks: how many µs of link time per sample with k = 1,
# 2 and 4?

# %%
guess_us_per_sample = {1: None, 2: None, 4: None}

# %%
# k = 1 is the one-bucket run of section 4; k = 2 and 4 are new
print(f"your guesses (µs of link time per sample): {guess_us_per_sample}")
accum = [slow_one] + sweep(slow, "grad_accum_steps", [2, 4], cluster=kit.current_cluster())
for rec in accum:
    s, k = rec["summary"], rec["config"]["grad_accum_steps"]
    samples = rec["config"]["batch_size"] * 2 * k
    print(f"k={k}: {samples} samples per step, {s['bytes_per_step'] / 2**20:.1f} MiB sent")
    print(f"   all-reduce {s['comm_ms']:.0f} ms per step = {s['comm_ms'] / samples * 1e3:.0f} µs "
          f"per sample; {s['throughput_samples_s']:.0f} samples/s")

# %% [markdown]
# Prediction: 54.9 ms / 128 samples = 429 µs per sample at k = 1, 214 µs at k = 2, 107 µs at
# k = 4: the bytes per step, and so the link time, stay the same. (The measured all-reduce is
# higher: the real loopback all-reduce runs underneath, and moves with the load.) The question
# the next plot answers: **as k grows, what fraction of the step is exposed communication, and
# how many samples per second do we train?**

# %%
from kit.plots import comm_vs_knob
comm_vs_knob(accum,
             title="Gradient accumulation on a slow emulated link: one all-reduce per k micro-batches")

# %% [markdown]
# Compare the left panel with your prediction: the exposed part is about one link time per step,
# now shared by k micro-batches. The price: k times bigger batches per optimizer step (or k times
# smaller micro-batches), and k times fewer optimizer steps for the same data. The right panel is
# one run per point: read a point out of line as noise. The DDP paper reports that skipping
# synchronisation this way cut communication "without noticeably degrading convergence" in its
# experiments; check it for your model.

# %% [markdown]
# ## What differs on real GPUs
#
# - NCCL runs the all-reduce on its own GPU stream, over NVLink or the network card, while
#   backward keeps the compute units busy: overlap costs little (NCCL does use a few compute
#   units). Here gloo and backward share 2 cores, which is why section 3's answer moves with load.
# - Smaller buckets then shorten the step until each bucket's latency 2(p−1)α and a small
#   message's poor use of the link (lesson 01) dominate. The DDP paper (Li et al., VLDB 2020)
#   reports that a well-chosen bucket size "could lead to more than 2X speedup": measure yours.
# - On a real network the all-reduce *is* the wire, so section 4's bound is backward alone
#   (`docs/going-further.md` says why, and gives our own runs of section 3).

# %% [markdown]
# ## Exercises
#
# **1.** How many buckets do `bucket_cap_mb` = 0.25, 0.03 and 0.001 give for this MLP (after
# the first step)? In gradient-ready order (section 1 printed it: each layer's bias, then its
# weight) the tensors are: the output layer's bias (40 bytes) and weight (40,960 bytes,
# 0.039 MiB); then for each 1024-wide layer its bias (4,096 bytes) and its weight (4 MiB, or
# 1 MiB for the first layer). Try it with section 2's `buckets_per_step` in a `%%distributed`
# cell, or with
# `print(bucket_report(run(base.replace(bucket_cap_mb=0.03), cluster=kit.current_cluster())))`.
#
# <details><summary>Answer</summary>
#
# A bucket closes once it holds at least the cap, and a parameter is never split.
# - **0.25 → 4 buckets** (4.04 + 4.00 + 4.00 + 1.00 MiB), as with 1 MiB: the output layer
#   (0.039 MiB) and the next bias stay under 0.25 MiB, so the next 4 MiB weight joins them.
#   The count stays 4 for every cap between about 0.043 MiB and 4 MiB.
# - **0.03 → 5 buckets** (0.04 + 4.00 + 4.00 + 4.00 + 1.00): the output layer's bias and
#   weight (40 + 40,960 bytes, 0.039 MiB) reach the cap and close the first bucket.
# - **0.001 → 9 buckets** (0.04, then 0.004 + 4.0 three times, then 0.004 and 1.0): below 4 KiB
#   even a 1024-float bias fills a bucket on its own. Only the output layer's 40-byte bias
#   still shares one, with its weight.
# </details>

# %% [markdown]
# **2.** One 25 MB bucket, ring all-reduce over 8 H100s on NVLink, and over 16 nodes on
# 100 GbE (12.5 GB/s). How long does it take? The NVLink number people quote, a bus bandwidth
# of about 370 GB/s, is measured with ~10 GB messages; `docs/hardware.md` gives the sources and
# the model the kit uses for smaller messages. Check with
# `1e3 * kit.experiments.link_allreduce_s("nvlink", 25e6, 8)` (ms).
#
# <details><summary>Answer</summary>
#
# At 370 GB/s the bandwidth term would be 2 × 7/8 × 25e6 / 370e9 ≈ 118 µs, but a 25 MB message
# does not reach that rate. The kit's model (fitted to a published 58 MB all-reduce at ~150 GB/s,
# `docs/hardware.md`) puts each ring step's 3.1 MB chunk at 370 × 3.125 / (3.125 + 9.2) ≈ 94 GB/s:
# 2 × 7/8 × 25e6 / 94e9 ≈ 466 µs, plus a latency of 8.4 + 14 × 3.4 = 56 µs, ≈ 0.52 ms. On 100 GbE:
# 2 × 15/16 × 25e6 / 12.5e9 = 3.75 ms plus 8.4 + 30 × 14 = 428 µs ≈ 4.2 ms, 8 times longer. A
# bucket that hides behind backward on NVLink may well not on Ethernet.
# </details>

# %% [markdown]
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

# %% [markdown]
# ## Check against a reference
#
# Overlap, buckets and `no_sync` must not change the result: DDP on 2 ranks, each with its half
# of a 16-sample batch in 2 micro-batches (`no_sync` on the first) and one bucket per parameter,
# must give the same gradients as one process on the full batch. One throwaway step first: the
# first step would use a single bucket (section 2).

# %%
%%distributed
import copy
from contextlib import nullcontext
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP
torch.manual_seed(0)
# same weights on every rank
ref = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 4)).to(device)
from torch.distributed.algorithms.ddp_comm_hooks.default_hooks import allreduce_hook
ddp = DDP(copy.deepcopy(ref), device_ids=[device.index] if device.type == "cuda" else None,
          bucket_cap_mb=1e-6)         # 1 byte, below any gradient: one bucket per parameter
sizes = []
def noting_allreduce(state, bucket):                            # DDP's own all-reduce, plus a note
    sizes.append(bucket.buffer().numel())
    return allreduce_hook(state, bucket)
ddp.register_comm_hook(None, noting_allreduce)
ddp(torch.randn(4, 8, device=device)).sum().backward()         # step 1: one bucket; then DDP rebuilds
ddp.zero_grad(set_to_none=True)
sizes.clear()
g = torch.Generator().manual_seed(1)
x, y = torch.randn(16, 8, generator=g).to(device), torch.randn(16, 4, generator=g).to(device)
loss_fn = nn.MSELoss()
loss_fn(ref(x), y).backward()                                   # one process, the full batch
k = 2
mine = list(zip(x.chunk(world_size)[rank].chunk(k), y.chunk(world_size)[rank].chunk(k)))
for i, (xm, ym) in enumerate(mine):                             # this rank's half, k micro-batches
    with ddp.no_sync() if i < k - 1 else nullcontext():
        (loss_fn(ddp(xm), ym) / k).backward()
assert len(sizes) == 4, sizes                                   # 4 parameters, 4 buckets, 1 sync
for a, b in zip(ref.parameters(), ddp.module.parameters()):
    assert torch.allclose(a.grad, b.grad, atol=1e-6), (a.grad - b.grad).abs().max()
"check passed"
