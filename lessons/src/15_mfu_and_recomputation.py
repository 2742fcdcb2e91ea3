# %% [markdown]
# # 15 · MFU: from one device's roofline to a cluster's
#
# Lesson 13's planner printed a predicted MFU (and HFU) beside its best layout. This lesson takes that
# number apart on the device in front of you: how fast can it multiply at all (its **peak**), which
# operations can reach that peak (the **roofline**), how many floating-point operations a training
# step really needs (**model FLOPs**) and how many it runs (**hardware FLOPs**: recomputation runs
# some twice), and what share of the peak your own steps reach. Then it trades memory for time with
# **selective** and **full activation recomputation**, measured beside Korthikanti et al.'s formulas,
# and reads the planner's MFU knowing what it counts.
#
# Words used below:
# - **FLOP**: one floating-point operation; a multiply-add is 2. **FLOP/s**: per second.
# - **Peak**: the most FLOP/s the hardware can do, from its clock and its vector units.
# - **Arithmetic intensity** (AI): FLOPs per byte moved to or from memory.
# - **MFU**, model FLOPs utilisation: the FLOPs the model needs per step / (step time × peak).
#   **HFU**, hardware FLOPs utilisation: the same with the FLOPs actually run (recomputation included).
# - **Recomputation** (activation checkpointing): keep fewer activations in forward and run that part
#   of forward again in backward.
#
# Everything here runs in this notebook's own process, on one core (`torch.set_num_threads(1)`), so
# the numbers are one core's. *On Colab?* Run the next cell first; elsewhere it does nothing.

# %%
import sys
if "google.colab" in sys.modules:
    %pip install -q "distributed-kit @ git+https://github.com/distributed-kit/distributed-kit"

# %%
%matplotlib inline
import math
import time

import torch

torch.set_num_threads(1)   # one core: the peak below is one core's

# %% [markdown]
# ## 1. The peak of one core
#
# A core's peak is its clock × the FLOPs it can start per cycle. An x86 core with AVX-512 has
# 512-bit vector registers, 16 fp32 lanes; a fused multiply-add (FMA) does 2 FLOPs per lane; many
# server cores have two FMA units. So 2 units × 16 lanes × 2 = 64 fp32 FLOP per cycle (AVX2: 8 lanes,
# 32 per cycle). The next cell reads the vector units and the clock from `/proc/cpuinfo`.
#
# **Predict:** at 2.6 GHz with AVX-512, one core's fp32 peak in GFLOP/s?

# %%
guess_peak_gflops = None

# %%
import pathlib

info = pathlib.Path("/proc/cpuinfo").read_text() if pathlib.Path("/proc/cpuinfo").exists() else ""
flags = set(next((l.split(":", 1)[1].split() for l in info.splitlines() if l.startswith("flags")), []))
mhz = next((float(l.split(":", 1)[1]) for l in info.splitlines() if l.startswith("cpu MHz")), None)
lanes = 16 if "avx512f" in flags else 8 if "avx2" in flags else 4
fma_units = 2   # an assumption: most server cores have 2 (some have 1; then halve the peak)
peak = mhz * 1e6 * fma_units * lanes * 2 if mhz else None
model_name = next((l.split(":", 1)[1].strip() for l in info.splitlines() if l.startswith("model name")),
                  "unknown CPU")
print(f"your guess: {guess_peak_gflops}")
print(f"{model_name}: {'AVX-512' if lanes == 16 else 'AVX2' if lanes == 8 else 'SSE'}, {mhz} MHz")
print(f"nominal fp32 peak of one core: {fma_units} x {lanes} x 2 x {mhz} MHz = "
      f"{peak / 1e9:.0f} GFLOP/s" if peak
      else "no /proc/cpuinfo here: the peak below is the best measured rate")

