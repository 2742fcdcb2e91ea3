# %% [markdown]
# # 04 · Where the memory goes
#
# A GPU has a fixed amount of memory: 16 GB on Colab's T4, 80 GB on an A100-80GB or an H100
# (`docs/hardware.md`). When a model
# does not fit, training stops with "out of memory", however many GPUs you have: plain data
# parallel (DDP) keeps a **full copy** of everything on every GPU. This lesson finds out what
# takes the memory, checks it against simple formulas, and tries the usual remedies.
#
# Training holds four kinds of tensors. With P parameters in fp32 (4 bytes each):
# - **Parameters**, the weights: 4P bytes.
# - **Gradients**, one per parameter: 4P bytes.
# - **Optimizer state**: Adam keeps two running averages per parameter (`exp_avg` and
#   `exp_avg_sq`), in fp32: 8P bytes, plus one 4-byte `step` counter per parameter tensor (a few
#   bytes; the check at the end counts them). (Plain SGD keeps none.)
# - **Activations**: tensors that forward saves because backward needs them (a layer's input,
#   for example). They grow with the batch size.
#
# The first three are the **model states**: 4P + 4P + 8P = **16P bytes** with Adam, whatever the
# batch size.
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
# ## 1. Predict, then measure: a small MLP
#
# The kit's `mlp` workload has layers 256 → 1024 → 1024 → 1024 → 1024 → 10. A `Linear(a, b)`
# has a × b weights and b biases.
#
# **Predict:** how many MiB (1 MiB = 2²⁰ bytes) of parameters, gradients and Adam state does it
# need?

# %%
guess_mib = {"params": None, "grads": None, "adam": None}   # your numbers first

# %%
P = (256 * 1024 + 1024) + 3 * (1024 * 1024 + 1024) + (1024 * 10 + 10)
MiB = 2**20
print(f"your guesses: {guess_mib}")
print(f"P = {P:,} parameters")
print(f"predicted: params {4 * P / MiB:.1f} MiB, grads {4 * P / MiB:.1f} MiB, "
      f"Adam {8 * P / MiB:.1f} MiB -> model states 16P = {16 * P / MiB:.1f} MiB")

# %% [markdown]
# Now measure. The kit trains this MLP with DDP on both ranks (32 samples per rank) and, after
# one step, counts the bytes of every parameter, every gradient, the optimizer's state and every
# tensor saved for backward. These are exact byte counts of the tensors, on CPU and GPU alike.
# (On a GPU the record also has the memory allocator's peak, `peak_mib`; on CPU it is `None`,
# because the process's memory also holds Python and torch's own libraries.)
#
# DDP keeps identical copies on both ranks, so we show rank 0.

# %%
import kit
from kit.experiments import ExperimentConfig, compare, conclude, run, sweep

PARTS = ("params_mib", "grads_mib", "optimizer_mib", "activations_mib")


def show_memory(rec):
    """Measured vs predicted MiB on rank 0, one row per kind of memory."""
    mem = rec["memory"][0]
    for part in PARTS:
        pred = mem["predicted"].get(part)
        pred_s = "    -" if pred is None else f"{pred:5.1f}"
        print(f"  {part[:-4]:<12} measured {mem[part]:5.1f} MiB, predicted {pred_s} MiB")


def rank0(records):
    """The same records with only rank 0's memory (DDP ranks hold identical copies)."""
    assert all(r["memory"][0][k] == r["memory"][1][k] for r in records for k in PARTS)
    return [{**r, "memory": r["memory"][:1]} for r in records]


mlp = ExperimentConfig(strategy="ddp", workload="mlp", batch_size=32, steps=1, warmup_steps=1)
rec = run(mlp, cluster=kit.current_cluster())
show_memory(rec)

# %% [markdown]
# Parameters and Adam state match the formula. Activations are tiny here (the kit's predicted
# value is a hand count: each `Linear` saves its input, the loss saves its log-probabilities).
#
# But the **gradients take twice the predicted memory**. The question the next plot answers:
# **which kind of memory does the formula get wrong?** Each bar is a stack of the four kinds:
# measured on the left, the formula's prediction (dotted) on the right.

