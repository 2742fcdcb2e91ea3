# %% [markdown]
# # 01 · Why communication is the bottleneck
#
# Adding GPUs adds compute, but every training step the ranks must also **exchange gradients**.
# Compute per rank shrinks as you add ranks; the gradients to exchange do not. Sooner or later
# the network decides how fast you train. This lesson measures the network you have, fits a
# two-number model to it, and uses the model to predict what real clusters would do.
#
# Two words first:
# - **Latency** (α, "alpha", in µs): the fixed cost of sending any message, even an empty one.
# - **Bandwidth** (β, "beta", in GB/s = 10⁹ bytes per second): how fast bytes flow once started.
#
# The **alpha-beta model** says one message of *n* bytes takes `t = α + n / β`.
# Small messages are latency-bound; big ones are bandwidth-bound. (When you read the papers:
# the literature, e.g. Thakur, Rabenseifner and Gropp 2005, writes β for the *inverse*, seconds
# per byte, and `t = α + nβ`. This kit uses β as a bandwidth in GB/s, so it divides.)
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
print(f"rank {rank}: {dist.get_backend()} on {device}")

# %% [markdown]
# ## 1. Time one all_reduce by hand
#
# Timing a collective needs care: ranks must start together (a `barrier` first), one call is too
# noisy (repeat and take the median), and the first call pays one-off set-up costs (warm up).
#
# **Predict:** an all_reduce of 4 MiB on a link of 1 GB/s. How many milliseconds? (A ring
# all_reduce on 2 ranks sends each byte once each way: about *n* bytes per rank.)

# %%
%%distributed
import time, statistics
x = torch.ones(1 << 20)                      # 2**20 float32 values = 4 MiB
for _ in range(3):                           # warm-up
    dist.all_reduce(x)
times_ms = []
for _ in range(20):
    dist.barrier()
    t0 = time.perf_counter()
    dist.all_reduce(x)
    times_ms.append((time.perf_counter() - t0) * 1e3)
median_ms = statistics.median(times_ms)
print(f"4 MiB all_reduce: median {median_ms:.2f} ms over 20 calls -> algbw "
      f"{4 * 2**20 / median_ms / 1e6:.2f} GB/s")

# %% [markdown]
# At 1 GB/s, 4 MiB would take about 4.2 ms. Compare with what you measured. Here the "network" is
# loopback on one machine: memory copies between two processes that share a few CPU cores, so
# it moves on the order of 1 GB/s. NVLink between two H100s moves 450 GB/s per direction
# (datasheet peak; every hardware number in these lessons has its source in `docs/hardware.md`).

# %% [markdown]
# ## 2. The collective benchmark: bandwidth against message size
#
# `collective_benchmark` does the same loop for several collectives and sizes on the ranks you
# started, and reports two bandwidths as nccl-tests defines them:
# - **algbw** = bytes / time, what your program experiences;
# - **busbw** = algbw × a factor (2(n−1)/n for all_reduce), comparable to the link's peak
#   whatever the number of ranks.

# %%
import kit
from kit.experiments import collective_benchmark
from kit.plots import bandwidth

coll = collective_benchmark(cluster=kit.current_cluster(), ops=["all_reduce", "all_gather", "broadcast"],
                            iters=8)
ar = next(r for r in coll if r["op"] == "all_reduce")
fit = ar["fit"]
print(f"all_reduce fit: alpha = {fit['alpha_us']:.0f} us per all_reduce (= 2(p-1) = 2 ring steps of "
      f"{fit['alpha_per_step_us']:.0f} us), beta = {fit['beta_gbps']:.2f} GB/s")
print(f"measured time minus the fit's, in % of the measured time: " + ", ".join(
    f"{pt['bytes'] // 1024} KiB {r:+.0f}%" for pt, r in zip(ar["points"], fit["residuals_pct"])))
bandwidth(coll, title="Which message sizes use the link well? (measured, 2 ranks)")

# %% [markdown]
# Small messages reach a tiny fraction of the bandwidth: their time is almost all latency. The
# dashed lines are the alpha-beta fit, and the residuals printed above (also drawn under the plot)
# are the test of the model: **this is where α–β meets a real link**. Two numbers describe the
# measured curve as well as the residuals say, and no better: where they reach tens of percent
# (on a shared machine they often do, at whichever sizes other jobs disturbed), the straight
# line is only an approximation there.
#
# The message size where latency and transfer cost the same,
# `n½ = α × β`, tells you how big a message must be to use the link well:

# %%
n_half_kib = ar["fit"]["alpha_us"] * 1e-6 * ar["fit"]["beta_gbps"] * 1e9 / 1024
print(f"n_1/2 = {n_half_kib:.0f} KiB: messages much smaller than this are latency-bound")

# %% [markdown]
# This is one reason DDP groups gradients into **buckets** instead of sending each parameter's
# gradient on its own: fewer, bigger messages pay the latency fewer times. The other reason is
# overlap: a bucket's all_reduce starts as soon as its gradients are ready, while backward still
# computes the rest (lesson 03). The cap is `bucket_cap_mb`, 25 MiB by default; with the default,
# the first bucket is capped at 1 MiB (so communication starts early), and a single gradient
# larger than the cap gets a bucket of its own (torch's `_BucketCapacityConfig` in
# `torch/nn/parallel/distributed.py`). The kit passes `bucket_cap_mb=25` explicitly, and an
# explicit cap applies to the first bucket too, so below you see one bucket (lesson 03 shows both).

# %% [markdown]
# ## 3. Compute versus communication in a real training step
#
# Now a real model: a small MLP trained with DistributedDataParallel (DDP) on both ranks. The kit
# times each phase of the step: forward, backward, optimizer, and the gradient all_reduce (the
# part of it that backward did not hide is *exposed*: it lengthens the step).

# %%
from kit.experiments import ExperimentConfig, run

base = ExperimentConfig(strategy="ddp", workload="mlp", batch_size=32, steps=8, warmup_steps=2)
loopback = run(base, cluster=kit.current_cluster())
s = loopback["summary"]
compute_ms = s["fwd_ms"] + s["bwd_ms"] + s["opt_ms"]
buckets = [b["bytes"] for b in loopback["comm"]["buckets"]]       # what DDP all_reduced per step
print(f"gradients per step: {s['bytes_per_step'] / 2**20:.1f} MiB in {len(buckets)} bucket(s)")
print(f"compute {compute_ms:.1f} ms; all_reduce {s['comm_ms']:.1f} ms, of which "
      f"{s['comm_exposed_ms']:.1f} ms exposed = {s['comm_overhead_pct']:.0f}% of the {s['step_ms']:.1f} "
      f"ms step")

# %% [markdown]
# ## 4. Compute against communication: a roofline
#
# Which of the two dominates is set by two rates. One data-parallel step of a model with *P*
# parameters and *B* samples (or tokens) per rank costs 6·P·B FLOP: 2 per parameter per sample
# forward, 4 backward. But DDP's gradient all_reduce can only overlap the **backward** pass: no
# gradient exists during the forward, and the next forward needs the updated weights. So the
# compute that can hide it is the backward's, and on *p* ranks
#
#     T_bwd  = 4 · P · B / F            F: FLOP/s of one device
#     T_comm = 2(p−1)/p · b · P / W     b: bytes per gradient value, W: link bandwidth (bytes/s)
#
# *P* cancels: backward can hide the all_reduce (if they overlap perfectly) only when
#
#     B ≥ B* = 2(p−1)/p · (b / 4) · F / W
#
# In these lessons **B\*** always means this: the batch per device at which backward compute
# and the gradient all_reduce take equal time. Below it, the step waits for the network however
# well it overlaps. It depends on one hardware ratio, **F/W**: the FLOP a device computes in the
# time its link moves one byte. (How to Scale Your Model, `training.md`, derives the same
# backward-only roofline. ZeRO-3/FSDP is different: its parameter all_gather can also hide
# behind the *forward*, lesson 06.)

# %% [markdown]
# Two cautions. *How to Scale Your Model* calls B\* a "critical batch size"; it is not the
# statistical **critical batch size** of McCandlish et al. (2018, "An empirical model of
# large-batch training"), past which a larger *global* batch buys little extra progress per
# step. And the global batch (B × ranks) cannot grow freely: past that statistical limit, more
# samples per step stop shortening training, whatever the hardware would like.
#
# **Predict:** this CPU computes tens to a couple of hundred GFLOP/s per core (the more with
# AVX-512's fused multiply-add units) and loopback moves about 1 GB/s
# (section 2). What is F/W here, and *B\** for fp32 gradients (b = 4) on 2 ranks? Write your
# guess in the next cell before you run on.

# %%
guess_b_star = None   # your B* for this CPU, in samples per rank