# %% [markdown]
# This peak is **nominal**: the clock `/proc/cpuinfo` reports can be the base clock (a core may
# turbo above it, or slow down when all cores run vector code), and the FMA units are assumed. If
# a matmul below beats it, the core ran above that clock. MFU is defined against such a stated
# peak (a GPU's datasheet number), not against the best rate anyone measured. A
# GPU datasheet gives the same kind of number: an H100 SXM's dense bf16 peak is 989 TFLOP/s
# (`docs/hardware.md`), about 6,000 of these cores.
#
# ## 2. The roofline: which operations can reach the peak
#
# An operation also has to move its operands. A core that computes F FLOP/s and reads memory at W
# bytes/s can do at most min(F, AI × W) FLOP/s on an operation of arithmetic intensity AI: that is
# the **roofline** (Williams, Waterman and Patterson, CACM 2009). Below the **ridge point** AI = F/W
# an operation is **memory-bound**; above it, **compute-bound**.
#
# - Adding two vectors of n floats: n FLOPs, 12n bytes (read 2, write 1): AI = 1/12.
# - Multiplying two n × n matrices: 2n³ FLOPs, at least 3 × 4n² bytes: AI = n/6, growing with n.
#
# **Predict:** from which n on is an n × n matmul compute-bound on this core, if memory delivers
# about 10 GB/s?

# %%
guess_ridge_n = None

# %% [markdown]
# The next cell measures both. This machine is shared: other processes take the core away for
# milliseconds at a time, and wall-clock time counts those gaps. So the timings here use
# `time.thread_time()`, the CPU time of this thread (the kernel's per-thread clock): it advances
# only while the thread runs. Each rate is the fastest of 5 repeats, each long enough (20 ms of
# CPU) to time: sharing the caches and the memory bus with others only ever slows a repeat down.

# %%
def best_s(fn, reps=5, min_s=0.02):
    """CPU seconds per call: the fastest of `reps` repeats, each of enough calls to last min_s."""
    fn()
    calls = 1
    while True:
        t0 = time.thread_time()
        for _ in range(calls):
            fn()
        if time.thread_time() - t0 > min_s:
            break
        calls *= 2
    best = float("inf")
    for _ in range(reps):
        t0 = time.thread_time()
        for _ in range(calls):
            fn()
        best = min(best, (time.thread_time() - t0) / calls)
    return best


matmuls = {}
for n in (16, 32, 64, 128, 256, 512, 1024):
    A, B, C = torch.randn(n, n), torch.randn(n, n), torch.empty(n, n)
    matmuls[n] = 2 * n ** 3 / best_s(lambda: torch.mm(A, B, out=C))
adds = {}
for n in (1 << 14, 1 << 18, 1 << 24):              # 192 KiB, 3 MiB, 192 MiB moved per add
    x, y, z = torch.randn(n), torch.randn(n), torch.empty(n)
    adds[n] = 12 * n / best_s(lambda: torch.add(x, y, out=z))    # bytes per second
W = adds[1 << 24]                                  # the largest: far beyond the caches
peak = peak or max(matmuls.values())
print(f"your guess: n = {guess_ridge_n}")
for n, r in matmuls.items():
    print(f"matmul {n:5d}: AI {n / 6:6.1f} FLOP/B, {r / 1e9:6.1f} GFLOP/s = {r / peak:5.1%} of the peak")
for n, bw in adds.items():
    print(f"add of {12 * n / 2**20:7.1f} MiB moved: {bw / 1e9:6.1f} GB/s")
best_n = max(matmuls, key=matmuls.get)
print(f"the best matmul, n = {best_n}, reached {matmuls[best_n] / peak:.0%} of the nominal peak"
      + (": above it, so this core runs faster than the clock /proc/cpuinfo reports (turbo)"
         if matmuls[best_n] > peak else ""))
print(f"memory bandwidth W = {W / 1e9:.1f} GB/s (the largest add); "
      f"ridge point F/W = {peak / W:.0f} FLOP/B, "
      f"an n x n matmul of n = {6 * peak / W:.0f}")

# %% [markdown]
# The question the plot answers: **where does each measured operation sit under the roofline?**

# %%
import matplotlib.pyplot as plt

fig, ax = plt.subplots(figsize=(7.5, 4))
ai = sorted([2 ** e for e in range(-5, 9)] + [peak / W])   # with the ridge: the corner where it is
ax.plot(ai, [min(peak, a * W) / 1e9 for a in ai], "-", color="black",
        label="roofline: min(peak, AI x W)")
ax.plot([n / 6 for n in matmuls], [r / 1e9 for r in matmuls.values()], "o", color="#0072B2",
        label="matmul n x n (measured)")
ax.scatter([1 / 12] * len(adds), [bw / 12 / 1e9 for bw in adds.values()], s=[20, 50, 110], marker="s",
           color="#D55E00", label="vector add (measured; larger = more MiB)")   # 0.19, 3, 192 MiB