# %%
from kit.plots import memory_breakdown
memory_breakdown(rank0([rec]), title="MLP with DDP: measured (left) vs formula (right), rank 0")

# %% [markdown]
# ## 2. DDP's second copy of the gradients
#
# DDP all-reduces gradients in **buckets** (lesson 03): each bucket is one flat buffer. By
# default DDP copies each `.grad` into its bucket, all-reduces the bucket, and copies the result
# back into `.grad`. So every gradient exists **twice**: once in `.grad`, once in a bucket.
#
# With `gradient_as_bucket_view=True`, each `.grad` is a **view** into the bucket buffer: a
# window onto the same memory, not a copy. The cell below counts how many separate blocks of
# memory (storages) the gradients of a 4-tensor model live in.
#
# **Predict:** how many storages with `gradient_as_bucket_view=False`, and how many with `True`?

# %%
guess_storages = {False: None, True: None}   # then compare with the ranks' printout

# %%
%%distributed
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP
for view in (False, True):
    torch.manual_seed(0)
    model = DDP(nn.Sequential(nn.Linear(64, 64), nn.ReLU(), nn.Linear(64, 10)).to(device),
                device_ids=[device.index] if device.type == "cuda" else None,
                gradient_as_bucket_view=view)
    for _ in range(2):  # DDP settles its buckets during the first step
        model(torch.randn(8, 64, device=device)).sum().backward()
    storages = {p.grad.untyped_storage().data_ptr() for p in model.parameters()}
    if rank == 0:
        print(f"gradient_as_bucket_view={view}: 4 gradients in {len(storages)} storage(s)")

# %% [markdown]
# Without views each gradient has its own storage (and the bucket is one more); with views all
# four share the bucket's one storage. Now the same switch on the MLP:

# %%
rec_view = run(mlp.replace(gradient_as_bucket_view=True), cluster=kit.current_cluster())
show_memory(rec_view)
saved = rec["memory"][0]["grads_mib"] - rec_view["memory"][0]["grads_mib"]
print(f"gradient_as_bucket_view=True saved {saved:.1f} MiB = 4P bytes, one full gradient copy")

# %% [markdown]
# Now the gradients match the formula. torch's documentation says the same: the option saves
# "the total gradients size" and avoids the copies between gradients and buckets. The PyTorch
# pull request that first proposed it (pytorch/pytorch PR #41954, closed and relanded as #44344)
# reports a roberta-base run whose peak memory fell from 8,250 MB to 7,183 MB, with an iteration
# 0.982 s → 0.909 s. The catch, also documented: the gradients are
# then views, so `detach_()` cannot be called on them (the optimizers' own `zero_grad` is fine).

# %% [markdown]
# ## 3. Activations grow with the batch
#
# Model states do not depend on the batch; activations do. To see them clearly we switch to the
# kit's small GPT (`kit/experiments/models.py`): an embedding, 3 pre-norm transformer blocks
# of width h = 128 with 4 attention heads, and a head (a LayerNorm and a `Linear` to the
# V = 256 token vocabulary), on s = 32 tokens per sample. It has fewer parameters than the MLP
# but saves much more per sample.
#
# **Count what backward needs.** Per sample, in fp32 floats, one block saves:
#
# | saved for backward | floats | why |
# |---|---|---|
# | input of LayerNorm 1 | s·h | LayerNorm's gradient needs its input |
# | input of the q, k, v `Linear` | s·h | a `Linear`'s weight gradient needs its input |
# | q, k and v | 3·s·h | attention's gradient needs all three |
# | attention output (= input of the projection `Linear`) | s·h | the same tensor serves both |
# | input of LayerNorm 2 and of the MLP's first `Linear` | 2·s·h | as above |
# | GELU input (4× wider) and second `Linear` input | 4·s·h + 4·s·h | the MLP is 4h wide |
# | **per block** | **16·s·h** | |
#
# The head saves its LayerNorm's input and its `Linear`'s input (2·s·h) and the loss's
# log-probabilities (s·V). So per sample, with L = 3 blocks:
#
#     activations ≈ (L·16·s·h + 2·s·h + s·V) × 4 bytes
#
# **Predict:** how many MiB of activations per sample, and at batch 8, 16 and 32 per rank? What
# happens to the model states when the batch doubles? Write the numbers down.

