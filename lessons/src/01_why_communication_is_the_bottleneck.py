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
# Small messages are latency-bound; big ones are bandwidth-bound.
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
print(f"4 MiB all_reduce: median {median_ms:.2f} ms over 20 calls -> algbw {4 * 2**20 / median_ms / 1e6:.2f} GB/s")

# %% [markdown]
# At 1 GB/s, 4 MiB would take about 4.2 ms. Compare with what you measured. Here the "network" is
# loopback on one machine: memory copies between two processes that share a few CPU cores, so
# it moves on the order of 1 GB/s. NVLink between two H100s moves 450 GB/s per direction.
#
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

coll = collective_benchmark(cluster=kit.current_cluster(), ops=["all_reduce", "all_gather", "broadcast"], iters=8)
ar = next(r for r in coll if r["op"] == "all_reduce")
print(f"all_reduce fit: alpha = {ar['fit']['alpha_us']:.0f} us, beta = {ar['fit']['beta_gbps']:.2f} GB/s")
bandwidth(coll, title="Which message sizes use the link well? (measured, 2 ranks)")

# %% [markdown]
# Small messages reach a tiny fraction of the bandwidth: their time is almost all latency. The
# dashed lines are the alpha-beta fit. The message size where latency and transfer cost the same,
# `n½ = α × β`, tells you how big a message must be to use the link well:

# %%
n_half_kib = ar["fit"]["alpha_us"] * 1e-6 * ar["fit"]["beta_gbps"] * 1e9 / 1024
print(f"n_1/2 = {n_half_kib:.0f} KiB: messages much smaller than this are latency-bound")

# %% [markdown]
# This is why DDP groups gradients into **buckets** of about 25 MB instead of sending each
# parameter's gradient on its own: fewer, bigger messages pay the latency fewer times.
#
# ## 3. Compute versus communication in a real training step
#
# Now a real model: a small MLP trained with DistributedDataParallel (DDP) on both ranks. The kit
# times each phase of the step: forward, backward, optimizer, and the gradient all_reduce.

# %%
from kit.experiments import ExperimentConfig, run

base = ExperimentConfig(strategy="ddp", workload="mlp", batch_size=32, steps=12, warmup_steps=3)
loopback = run(base, cluster=kit.current_cluster())
s = loopback["summary"]
compute_ms = s["fwd_ms"] + s["bwd_ms"] + s["opt_ms"]
print(f"gradients per step: {s['bytes_per_step'] / 2**20:.1f} MiB")
print(f"compute {compute_ms:.1f} ms, all_reduce {s['comm_ms']:.1f} ms -> comm is {s['comm_overhead_pct']:.0f}% of the step")

# %% [markdown]
# ## 4. Predict other networks, then measure them (emulated)
#
# With the alpha-beta model we can predict the all_reduce time of these gradients on real links.
# A ring all_reduce on *p* ranks sends `2(p−1)/p × n` bytes per rank:
# `t ≈ α + 2(p−1)/p × n / β`. The link numbers below are per direction, from the hardware table
# in `shared/reference/perf-theory.md`.

# %%
from kit.experiments.config import INTERCONNECTS

n_bytes, p = s["bytes_per_step"], 2
predicted_ms = {name: (alpha_us * 1e-6 + 2 * (p - 1) / p * n_bytes / (gbps * 1e9)) * 1e3
                for name, (alpha_us, gbps) in INTERCONNECTS.items()}
for name, ms in predicted_ms.items():
    print(f"{name:>10}: predicted all_reduce {ms:8.3f} ms per step  ({ms / compute_ms * 100:5.1f}% of this CPU's compute)")

# %% [markdown]
# The same gradients cost tens of microseconds on NVLink and milliseconds on Ethernet. To *feel* a
# slow network on one machine, the kit has a **virtual interconnect**: the real all_reduce runs,
# then each gradient bucket also crosses an emulated link, which adds the link's time. Runs that use it are labelled **emulated**.
#
# **Predict:** with the 10 GbE link, how much longer will a step be than on loopback?

# %%
emulated = run(base.replace(interconnect="10gbe"), cluster=kit.current_cluster())
e = emulated["summary"]
print(f"step: {s['step_ms']:.1f} ms on loopback, {e['step_ms']:.1f} ms on emulated 10 GbE")
print(f"all_reduce time grew by {e['comm_ms'] - s['comm_ms']:.1f} ms; the alpha-beta model predicted "
      f"{predicted_ms['10gbe']:.1f} ms (measured on a busy 2-core machine: expect a few ms of noise)")

from kit.plots import step_breakdown
step_breakdown([loopback, emulated], title="Same model, two networks: where does the step go?")

# %% [markdown]
# The comm bar grew by roughly the predicted amount: two numbers (α and β) predict the network
# cost of a training step. On this 2-core CPU, compute
# is slow, so loopback communication looks cheap. **On real GPUs compute is 100 to 1000 times
# faster**, so the same gradients over a cluster network become the bottleneck: this is why
# people pay for NVLink and InfiniBand, and why the next lessons are about hiding communication
# (overlap) and sending less of it.
#
# ## Exercises
#
# **1.** All_reduce with 8 ranks measures algbw = 100 GB/s. What is busbw?
#
# <details><summary>Answer</summary>
#
# busbw = algbw × 2(n−1)/n = 100 × 14/8 = 175 GB/s.
# </details>
#
# **2.** A link has α = 20 µs and β = 50 GB/s (InfiniBand NDR). What is n½, and is a 64 KiB
# message latency-bound?
#
# <details><summary>Answer</summary>
#
# n½ = 20e-6 s × 50e9 B/s = 1 MB. 64 KiB is far below: latency-bound (about 21 µs, 95% of it latency).
# </details>
#
# **3.** A model has 1 billion parameters with fp32 gradients. Per step, how long is a ring
# all_reduce over 8 GPUs on 100 GbE (12.5 GB/s)? And on NVLink at 370 GB/s (measured, not peak)?
#
# <details><summary>Answer</summary>
#
# n = 4 GB; 2 × 7/8 × 4e9 = 7 GB per rank. 100 GbE: 0.56 s. NVLink: 19 ms.
# </details>
#
# ## Check against a reference
#
# The collectives we just timed must also be *correct*: all_reduce of random tensors equals the
# sum one process computes, and the kit's busbw is algbw × 2(n−1)/n.

# %%
%%distributed
g = torch.Generator().manual_seed(0)
parts = [torch.randn(1000, generator=g) for _ in range(world_size)]   # every rank builds all parts
mine = parts[rank].clone()
dist.all_reduce(mine)
assert torch.allclose(mine, sum(parts), atol=1e-5)
"check passed"

# %%
for pt in ar["points"]:
    assert abs(pt["busbw_gbps"] - pt["algbw_gbps"] * 2 * (2 - 1) / 2) < 1e-9
print("check passed")