for n, r in matmuls.items():
    ax.annotate(f"n={n}", (n / 6, r / 1e9), textcoords="offset points", xytext=(4, -10),
                fontsize="x-small")
ax.set(xscale="log", yscale="log", xlabel="arithmetic intensity (FLOP per byte)",
       ylabel="GFLOP/s (one core)")
ax.set_title("The roofline of one core: measured points under the nominal peak", fontsize="medium")
ax.legend(fontsize="small", loc="lower right")
plt.show()

# %% [markdown]
# The best matmul comes closest to the roof (printed above with its share of the nominal peak: 58% in
# our run at load 8; a few hundred to a thousand wide; which one varies from run to run on a shared machine, as the caches and the memory bus are shared too);
# the small ones sit far below it, although their AI would allow more: the roofline is an upper bound, and a 16 × 16 matmul is mostly the cost of the call itself
# (microseconds of Python and dispatch for a few thousand FLOPs). The adds that fit in the caches
# move data far faster than the one that does not: "memory" is a hierarchy, and W above is its
# slowest level, so those smaller adds sit *above* the line drawn with W: a roof drawn with the cache's
# bandwidth would bound them. On this machine other processes share the memory bus, so W varies from run to run.
#
# A transformer's big matrix multiplies have AI in the hundreds to thousands on a GPU (for an
# m × k by k × n product, AI ≈ 1/(2(1/m + 1/k + 1/n)) in bf16): they are compute-bound, and the
# softmax, the norms and the element-wise ops are memory-bound. That is why MFU counts only the
# matmuls: they are where the FLOPs are, and the rest is time without FLOPs.
#
# ## 3. Model FLOPs and hardware FLOPs of a training step
#
# A small GPT: 2 blocks, h = 128, 4 heads, sequences of s = 128 tokens, 4 sequences per step, a
# vocabulary of 256. Its attention is written out (`q @ kᵀ`, softmax, `@ v`) so that every FLOP
# and every saved tensor shows. Per token, a training step needs (Kaplan et al. 2020; PaLM,
# Chowdhery et al. 2022, App. B):
# - **6 FLOPs per weight** that multiplies: 2 in forward (a multiply-add) and 4 in backward (the
#   gradient of the input and of the weight);
# - **12·L·h·s** for attention: q·kᵀ and the weighted sum of v are 2·s·h FLOPs each per token and
#   layer in forward, twice that in backward. (Counted for all s² pairs, as PaLM does, although a
#   causal mask uses only half of them.)
#
# So **model FLOPs per token = 6N + 12·L·h·s**, with N the weights of the `Linear` layers (the
# embedding is a lookup, not a multiply). Recomputation adds **hardware FLOPs**: with **full**
# recomputation each block's forward runs again in backward (2·N_blocks + 4·L·h·s more per token);
# with **selective** recomputation (Korthikanti et al., "Reducing Activation Recomputation in Large
# Transformer Models", 2022) only the attention core runs again (4·L·h·s more).
#
# torch counts FLOPs itself: `torch.utils.flop_counter.FlopCounterMode` sees every matrix multiply
# of forward and backward, recomputed ones included.
#
# **Predict:** by what factor does full recomputation raise this step's FLOPs?

# %%
guess_full_factor = None

# %%
import torch.nn.functional as F
from torch import nn
from torch.utils.checkpoint import checkpoint
from torch.utils.flop_counter import FlopCounterMode

L, h, a, s, b, V = 2, 128, 4, 128, 4, 256


def attention_core(q, k, v, mask):
    """softmax(q kᵀ / √d + mask) v: the part selective recomputation runs again."""
    return torch.softmax(q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1]) + mask, dim=-1) @ v