# %%
guess_act_mib = {"per sample": None, 8: None, 16: None, 32: None}

# %%
s_, h, V, L = 32, 128, 256, 3
per_sample = (L * 16 * s_ * h + 2 * s_ * h + s_ * V) * 4 / MiB
print(f"your guesses: {guess_act_mib}")
print(f"predicted: {per_sample:.4f} MiB of activations per sample")

gpt = ExperimentConfig(strategy="ddp", workload="gpt", batch_size=32, steps=4, warmup_steps=1,
                       gradient_as_bucket_view=True)
by_batch = sweep(gpt, "batch_size", [8, 16, 32], cluster=kit.current_cluster())
P_gpt = round(by_batch[0]["memory"][0]["predicted"]["params_mib"] * MiB / 4)
print(f"GPT: P = {P_gpt:,} parameters, model states 16P = {16 * P_gpt / MiB:.1f} MiB")
for r in by_batch:
    m, b = r["memory"][0], r["config"]["batch_size"]
    states = m["params_mib"] + m["grads_mib"] + m["optimizer_mib"]
    print(f"batch {b:2d}: model states {states:4.1f} MiB, activations {m['activations_mib']:4.1f} MiB")
    print(f"          per sample {m['activations_mib'] / b:.4f} MiB measured, "
          f"{per_sample:.4f} predicted")
    m["predicted"]["activations_mib"] = per_sample * b   # so the plot's formula bar has them too

# %% [markdown]
# The model states stay put; the activations per sample stay the same, so activations are
# **proportional to the batch size**. The formula is 0.5% short: the rest is small tensors
# (each LayerNorm's mean and 1/std per token, attention's log-sum-exp per row, the token ids).
#
# **Where is attention's s × s matrix?** Textbook attention computes the scores of every token
# against every other, s × s per head, and backward needs the softmax of them: a·s² more floats
# per block. Korthikanti et al. ("Reducing Activation Recomputation in Large Transformer
# Models", 2022) count s·b·h·(34 + 5·a·s/h) bytes per layer for 16-bit training with dropout;
# without the dropout masks that is our 16 values per token and width, plus the s² term. torch's
# `scaled_dot_product_attention` here runs a fused kernel (flash attention for CPU): it never
# stores the s × s matrix, keeps one log-sum-exp per row (a·s floats) and recomputes the scores
# during backward. Halve s and the activations halve exactly; nothing grows with s².
#
# The question the next plot answers: **at which batch size do activations overtake the model
# states?** The dotted bars are the formulas: 16P for the model states, the count above for the
# activations.

# %%
memory_breakdown(rank0(by_batch), title="GPT: model states are fixed, activations grow with the batch")

# %% [markdown]
# Which part dominates depends on the model and the batch: the MLP at batch 32 was almost all
# model states; the GPT at batch 32 is mostly activations. The same holds at scale: for GPT-2
# (1.5B parameters) the ZeRO paper counts at least 24 GB of model states, but about 60 GB of
# activations at batch 32 with 1,024-token sequences.

# %% [markdown]
# ## 4. Remedies for activations
#
# Four ways to shrink the activations of the GPT, here at batch 16 per rank (13 MiB of
# activations; half the batch keeps the timing comparisons below short):
# - **A smaller batch** (we just saw: half the batch, half the activations). Gradient
#   accumulation (lesson 03) keeps the batch per optimizer step.
# - **Mixed precision**: `torch.autocast` runs the matrix multiplies in bf16 (2 bytes instead of
#   4), so what they save for backward (their bf16-cast inputs and weights) and the bf16 outputs
#   the next operations save are half the size. It works on CPU too.
# - **Activation checkpointing**: save only each block's input and **recompute** the rest of
#   the block during backward. Memory for compute.
# - **A smaller model**: the `tiny` GPT is 32 wide with 2 blocks and 1 head.
#
# **Predict**, and write the numbers down:
# 1. The activations (MiB, batch 16) with checkpointing, where each of the 3 blocks keeps only
#    its input (s·h floats instead of 16·s·h), and with the tiny model (the formula of
#    section 3 with h = 32, L = 2).
# 2. The step time of each remedy divided by the fp32 step time. Checkpointing runs each
#    block's forward a second time during backward; backward costs about twice a forward.
#    For bf16: does this CPU multiply bf16 natively, as a GPU's tensor cores do (the cell
#    below asks it)? And autocast adds a cast of every weight in every step.