# %%
%%distributed
x, w = torch.randn(256, 1024), torch.randn(1024, 1024)   # one of the MLP's layers, batch 256
for _ in range(3):
    x @ w
dist.barrier()                                            # both ranks at once, as in training
t0 = time.perf_counter()
for _ in range(20):
    x @ w
flops = 20 * 2 * 256 * 1024 * 1024 / (time.perf_counter() - t0)

# %%
F_cpu = kit.current_cluster().run("flops").values[0]      # rank 0's FLOP/s
# W: the median bus bandwidth over the sizes of a bucket or more (>= 4 MiB); one point alone would
# move B* by 2x on a shared machine (the range is printed below)
W_points = [pt["busbw_gbps"] * 1e9 for pt in ar["points"] if pt["bytes"] >= 4 * 2**20]
W_cpu = sorted(W_points)[len(W_points) // 2]

def b_star(F, W, p, b):
    """Batch per device at which backward (4 FLOP per parameter per sample) takes as long as the
    all_reduce."""
    return 2 * (p - 1) / p * b / 4 * F / W

# (setup, F FLOP/s per device, W bytes/s that carry one gradient's worth of traffic around the ring
# (one GPU's link; for 8-GPU nodes the node's 8 NICs together), ring length p, bytes per gradient).
# GPU numbers: docs/hardware.md.
rows = [("this CPU, loopback (measured)", F_cpu, W_cpu, 2, 4),
        ("8 H100 in one node, NVLink 4 (busbw 370 GB/s)", 989e12, 370e9, 8, 2),
        ("8 nodes of 8 H100, 8 NDR NICs each (400 GB/s)", 989e12, 400e9, 8, 2),
        ("  the same, NCCL's flat 64-GPU multi-rail ring", 989e12, 400e9, 64, 2),
        ("8 nodes of 1 H100, one NDR NIC (50 GB/s)", 989e12, 50e9, 8, 2),
        ("8 nodes of 1 H100, 100 GbE (12.5 GB/s)", 989e12, 12.5e9, 8, 2)]
for name, F, W, p, b in rows:
    print(f"{name:<47} F/W = {F / W:7.0f} FLOP/byte  B* = {b_star(F, W, p, b):6.0f} samples (tokens) "
          f"per device")
print(f"\nyour guess for this CPU: {guess_b_star}; the measurement: {b_star(F_cpu, W_cpu, 2, 4):.0f} "
      f"(F = {F_cpu / 1e9:.0f} GFLOP/s, W = {W_cpu / 1e9:.2f} GB/s, the median of {len(W_points)} sizes "
      f">= 4 MiB)")
print(f"  over those sizes W ran {min(W_points) / 1e9:.2f}-{max(W_points) / 1e9:.2f} GB/s, so B* "
      f"{b_star(F_cpu, max(W_points), 2, 4):.0f}-{b_star(F_cpu, min(W_points), 2, 4):.0f}; "
      f"the fit's beta {ar['fit']['beta_gbps']:.2f} GB/s gives "
      f"{b_star(F_cpu, ar['fit']['beta_gbps'] * 1e9, 2, 4):.0f}")
print(f"per link byte an H100 computes {989e12 / 370e9 / (F_cpu / W_cpu):.0f}x more FLOP than this CPU "
      f"on NVLink")

# %% [markdown]
# That ratio is the whole story. An H100 computes far more per byte its links move than this
# CPU does (peak bf16 FLOP/s from the datasheet, bf16 gradients): inside a node, data
# parallelism needs a couple of thousand tokens per GPU per step before backward can hide the
# all_reduce.

# %% [markdown]
# Across nodes, two rows model the same 8-node ring differently, and the difference is topology:
# - **One 50 GB/s NIC per rank** (one GPU per node, a flat ring): every GPU's whole gradient
#   crosses its own NIC. That is the right model only for one-GPU nodes.
# - **8 H100 per node with 8 NDR NICs** (a DGX/HGX H100 node: node egress 8 × 50 = 400 GB/s) is
#   what real clusters are. The collective is **hierarchical** (reduce-scatter over NVLink inside
#   the node, so each GPU holds 1/8 of the node's gradient; all_reduce that 1/8 across nodes
#   through its own NIC, a ring of p = 8 nodes; all_gather inside the node) or NCCL runs one flat
#   ring over all 64 GPUs with one ring channel per NIC (**multi-rail**). Either way the node's
#   eight NICs carry the gradient together, and the cross-node cost is about gradient bytes /
#   400 GB/s. The two differ in the ring's factor 2(p-1)/p: 2·7/8 for the 8-node step of the
#   hierarchical scheme, 2·63/64 for the flat 64-GPU ring, so B\* ≈ 2,160 to ≈ 2,430 (the two
#   rows above); the hierarchical scheme also pays its reduce-scatter and all-gather over NVLink.
#   *How to Scale Your Model* (`gpus.md`) gives the large-ring limit for data parallel across
#   nodes: about 989e12 / 400e9 ≈ 2,475 tokens per GPU.
#
# So on a well-built cluster, crossing nodes costs data parallelism about as much as NVLink does,
# while a cheap network (100 GbE, last row) needs tens of thousands of tokens per GPU. This is why
# people pay for NVLink and InfiniBand, why collectives follow the topology, and why the next
# lessons hide communication (overlap) and send less of it.

# %% [markdown]
# It is also why the kit has an **emulated link**: we cannot make this CPU tens of times faster,
# but we can make its link slower, so that a CPU step gets a GPU cluster's balance of compute and
# communication.

# %% [markdown]
# ## 5. Predict other networks, then measure one (emulated)
#
# DDP sent the buckets printed in section 3. A ring all_reduce of *n* bytes on *p* ranks does
# p−1 reduce-scatter steps and p−1 all-gather steps, and **every step pays the link's latency**:
#
#     t = base + 2(p−1) · α_hop + 2(p−1)/p · n / β(n)
#
# so latency grows with the number of ranks (2 α_hop on 2 ranks, 14 α_hop on 8). `β(n)` is below
# the link's peak for mid-sized messages. `link_allreduce_s` is this formula with each
# preset's numbers (sources in `docs/hardware.md`), the same one the emulated link charges.

# %%
from kit.experiments import LINKS, alpha_beta_allreduce_s, link_allreduce_s

p = 2
predicted_ms = {name: sum(1e3 * link_allreduce_s(name, n, p) for n in buckets) for name in LINKS}
for name, ms in predicted_ms.items():
    print(f"{name:>10}: predicted all_reduce {ms:8.3f} ms per step  ({ms / compute_ms * 100:5.1f}% of "
          f"this CPU's compute)")

# %% [markdown]
# Read the printed column: the same gradients are predicted to take about a tenth of a
# millisecond on NVLink and milliseconds on Ethernet. (These are the formula's numbers, not
# measurements; `docs/hardware.md` shows where each preset's constants come from.)
#
# The virtual interconnect runs the real all_reduce, then lets each bucket also cross an emulated
# link: it **sleeps** for the time this same formula charges. Runs that use it are labelled
# **emulated**.
#
# 10 GbE would add about 11 ms per step, the size of this shared machine's step-to-step noise,
# so we emulate a slower link that still exists in offices and cheap clusters: **1 Gb Ethernet**,
# 0.125 GB/s (line rate, `docs/hardware.md`), with the same 14 µs per hop.
#
# **Predict:** how many milliseconds will the all_reduce grow per step? Write it down first.

# %%
guess_grow_ms = None   # your prediction, ms per step
slow = base.replace(interconnect="custom", link_alpha_us=14.0, link_gbps=0.125)
pred_slow_ms = sum(1e3 * alpha_beta_allreduce_s(n, p, 14.0, 0.125) for n in buckets)

# %% tags=["verdict:slower"]
from kit.experiments import compare, conclude
from kit.plots import step_breakdown

# 9 pairs of shorter runs: the verdict then tolerates one pair that a busy spell of this shared
# machine spoilt (its interval is the 2nd to 8th pair ratio; with 6 pairs every pair must agree)
cmp = compare(base, slow, cluster=kit.current_cluster(), steps=4, repeats=9)
grown = cmp["b"]["spread"]["comm_ms"]["median"] - cmp["a"]["spread"]["comm_ms"]["median"]
print(f"all_reduce grew by {grown:.0f} ms per step (medians); the formula charges {pred_slow_ms:.0f} "
      f"ms; your guess: {guess_grow_ms}")
# "by about the link's time" is a claim about size, so it is checked, not only the direction.
assert 0.6 * pred_slow_ms <= grown <= 1.4 * pred_slow_ms, \
    f"the all_reduce grew by {grown:.0f} ms, not about {pred_slow_ms:.0f} ms: the machine is busy, " \
    "rerun this cell"
conclude(cmp, slower="On 1 GbE the same step is slower, and the all_reduce grew by about the link's "
                     "time (within 40%, checked above).",
         same="This machine's noise hid the link's time in this run.",
         faster="The emulated link made no difference here: something is wrong, rerun.")
cmp["a"]["label"], cmp["b"]["label"] = "loopback", "emulated 1 GbE"
step_breakdown([cmp["a"], cmp["b"]], title="Same model, two networks: where does the step go?")

# %% [markdown]
# The all_reduce grew by about what the formula charges. Be careful what that shows: the
# emulator *sleeps* the formula's time, so this agreement only shows that the kit adds what it
# says it adds, on top of a real all_reduce, and that backward hides little of it (with one or two
# buckets, most of the all_reduce starts after backward is done, lesson 03). It is no evidence
# that α and β predict a real network: that test was section 2, where the fit met a measured
# curve. On a GPU cluster, `collective_benchmark` run there is the same test.

# %% [markdown]
# ## Exercises

# %% [markdown]
# **1.** All_reduce with 8 ranks measures algbw = 100 GB/s. What is busbw?
#
# <details><summary>Answer</summary>
#
# busbw = algbw × 2(n−1)/n = 100 × 14/8 = 175 GB/s.
# </details>

# %% [markdown]
# **2.** A link has α = 20 µs and β = 50 GB/s (InfiniBand NDR's bandwidth). What is n½, and is
# one 64 KiB message latency-bound? And a ring all_reduce of 64 KiB over 8 ranks on this link?
#
# <details><summary>Answer</summary>
#
# n½ = 20e-6 s × 50e9 B/s = 1 MB. One 64 KiB message (65,536 B): transfer 65,536 / 50e9 = 1.31
# µs, total 21.3 µs, of which 20 / 21.3 = 94% is latency: latency-bound. The ring all_reduce pays
# 2(p−1) = 14 latencies, 280 µs, and moves 2 × 7/8 × 65,536 B = 114,688 B, 2.3 µs: 99% latency.
# </details>

# %% [markdown]
# **3.** A model has 1 billion parameters with fp32 gradients. Per step, how long is a ring
# all_reduce over 8 GPUs on 100 GbE (12.5 GB/s)? And on NVLink at 370 GB/s (measured, not peak)?
#
# <details><summary>Answer</summary>
#
# n = 4 GB; 2 × 7/8 × 4e9 = 7e9 bytes per rank. 100 GbE: 7e9 / 12.5e9 = 0.56 s. NVLink:
# 7e9 / 370e9 = 19 ms. The 14 latencies (a few hundred µs at most) do not matter at this size.
# </details>

# %% [markdown]
# **4.** With the roofline of section 4: an H100 (989 TFLOP/s bf16) trains with bf16 gradients on
# 8 GPUs over 100 GbE. How many tokens per GPU per step does compute need to hide the all_reduce?
#
# <details><summary>Answer</summary>
#
# Backward (4 FLOP per parameter per token) must hide the all_reduce:
# B* = 2 × 7/8 × 2/4 × 989e12 / 12.5e9 = 0.875 × 79,120 ≈ 69,000 tokens per GPU per step. Over
# NVLink (370 GB/s): 0.875 × 2,673 ≈ 2,340. Across 8 nodes of 8 H100 with 400 GB/s of node egress:
# hierarchical (a ring of 8 nodes) 0.875 × 2,473 ≈ 2,160; NCCL's flat multi-rail ring over the 64
# GPUs 2 × 63/64 × 2/4 × 2,473 = 0.984 × 2,473 ≈ 2,430. Had you let the forward hide it too (6
# instead of 4), every answer would be 1.5 times too small.
# </details>

# %% [markdown]
# ## Check against a reference
#
# The collectives we just timed must also be *correct*: all_reduce of random tensors equals the
# sum one process computes, and all_gather returns every rank's part in rank order.

# %%
%%distributed
g = torch.Generator().manual_seed(0)
parts = [torch.randn(1000, generator=g) for _ in range(world_size)]   # every rank builds all parts
mine = parts[rank].clone()
dist.all_reduce(mine)
assert torch.allclose(mine, sum(parts), atol=1e-5)
gathered = [torch.empty(1000) for _ in range(world_size)]
dist.all_gather(gathered, parts[rank])
assert all(torch.equal(a, b) for a, b in zip(gathered, parts))
"check passed"