class Block(nn.Module):
    def __init__(self):
        super().__init__()
        self.ln1, self.qkv, self.proj = nn.LayerNorm(h), nn.Linear(h, 3 * h), nn.Linear(h, h)
        self.ln2, self.fc1, self.fc2 = nn.LayerNorm(h), nn.Linear(h, 4 * h), nn.Linear(4 * h, h)
        self.recompute = "none"

    def forward(self, x, mask):
        q, k, v = self.qkv(self.ln1(x)).view(b, s, 3, a, h // a).permute(2, 0, 3, 1, 4)
        if self.recompute == "selective":        # keep q, k, v; drop the s x s scores, run them again
            o = checkpoint(attention_core, q, k, v, mask, use_reentrant=True)
        else:
            o = attention_core(q, k, v, mask)
        x = x + self.proj(o.transpose(1, 2).reshape(b, s, h))
        return x + self.fc2(F.gelu(self.fc1(self.ln2(x))))


class GPT(nn.Module):
    def __init__(self):
        super().__init__()
        self.emb, self.blocks = nn.Embedding(V, h), nn.ModuleList(Block() for _ in range(L))
        self.ln, self.head = nn.LayerNorm(h), nn.Linear(h, V)
        self.register_buffer("mask", torch.full((s, s), float("-inf")).triu(1))   # causal
        self.recompute = "none"

    def body(self, x):
        for blk in self.blocks:
            blk.recompute = self.recompute
            # full: keep only each block's input, run the whole block again in backward
            if self.recompute == "full":
                x = checkpoint(blk, x, self.mask, use_reentrant=True)
            else:
                x = blk(x, self.mask)
        return x

    def forward(self, idx):
        return self.head(self.ln(self.body(self.emb(idx))))


torch.manual_seed(0)
gpt = GPT()
idx, target = torch.randint(0, V, (b, s)), torch.randint(0, V, (b, s))


def train_step(mode):
    gpt.recompute = mode
    gpt.zero_grad(set_to_none=True)
    F.cross_entropy(gpt(idx).view(-1, V), target.view(-1)).backward()


N = sum(m.weight.numel() for m in gpt.modules() if isinstance(m, nn.Linear))
N_blocks = sum(m.weight.numel() for blk in gpt.blocks for m in blk.modules() if isinstance(m, nn.Linear))
tokens = b * s
model_flops = (6 * N + 12 * L * h * s) * tokens                   # per step
extra = {"none": 0, "selective": 4 * L * h * s * tokens, "full": (2 * N_blocks + 4 * L * h * s) * tokens}
counted = {}
for mode in ("none", "selective", "full"):
    with FlopCounterMode(display=False) as fc:
        train_step(mode)
    counted[mode] = fc.get_total_flops()
print(f"your guess: {guess_full_factor}")
print(f"N = {N:,} weights that multiply (blocks {N_blocks:,}, head {N - N_blocks:,}); "
      f"{tokens} tokens per step")
for mode, c in counted.items():
    print(f"{mode:>9}: counted {c / 1e9:.4f} GFLOP per step; formula model {model_flops / 1e9:.4f} "
          f"+ recompute {extra[mode] / 1e9:.4f} = {(model_flops + extra[mode]) / 1e9:.4f}; "
          f"x{c / counted['none']:.3f} of none")

# %% [markdown]
# The count and the formula agree to the FLOP. Full recomputation runs the blocks' forward twice:
# forward is a third of a step's FLOPs, so the step grows by about a third of the blocks' share
# (here ×1.31); selective recomputation only the attention core (×1.04 here, where s is large next
# to h; in a 70B model with s = 4,096 and h = 8,192 it is about 2%).
#
# ## 4. MFU and HFU of your own steps
#
# Now time the three. Interleaved, as `compare` does: each round runs none, selective and full once,
# in a rotated order, 9 rounds; each round's time is the median of 3 steps. Each step is timed both
# ways: wall-clock (what MFU means on a device of your own) and this thread's CPU time (what the
# step cost while it held the core; on this shared machine the difference is time spent waiting
# for the core).
#
# **Predict:** this core's MFU without recomputation: 5%, 20%, 50%?

# %%
guess_mfu = None

# %%
from statistics import median

modes = ["none", "selective", "full"]
step_ms = {m: [] for m in modes}                   # wall clock, per round
cpu_ms = {m: [] for m in modes}                    # this thread's CPU time, per round
for m in modes:
    train_step(m)                                   # warm-up
for rnd in range(9):
    for m in modes[rnd % 3:] + modes[:rnd % 3]:    # rotate who goes first
        wall, cpu = [], []
        for _ in range(3):
            t0, c0 = time.perf_counter(), time.thread_time()
            train_step(m)
            wall.append(time.perf_counter() - t0)
            cpu.append(time.thread_time() - c0)
        step_ms[m].append(1e3 * median(wall))
        cpu_ms[m].append(1e3 * median(cpu))
print(f"your guess: {guess_mfu}")
mfu, hfu = {}, {}
for m in modes:
    t, c = median(step_ms[m]) / 1e3, median(cpu_ms[m]) / 1e3
    mfu[m], hfu[m] = model_flops / t / peak, (model_flops + extra[m]) / t / peak
    print(f"{m:>9}: step {1e3 * t:6.1f} ms wall, {1e3 * c:6.1f} ms on the CPU (medians of 9 rounds); "
          f"MFU {mfu[m]:5.1%}, HFU {hfu[m]:5.1%} (wall); "
          f"on the CPU's time MFU {model_flops / c / peak:5.1%}, "
          f"HFU {(model_flops + extra[m]) / c / peak:5.1%}")

# %% [markdown]
# MFU is lower than the big matmuls' share of the peak in section 2: this step's matmuls are small
# (128 × 128 weights), and the softmax, the norms, GELU, autograd's bookkeeping and Python run
# between them without FLOPs. HFU counts the recomputed FLOPs as useful work, so it
# is never below MFU: a run can raise its HFU by recomputing more and still train no faster. That is
# why papers report MFU (PaLM introduced it for exactly this reason).
#
# Is full recomputation slower, on this machine? The same verdict as `compare`, on the 9 rounds'
# paired CPU times per step (the wall-clock times carry the waits for the core, which on this
# shared machine can be larger than the extra forward):

# %% tags=["verdict:slower"]
from kit.experiments import conclude, paired_verdict, summary_line

full_vs_none = paired_verdict(cpu_ms["none"], cpu_ms["full"])
full_vs_none["summary"] = summary_line(full_vs_none, "no recomputation", "full recomputation")
conclude(full_vs_none,
         slower="Full recomputation makes the step slower: it runs the blocks' forward twice.",
         same="This machine's noise hid the extra forward in this run.",
         faster="Full recomputation measured faster: something disturbed the runs, "
                "rerun this section.");

# %%
sel_vs_none = paired_verdict(cpu_ms["none"], cpu_ms["selective"])
sel_vs_none["summary"] = summary_line(sel_vs_none, "no recomputation", "selective recomputation")
conclude(sel_vs_none,
         slower="Selective recomputation was slower here than its 4% more FLOPs: recomputing the "
                             "attention core also pays its softmax and its calls again.",
         same="Selective recomputation costs too little to tell apart from none on this machine.",
         faster="Selective recomputation measured faster: within this machine's noise, "
                "read it as the same.");

# %% [markdown]
# ## 5. What recomputation buys: the activations, measured beside Korthikanti's formulas
#
# Korthikanti et al. count the bytes one transformer layer keeps for backward: with fp16, dropout
# and no recomputation **s·b·h·(34 + 5·a·s/h)**; with selective recomputation **34·s·b·h** (the
# 5·a·s²·b term is the s × s attention scores, softmax output and dropout mask); with full
# recomputation **2·s·b·h** (only the layer's input). Our model has no dropout and keeps fp32 (4
# bytes, not 2): the same terms give 64·s·b·h + 4·a·s²·b, 64·s·b·h and 4·s·b·h bytes per layer,
# plus the LayerNorms' mean and inverse deviation (2 floats per token each).
#
# **Predict:** for this model (L = 2, s = 128, b = 4, h = 128, a = 4), the bytes kept by the blocks
# with each mode?

# %%
guess_saved = {"none": None, "selective": None, "full": None}

# %% [markdown]
# The next cell measures them with `torch.autograd.graph.saved_tensors_hooks`: autograd calls
# `pack` for every tensor it keeps for backward. Counting each distinct storage once (a view shares
# its base's memory) and leaving out the parameters and the mask gives the bytes the blocks hold.

# %%
class SavedBytes:
    """Bytes of the distinct storages autograd keeps, parameters and buffers excluded."""

    def __init__(self, model):
        self.skip = {t.untyped_storage().data_ptr() for t in [*model.parameters(), *model.buffers()]}
        self.kept = {}

    def pack(self, t):
        st = t.untyped_storage()
        if st.data_ptr() not in self.skip:
            self.kept[st.data_ptr()] = st.nbytes()
        return t

    def total(self):
        return sum(self.kept.values())


sbh = s * b * h
formula = {"none": L * (64 * sbh + 4 * a * s * s * b), "selective": L * 64 * sbh, "full": L * 4 * sbh}
ln_stats = L * 2 * 2 * s * b * 4                    # 2 LayerNorms x (mean, 1/std) per token, fp32
saved = {}
for mode in modes:
    gpt.recompute = mode
    meter = SavedBytes(gpt)
    x = gpt.emb(idx).detach().requires_grad_()      # the blocks only: what recomputation changes
    with torch.autograd.graph.saved_tensors_hooks(meter.pack, lambda t: t):
        gpt.body(x)
    saved[mode] = meter.total()
print(f"your guesses: {guess_saved}")
for mode in modes:
    stats = ln_stats if mode != "full" else 0
    print(f"{mode:>9}: measured {saved[mode]:10,} bytes; formula {formula[mode]:10,} "
          f"+ LayerNorm statistics "
          f"{stats:,} = {formula[mode] + stats:10,}; {saved[mode] / saved['none']:.0%} of none")

# %% [markdown]
# Measured equals the formula. The question the next plot answers: **what does each mode cost in
# time, and what does it save in memory?**

# %%
# constrained layout: the figure's title sits above the panels' titles, and no text leaves the figure
fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(9.6, 3.8), layout="constrained")
colors = {"none": "#0072B2", "selective": "#009E73", "full": "#D55E00"}
ax1.bar(modes, [saved[m] / 2**20 for m in modes], color=[colors[m] for m in modes])
ax1.set_ylabel("MiB kept for backward (the 2 blocks)")
ax1.set_title("Activations kept (measured)", fontsize="medium")
ax1.margins(y=0.12)                                    # room for the numbers above the bars
for m in modes:
    ax1.annotate(f"{saved[m] / 2**20:.2f}", (m, saved[m] / 2**20), ha="center", va="bottom",
                 fontsize="small")