# %%
guess_remedies = {"checkpointing MiB": None, "tiny MiB": None, "bf16 time ratio": None,
                  "checkpointing time ratio": None}

# %%
def act_mib(h, L, s=32, V=256, b=16, block_floats=16):
    """The section-3 count: L blocks of block_floats·s·h, the head 2·s·h + s·V; fp32, batch b."""
    return (L * block_floats * s * h + 2 * s * h + s * V) * 4 * b / MiB


print(f"your guesses: {guess_remedies}")
print(f"predicted activations, batch 16: fp32 {act_mib(128, 3):.1f} MiB, "
      f"checkpointing {act_mib(128, 3, block_floats=1):.1f} MiB, tiny {act_mib(32, 2):.1f} MiB")

# %% [markdown]
# Memory is a byte count and comes out the same every run. Time is not: whether a remedy slows
# the step is measured as in lesson 03, with interleaved pairs of runs judged by a verdict.
# First bf16 against fp32 (nine pairs, so that one pair caught by a burst of other work cannot
# decide the verdict). Whether this CPU has native bf16 arithmetic decides much of the answer,
# so the cell first asks the processor (Linux lists its instruction sets in `/proc/cpuinfo`):

# %% tags=["verdict"]
import pathlib
cpuinfo = pathlib.Path("/proc/cpuinfo")
flags = set(cpuinfo.read_text().split()) if cpuinfo.exists() else set()
# x86 AVX-512 BF16, Intel AMX, Arm BF16
native_bf16 = sorted(flags & {"avx512_bf16", "amx_bf16", "bf16"})
print(f"native bf16 instructions on this CPU: {', '.join(native_bf16) or 'none found'}")
gpt16 = gpt.replace(batch_size=16, steps=3, warmup_steps=1)
bf16 = compare(gpt16, gpt16.replace(precision="bf16"), repeats=9, cluster=kit.current_cluster())
conclude(bf16, slower="On this run bf16 autocast made the step slower.",
         same="On this run bf16 and fp32 took the same time within the noise: no ordering to state.",
         faster="On this run bf16 autocast made the step faster.");

# %% [markdown]
# The verdict printed above is yours, and it is the only ordering this section states: on a
# shared 2-core machine it changes from run to run (see below).
#
# <details><summary>Our runs (numbers you will not see in yours)</summary>
#
# On the 2-core course machines the ratio has ranged widely: 1.9× to 2.1× slower when this
# lesson was written, 11.5× to 11.9× in later runs under a load of about 11 (we did not find
# out why). On a later machine whose CPU lists `avx512_bf16` and `amx_bf16`, under a load of
# 6 to 8, three runs in a row gave 1.23× (95% CI 0.97-1.40: same within noise), 1.06×
# (0.86-1.21: same) and 1.13× (1.04-1.41: slower); earlier runs there, 1.26× to 1.28× with
# the interval spanning 1 in 3 runs of 5. The verdict, not these numbers, says what yours does.
# </details>
#
# Why bf16 need not be faster here, and can be slower:
# - **Without native bf16 units**, a CPU cannot multiply bf16 numbers as they are. PyTorch's
#   CPU matmul hands bf16 to oneDNN only where the processor has the AVX-512 instructions
#   oneDNN needs, and otherwise falls back to a plain loop; either way, on a CPU without bf16
#   instructions (x86's AVX512_BF16 or AMX, Arm's BF16 extension) each bf16 value is widened
#   to fp32 before it is multiplied and the sum is rounded back to bf16. That is fp32's
#   arithmetic plus conversions, so the multiply itself cannot beat fp32 and usually loses.
# - **Autocast adds work around the multiplies** on any CPU: every forward casts every weight
#   to bf16, backward casts gradients back to fp32, and these casts are not free.
# - **This GPT is small**: its matrices are 128 wide, so the multiplies are a small part of
#   the step next to per-operation costs (Python, dispatch, allocation), and even a CPU with
#   bf16 units (the line above says whether yours lists them) gains little on them.
#
# On a GPU expect a clear win: an H100's tensor cores run dense bf16 multiplies at about
# 990 TFLOP/s, against 67 TFLOP/s for plain fp32 and 495 with TF32 tensor cores
# (`docs/hardware.md`), so mixed precision is first of all a speed win there.
#
# Now checkpointing against the same fp32 baseline:

# %% tags=["verdict"]
ckpt = compare(gpt16, gpt16.replace(activation_checkpointing=True), repeats=9,
               cluster=kit.current_cluster())
conclude(ckpt, slower="Checkpointing makes the step slower: it pays for the memory with a second "
                      "forward through the blocks.",
         same="On this run the second forward did not stand out from this machine's noise.",
         faster="On this run checkpointing was faster (unexpected: a second forward is extra work).");

# %% [markdown]
# Checkpointing does more work on any hardware: the blocks' forward runs twice. If backward
# costs about twice a forward, recomputing the blocks adds about a third of their
# forward-plus-backward time, so a ratio up to about 1.3 is what the arithmetic predicts (less,
# since the embedding, the head, the optimizer and the all-reduce are not recomputed). That
# bound counts FLOP and assumes backward costs twice a forward. A ratio above it means one of
# them does not hold here: on these small matrices much of a forward is fixed per-operation
# cost (Python, dispatch, allocating the outputs again), which the recomputation pays again
# and which a FLOP count ignores; if backward costs less than twice a forward, the second
# forward is a bigger share; `torch.utils.checkpoint` also saves and restores the RNG state per
# block; and one run's ratio on a shared machine is noisy. A 20% difference is near the limit
# of what nine short pairs resolve on a shared 2-core machine, which is why the verdict, not
# this paragraph, says what you measured.
#
# <details><summary>Our runs (numbers you will not see in yours)</summary>
#
# In our runs the ratio was 1.16 to 1.6, and the verdict said "slower" in about three runs of
# four and "same within noise" in the others.
# </details>
#
# Now the memory of all four, the remedies' records from the comparisons above and one run of
# the tiny model:

# %%
tiny = run(gpt16.replace(model_size="tiny"), cluster=kit.current_cluster())
remedies = [by_batch[1], bf16["b"], ckpt["b"], tiny]          # by_batch[1]: fp32 at batch 16
names = ["baseline fp32", "bf16 autocast", "checkpointing", "tiny model"]
base_m = remedies[0]["memory"][0]
for name, r in zip(names, remedies):
    m = r["memory"][0]
    states = m["params_mib"] + m["grads_mib"] + m["optimizer_mib"]
    print(f"{name:<14} states {states:4.1f} MiB, activations {m['activations_mib']:4.1f} MiB "
          f"({m['activations_mib'] / base_m['activations_mib'] * 100:3.0f}% of fp32)")

# %% [markdown]
# The question the next plot answers: **what did each remedy remove?** The dotted bars are
# the formulas: the counts above for fp32, checkpointing and the tiny model; bf16 has no count
# here, so its dotted bar shows the model states only.

# %%
for r, pred in zip(remedies, [act_mib(128, 3), None, act_mib(128, 3, block_floats=1), act_mib(32, 2)]):
    r["memory"][0]["predicted"]["activations_mib"] = pred
memory_breakdown(rank0(remedies), title="GPT, batch 16 per rank: four remedies for activation memory")