for i, m in enumerate(modes):
    ax2.plot([i] * len(cpu_ms[m]), cpu_ms[m], "o", color=colors[m], alpha=0.5)
    ax2.plot([i - 0.2, i + 0.2], [median(cpu_ms[m])] * 2, "-", color="black")
ax2.set_xticks(range(3), modes)
ax2.set(ylabel="CPU ms per step (one core)", ylim=(0, None))
ax2.set_title(f"Step time (measured): {len(cpu_ms['none'])} rounds, median as a bar", fontsize="medium")
fig.suptitle("Recomputation trades memory for time", fontsize="large")
plt.show()

# %% [markdown]
# At this size selective recomputation removes the s × s scores (a fifth of the blocks' memory here,
# more as s grows: the 5·a·s/h term is 160 at s = 4,096 with a = 64 and h = 8,192, next to 34) for
# a few percent more FLOPs, which is why the planner tries a selective variant before full recomputation
# when a layout does not fit without one. Full recomputation keeps
# almost nothing (one input per block) and pays a whole forward of the blocks.
#
# ## 6. The planner's MFU, read knowing what it counts
#
# The planner predicts a step time for each layout from the same FLOP count, 6N + 12·L·h·s per
# token, with every matmul priced at a share of the dense bf16 peak that depends on how wide the
# layer is on one GPU (`theory/gemm_efficiency.py`; an assumption, not a measurement), plus the
# communication it cannot hide. Its **MFU** divides the *model* FLOPs by that time; its **HFU** the
# FLOPs it runs, recomputation included. Each layout recomputes only as much as it needs to fit:
# none, then a selective kind (`op`, torchtitan's per-operation selective recomputation; `selective`,
# Megatron-LM's, the attention core as in section 3), then full. Llama-3 70B's top layout on 1,024
# GPUs fits without any, so its HFU equals its MFU; fix `recompute="full"` to see them part.