# %% [markdown]
# What the measurements show:
# - **bf16 autocast** shrinks the activations, but not to half: only the matrix multiplies
#   and attention run in bf16, while the residual stream, the LayerNorms and the loss stay in
#   fp32; and backward also needs the bf16 copy of each weight that autocast made for its
#   multiply, so those are saved too (2 bytes per weight, about 1.2 MiB here, whatever the
#   batch). The model states do not change at all. Autocast keeps **no
#   separate master copy** of the weights: the fp32 parameters themselves are the master, and
#   autocast casts them to bf16 inside each operation; the gradients and Adam's state stay fp32.
# - **Checkpointing** removes most of the activations: only each block's input is kept, as the
#   count predicted. The price is the second forward, measured above.
# - **The tiny model** shrinks everything: fewer and narrower layers save less per sample, and
#   far fewer parameters. The same formula predicts its activations.

# %% [markdown]
# ### A catch: bf16 on the MLP
#
# **Predict:** the MLP at batch 32 had 0.5 MiB of activations in fp32. How many MiB will bf16
# give? Write a number down.

# %%
guess_bf16_act_mib = None

# %%
rec_bf16 = run(mlp.replace(precision="bf16", gradient_as_bucket_view=True),
               cluster=kit.current_cluster())
print(f"your guess: {guess_bf16_act_mib} MiB")
print(f"MLP activations: fp32 {rec_view['memory'][0]['activations_mib']:.1f} MiB, "
      f"bf16 {rec_bf16['memory'][0]['activations_mib']:.1f} MiB")

# %% [markdown]
# More, not less! Backward needs each layer's weights, and under autocast those are the bf16
# copies, so they are saved: 2 bytes per weight, for every layer but the first (its input is
# the data, which needs no gradient): 3.16 M weights, 6.0 MiB, far more than this small
# batch's activations. Mixed precision saves activation memory only when
# activations are big next to the weights (large batches, long sequences). On GPUs it is worth
# it for speed anyway (the tensor-core numbers in section 4); on this CPU, section 4's verdict
# says what you measured.

# %% [markdown]
# ## 5. Model states at scale
#
# Activations can be cut with the remedies above. Model states cannot: with DDP every GPU holds
# all 16P bytes. The formula tells us when DDP stops being possible at all.

# %%
print("model states per GPU (16P bytes), before any activations:")
for name, n in [("124M model", 124e6), ("GPT-2 1.5B", 1.5e9), ("7.5B model", 7.5e9)]:
    fits = "fits" if 16 * n < 80e9 else "does NOT fit"
    print(f"  {name:<11} 16P = {16 * n / 1e9:5.1f} GB: {fits} in 80 GB")

# %% [markdown]
# A 7.5B-parameter model needs 120 GB per GPU for its model states alone: no GPU holds that,
# however small the batch. The fix is to stop replicating: **ZeRO** and **FSDP** split the
# optimizer state, the gradients and even the parameters across the ranks (with 64 ranks,
# ZeRO's stage 3 needs 1.9 GB per GPU for the same model). That is a later lesson.

# %% [markdown]
# ## What differs on real GPUs
#
# - The record's `peak_mib` (a black diamond in the plot) is the allocator's high-water mark.
#   It is above the sum of the four parts, because of temporary buffers during forward and
#   backward. `nvidia-smi` shows more still: memory the allocator keeps cached for reuse, and
#   the CUDA context, a few hundred MB per process. torch has loaded CUDA kernels lazily since
#   1.13 (`CUDA_MODULE_LOADING=LAZY`, a CUDA 11.7 feature); the change that made it the default
#   measured 287 MB of GPU memory after a first tensor, against 667 MB loading eagerly
#   (`docs/hardware.md` has the sources).
# - bf16 is a speed win on GPUs (tensor cores), not only a memory one. On a CPU it depends on
#   the processor's bf16 support and the matrices' size; your verdict above says what this one did.
# - The byte counts themselves are the same: a tensor takes the same bytes on any device.

# %% [markdown]
# ## Exercises

# %% [markdown]
# **1.** A 1.5B-parameter model, fp32 with Adam, trained with DDP and its default
# `gradient_as_bucket_view=False`. How much memory do the model states take per GPU?
#
# <details><summary>Answer</summary>
#
# 16P = 24 GB, plus DDP's bucket copy of the gradients, 4P = 6 GB: 30 GB, before activations.
# </details>

# %% [markdown]
# **2.** From the measurements in section 3, predict the GPT's activations at batch 64 per
# rank. Check with `run(gpt.replace(batch_size=64), cluster=kit.current_cluster())["memory"][0]`.
#
# <details><summary>Answer</summary>
#
# Twice the batch-32 value: 64 × 0.8125 MiB = 52 MiB from the formula (52.2 MiB measured):
# activations are proportional to the batch size.
# </details>

# %% [markdown]
# **3.** Why did bf16 autocast leave the optimizer state at 8P bytes?
#
# <details><summary>Answer</summary>
#
# Autocast casts inside each operation; the parameters themselves stay fp32 (they are the
# master copy; there is no second one), their gradients are fp32, and Adam keeps its two
# averages in the parameters' dtype. The ZeRO paper's mixed-precision setup is different: it
# keeps fp16 parameters and gradients (2P + 2P) and adds fp32 master weights, m and v (12P):
# 16P bytes again.
# </details>

# %% [markdown]
# **4.** Checkpointing cut the GPT's activations by most of their size. What would checkpointing
# do to the MLP of section 1, whose blocks are each one `Linear` and one `ReLU`?
#
# <details><summary>Answer</summary>
#
# Nothing: both ways the MLP at batch 32 saves 0.53 MiB (558,596 bytes; try
# `run(mlp.replace(activation_checkpointing=True), cluster=kit.current_cluster())`). Such a
# block saves only its input (for the `Linear`) and its output (for the `ReLU`), and that
# output is the next block's input, which the next block keeps anyway, checkpointed or not.
# Checkpointing pays off when a block saves much more inside than at its edges, as a
# transformer block does (16·s·h inside, s·h at its input).
# </details>

# %% [markdown]
# **5.** The same GPT block with s = 1,024 tokens (h = 128, a = 4 heads), per sample, fp32:
# how many MiB does the 16·s·h count give, and how many would textbook attention add by
# keeping its a·s² softmax probabilities? What does the fused kernel keep instead?
#
# <details><summary>Answer</summary>
#
# 16 × 1,024 × 128 × 4 bytes = 8 MiB per block. The probabilities: 4 × 1,024² × 4 bytes =
# 16 MiB more, twice the rest, and growing with s². The fused kernel keeps one log-sum-exp per
# row and head: 4 × 1,024 × 4 bytes = 16 KiB.
# </details>

# %% [markdown]
# ## Check against a reference
#
# The measured model states must equal the formula. First on the kit's records, then from
# scratch: DDP with Adam on 2 ranks, one step, bytes counted directly. Adam's state also holds
# one `step` counter per parameter tensor, a 4-byte scalar, hence the `+ 4 × tensors`.

# %%
for r in (rec_view, by_batch[-1]):
    m = r["memory"][0]
    for part in ("params_mib", "grads_mib", "optimizer_mib"):
        want = m["predicted"][part]
        assert abs(m[part] - want) < 1e-3, (r["label"], part, m[part], want)
m, m_view = rec["memory"][0], rec_view["memory"][0]
assert abs(m["grads_mib"] - 2 * m_view["grads_mib"]) < 1e-3          # without views: two gradient copies
print("kit records: params 4P, grads 4P (8P without bucket views), Adam 8P + 4 x tensors: as predicted")

# %%
%%distributed
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP
torch.manual_seed(0)
model = DDP(nn.Sequential(nn.Linear(64, 64), nn.ReLU(), nn.Linear(64, 10)).to(device),
            device_ids=[device.index] if device.type == "cuda" else None, gradient_as_bucket_view=True)
opt = torch.optim.Adam(model.parameters())
model(torch.randn(8, 64, device=device)).sum().backward()
opt.step()
params = list(model.parameters())
n, tensors = sum(p.numel() for p in params), len(params)
nbytes = lambda ts: sum(t.numel() * t.element_size() for t in ts)
assert nbytes(params) == 4 * n
assert nbytes(p.grad for p in params) == 4 * n
opt_bytes = nbytes(v for s in opt.state.values() for v in s.values() if torch.is_tensor(v))
assert opt_bytes == 8 * n + 4 * tensors, (opt_bytes, 8 * n + 4 * tensors)
"check passed"