# %%
from kit.experiments import plan

p = plan("llama3-70b", nodes=128, gpus_per_node=8, accelerator="h100", seq_len=4096)
top = p.layouts[0]
m70 = p.model
per_token = 6 * m70.active_params() + 12 * m70.layers * m70.hidden * 4096
print(f"top layout: {top.name()}; step {top.step_s:.2f} s; "
      f"matmuls priced at {top.time.matmul_efficiency:.0%} "
      f"of the peak (predicted)")
print(f"model FLOPs per token {per_token / 1e9:.0f} GFLOP (6N + 12·L·h·s); "
      f"MFU {top.mfu:.1%}, HFU {top.time.hfu:.1%}: the recompute ({top.config.recompute}) "
      f"runs {top.time.hfu / top.mfu - 1:.1%} more FLOPs than the model needs")

# %% [markdown]
# Two things to keep apart when you read a published MFU, or the planner's:
# - **What it counts.** 6N + 12·L·h·s with or without the attention term, with the full s² or the
#   causal half, with or without recomputation: Megatron-LM's papers report HFU-like numbers that
#   include recomputation (Narayanan et al. 2021), PaLM reports MFU. Two runs can only be compared
#   counted the same way.
# - **What is measured.** The planner's matmul efficiency is an assumption; only a measured step time on the real
#   cluster (`kit.experiments.predict` extrapolates from one) turns its MFU into a measurement.
#   Published MFUs of large dense runs are around 38-43% (Llama 3 405B on 16,384 H100s, Dubey et
#   al. 2024, Table 4) and 46% (PaLM 540B on TPU v4).
#
# ## What differs on real GPUs
#
# - The peak is the tensor cores' (989 TFLOP/s bf16 dense on an H100, 67 TFLOP/s fp32 without
#   them), and memory is HBM at 3.35 TB/s: the ridge point is about 295 FLOP per byte, so only the
#   large matmuls are compute-bound; attention's softmax and the norms are memory-bound, which is why
#   fused kernels (flash attention) matter.
# - Recomputation on a GPU costs the FLOPs above but no extra memory traffic for the kept tensors,
#   and memory, not time, is usually what forces it: the planner picks the least recomputation that
#   fits (lesson 13).
#
# ## Exercises
#
# **1.** A 7B-parameter dense model (32 layers, h = 4,096) trains on sequences of 4,096 tokens. What
# are its model FLOPs per token? What share of them is the attention term?
#
# <details><summary>Answer</summary>
#
# 6N = 42·10⁹; 12·L·h·s = 12 × 32 × 4,096 × 4,096 = 6.44·10⁹. Together 48.4 GFLOP per token; the
# attention term is 13%.
# </details>
#
# **2.** That model trains at 3,000 tokens per second per GPU on H100s (989 TFLOP/s). What is its MFU?
# With full recomputation (the blocks' forward again), what is its HFU?
#
# <details><summary>Answer</summary>
#
# MFU = 3,000 × 48.4·10⁹ / 989·10¹² = 14.7%. Full recomputation adds 2N + 4·L·h·s = 14·10⁹ + 2.15·10⁹
# = 16.1 GFLOP per token: HFU = 3,000 × 64.5·10⁹ / 989·10¹² = 19.6%.
# </details>
#
# **3.** With Korthikanti's formulas (fp16, with dropout), how many bytes does one layer of a model
# with h = 8,192, a = 64 keep at s = 4,096, b = 1 without recomputation, and with selective
# recomputation?
#
# <details><summary>Answer</summary>
#
# s·b·h = 33.5·10⁶. Without: 33.5·10⁶ × (34 + 5 × 64 × 4,096 / 8,192) = 33.5·10⁶ × 194 = 6.51 GB.
# Selective: 34 × 33.5·10⁶ = 1.14 GB, 5.7x less.
# </details>
#
# **4.** An n × n fp32 matmul on a core with F = 166 GFLOP/s and W = 10 GB/s: from which n is it
# compute-bound, by the roofline?
#
# <details><summary>Answer</summary>
#
# AI = n/6 ≥ F/W = 16.6 FLOP per byte: n ≥ 100. (Caches make smaller ones faster than W allows, and
# call overhead makes them slower than the roof: the roofline bounds, it does not predict.)
# </details>
#
# ## Check against a reference
#
# Recomputation must not change the numbers: the gradients with selective and full recomputation
# equal those without, and the FLOP counts and kept bytes equal the formulas.

# %%
grads = {}
for mode in modes:
    train_step(mode)
    grads[mode] = [p.grad.clone() for p in gpt.parameters()]
for mode in ("selective", "full"):
    for g0, g1 in zip(grads["none"], grads[mode]):
        assert torch.allclose(g0, g1, atol=1e-6), (mode, float((g0 - g1).abs().max()))
for mode in modes:
    assert counted[mode] == model_flops + extra[mode], (mode, counted[mode], model_flops + extra[mode])
    assert saved[mode] == formula[mode] + (ln_stats if mode != "full" else 0), (mode, saved[mode])
"check passed"
