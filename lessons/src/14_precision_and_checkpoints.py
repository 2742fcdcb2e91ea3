# %% [markdown]
# # 14 · Precision and checkpoints
#
# Two things every long training run needs and that lesson 04 only touched: **fewer bytes per
# number** (16-bit and 8-bit formats, and what they break) and **surviving a crash** (a checkpoint
# written by many ranks, read back by a different number of ranks, and a launcher that restarts
# the job by itself).
#
# Words used below:
# - **fp32, fp16, bf16**: 32- and 16-bit floating point. A float is a sign, an **exponent** (the
#   range: how small and how large) and a **mantissa** (the precision: how many digits).
#   fp16 has 5 exponent bits and 10 mantissa bits; bf16 has fp32's 8 exponent bits and 7 mantissa bits.
# - **Underflow**: a number too small for the format becomes 0.
# - **Master weights**: an fp32 copy of the parameters that the optimizer updates, next to the
#   16-bit copy the forward and backward use.
# - **Sharded checkpoint**: every rank writes only the tensors (or pieces of tensors) it holds.
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
# ## 1. fp16: gradients that vanish
#
# The smallest positive fp16 number is a **subnormal**, 2⁻²⁴ ≈ 6·10⁻⁸; anything below half of
# it rounds to 0. fp32 and bf16 go down to about 10⁻³⁸ (with subnormals, 10⁻⁴⁵ for fp32 and
# 10⁻⁴⁰ for bf16).
#
# **Predict:** what do `1e-8` and `1e-7` become when cast to fp16, and to bf16? Write them here:

# %%
guess_fp16 = {1e-8: None, 1e-7: None}   # your values
guess_bf16 = {1e-8: None, 1e-7: None}

# %%
import torch
from torch import nn

print(f"your guesses: fp16 {guess_fp16}, bf16 {guess_bf16}")
for dtype in (torch.float32, torch.float16, torch.bfloat16):
    fi = torch.finfo(dtype)
    cast = ", ".join(f"{v:g} -> {torch.tensor(v).to(dtype).item():.3g}" for v in (1e-8, 1e-7))
    print(f"{str(dtype):15} max {fi.max:9.3g}, smallest normal {fi.tiny:9.3g}, eps {fi.eps:.3g};  "
          f"{cast}")

# %% [markdown]
# Now in a real backward. Mixed precision with `torch.autocast` keeps the parameters in fp32 and
# runs the matrix multiplies in the 16-bit type, so the gradients flowing backward between the
# layers are 16-bit too. Gradients of real models are often tiny: Micikevicius et al. ("Mixed
# Precision Training", ICLR 2018) show activation gradients of real networks that fall below
# fp16's range. We put a small MLP's gradients there by multiplying its loss by 10⁻⁶ (its
# gradients' median is then a few times 10⁻⁹).
#
# **Predict:** what share of the gradient entries comes out exactly 0 with fp16 autocast? With
# bf16 autocast?

# %%
guess_zero_share_fp16, guess_zero_share_bf16 = None, None

# %%
torch.manual_seed(0)
mlp = nn.Sequential(nn.Linear(64, 64), nn.ReLU(), nn.Linear(64, 64), nn.ReLU(), nn.Linear(64, 1))
torch.manual_seed(1)
x, y = torch.randn(32, 64), torch.randn(32, 1)
TINY = 1e-6


def grads(dtype=None, scale=1.0):
    """The flat gradient of TINY x the MSE loss, with autocast to dtype (None: fp32), the loss x
    scale."""
    mlp.zero_grad()
    with torch.autocast("cpu", dtype=dtype or torch.float32, enabled=dtype is not None):
        loss = nn.functional.mse_loss(mlp(x), y) * TINY
    (loss * scale).backward()
    return torch.cat([p.grad.flatten() for p in mlp.parameters()]) / scale


g32 = grads()
print(f"your guesses: fp16 {guess_zero_share_fp16}, bf16 {guess_zero_share_bf16}")
print(f"fp32 gradient: median |g| {g32.abs().median():.2g}, zeros {(g32 == 0).float().mean():.1%}")
for dtype in (torch.float16, torch.bfloat16):
    g = grads(dtype)
    print(f"{str(dtype):15} autocast: zeros {(g == 0).float().mean():5.1%}")

# %% [markdown]
# **Loss scaling** is the fix: multiply the loss by S before backward, so every gradient is S
# times larger and stays above fp16's floor; divide the gradients by S before the optimizer uses
# them. Too large an S and the other end breaks: fp16's largest number is 65,504, above that a
# gradient becomes `inf`.
#
# **Predict:** with S = 2ᵏ, from which k on are (almost) no gradients lost? A rough rule: an entry
# g survives when |g|·S is above 2⁻²⁵ (half the smallest subnormal). The line in the plot below
# is that rule applied to the fp32 gradients; the points are measured.

# %%
guess_k = None   # your k

# %%
import matplotlib.pyplot as plt

ks = list(range(0, 33, 2))
measured = [(grads(torch.float16, 2.0 ** k) == 0).float().mean().item() for k in ks]
rule = [(g32.abs() * 2.0 ** k < 2.0 ** -25).float().mean().item() for k in ks]
print(f"your guess k = {guess_k}; measured zero share: "
      + ", ".join(f"k={k}: {m:.0%}" for k, m in zip(ks, measured) if k % 8 == 0))
fig, ax = plt.subplots(figsize=(6.5, 3.4))
ax.plot(ks, rule, "-", color="black", label="predicted: |g|·S < 2⁻²⁵ in the final gradient")
ax.plot(ks, measured, "o", color="#D55E00", label="measured: fp16 autocast, loss x 2ᵏ")
ax.set(xlabel="k (loss scale S = 2ᵏ)", ylabel="share of gradient entries = 0", ylim=(-0.03, 1.03))
ax.set_title("fp16 underflow against the loss scale", fontsize="medium")
ax.legend(fontsize="small")
plt.show()

# %% [markdown]
# The measured points sit on or above the line: the rule looks only at the final gradient, but
# a gradient can also vanish earlier, in an activation's gradient between two layers.
#
# torch's `GradScaler` chooses S for you and keeps choosing: it starts at 2¹⁶, and after every
# step whose gradients contain an `inf` or `NaN` it **skips the optimizer step** and halves S;
# after 2,000 steps without one it doubles S (`growth_interval=2000`, torch 2.13's
# `torch/amp/grad_scaler.py`). Here it is twice: once with its default start, once starting far
# too high (2⁴⁰: the gradients overflow).

# %%
for init_scale in (2.0 ** 16, 2.0 ** 40):
    torch.manual_seed(0)
    mlp = nn.Sequential(nn.Linear(64, 64), nn.ReLU(), nn.Linear(64, 64), nn.ReLU(), nn.Linear(64, 1))
    opt = torch.optim.SGD(mlp.parameters(), lr=1e4)
    scaler = torch.amp.GradScaler("cpu", init_scale=init_scale)
    before = [p.detach().clone() for p in mlp.parameters()]
    with torch.autocast("cpu", dtype=torch.float16):
        loss = nn.functional.mse_loss(mlp(x), y) * TINY
    scaler.scale(loss).backward()
    scaler.step(opt)          # unscales, checks for inf/NaN, steps only if there are none
    scaler.update()
    moved = any(not torch.equal(b, p) for b, p in zip(before, mlp.parameters()))
    print(f"start S = 2^{int(torch.log2(torch.tensor(init_scale)))}: step taken {moved}, "
          f"S now 2^{torch.log2(torch.tensor(scaler.get_scale())).item():.0f}")

# %% [markdown]
# ## 2. bf16: the range of fp32, the precision of three digits
#
# bf16 has fp32's exponent, so the tiny gradients above survived without any scaling: that is
# why bf16 training needs no `GradScaler`. Its price is the mantissa: 7 bits, so the numbers
# next to 1.0 are 1.0 - 2⁻⁸ ≈ 0.9961 and 1.0 + 2⁻⁷ ≈ 1.0078.
#
# **Predict:** a weight of 1.0 receives 100 updates of +0.001 each. What does it end at in
# bf16, and in fp32?

# %%
guess_w_bf16, guess_w_fp32 = None, None

# %%
print(f"your guesses: bf16 {guess_w_bf16}, fp32 {guess_w_fp32}")
for dtype in (torch.bfloat16, torch.float32):
    w = torch.tensor(1.0, dtype=dtype)
    for _ in range(100):
        w += 0.001
    print(f"{str(dtype):15} 1.0 + 100 x 0.001 = {w.item():.4f}")

# %% [markdown]
# Every update was rounded away: 1.001 is closer to 1.0 than to 1.0078. Updates are usually far
# smaller than the weights (a learning rate of 10⁻⁴ times a gradient), so a model whose weights
# live only in bf16 stops learning, unless the update is rounded stochastically (up with the
# probability of the lost remainder, so that updates add up on average) or compensated (a Kahan
# sum keeps the lost low bits in a second bf16 tensor): Zamirai et al., "Revisiting BFloat16
# Training" (2020), train in pure bf16 that way. The common recipe is the **fp32 master
# weights**: the optimizer updates an fp32 copy, and the 16-bit copy for forward and backward is
# made from it after every step.
#
# **Predict:** with Adam, how many bytes per parameter does this setup keep? (16-bit parameters
# and gradients, fp32 master weights, Adam's two fp32 averages.)

# %%
guess_bytes_per_param = None

# %% [markdown]
# The next cell writes the master-weight step by hand: a bf16 model for forward and backward,
# its fp32 master copy for Adam, and counts every byte it keeps.

# %%
def nbytes(tensors):
    return sum(t.numel() * t.element_size() for t in tensors)


torch.manual_seed(0)
model = nn.Sequential(nn.Linear(64, 256), nn.ReLU(), nn.Linear(256, 8)).to(torch.bfloat16)
master = [p.detach().float().requires_grad_() for p in model.parameters()]   # fp32 master weights
adam = torch.optim.Adam(master, lr=1e-3)
xb, yb = torch.randn(16, 64), torch.randn(16, 8)
for step in range(3):
    model.zero_grad()
    nn.functional.mse_loss(model(xb.bfloat16()).float(), yb).backward()    # bf16 forward and backward
    for m, p in zip(master, model.parameters()):
        m.grad = p.grad.float()                                            # gradients up to fp32
    adam.step()                                                            # the update in fp32
    with torch.no_grad():
        for m, p in zip(master, model.parameters()):
            p.copy_(m)                                                     # and back down to bf16
P = sum(p.numel() for p in model.parameters())
kept = {"bf16 params": nbytes(model.parameters()),
        "bf16 grads": nbytes(p.grad for p in model.parameters()),
        "fp32 master": nbytes(master),
        "Adam m, v": nbytes(v for s in adam.state.values() for k, v in s.items() if k != "step")}
print(f"your guess {guess_bytes_per_param}; P = {P:,}")
for name, b in kept.items():
    print(f"  {name:12} {b:9,} bytes = {b / P:.0f} bytes per parameter")
print(f"  total        {sum(kept.values()):9,} bytes = {sum(kept.values()) / P:.0f} bytes per parameter")

# %% [markdown]
# 2 + 2 + 4 + 8 = **16 bytes per parameter**: the same 16P as plain fp32 training with Adam
# (lesson 04), now counted as the ZeRO paper counts mixed precision. The master copy is why
# 16-bit training does not halve the model states. It halves the activations, and on a GPU it
# runs the multiplies on the tensor cores. Lesson 04's `torch.autocast` keeps no second copy: its
# fp32 parameters are the master, and it casts them for each multiply.
#
# Does it halve the bytes the gradient reduction moves? Only where the recipe **reduces in
# 16 bits**, and the large recipes do not:
#
# | recipe | gradients reduced in | source |
# |---|---|---|
# | FSDP2, `MixedPrecisionPolicy(param_dtype=torch.bfloat16)` | **bf16** (`reduce_dtype=None` falls back to `param_dtype`) | torch 2.13, `torch/distributed/fsdp/_fully_shard/_fsdp_api.py` |
# | DDP with `bf16_compress_hook` | **bf16** (NCCL only; lesson 07) | `torch/distributed/algorithms/ddp_comm_hooks/default_hooks.py` |
# | Megatron-LM, `--bf16` | **fp32** ("bfloat16 requires gradient accumulation and all-reduce to be done in fp32", unless `--grad-reduce-in-bf16`) | `megatron/training/arguments.py` |
# | torchtitan | **fp32** (`mixed_precision_reduce = "float32"` by default, passed to FSDP2 as `reduce_dtype`) | torchtitan's job config |
# | Llama 3 405B | **fp32** ("FP32 reduce-scatter of gradients") | Dubey et al. 2024, section 3.3.2 |
#
# Why fp32: a reduction adds up many ranks' (and micro-batches') gradients, and with 7 mantissa
# bits the small ones are rounded away exactly as the updates above were. So these recipes keep
# a 4-byte gradient: 2 (bf16 weights) + 4 (fp32 gradients) + 4 (master) + 8 (Adam) = **18 bytes
# per parameter**, the layout lesson 13's planner plans with; the 16 above holds only where the
# gradient stays 16-bit.
#
# **Predict:** FSDP2 on our 2 ranks, this section's 18,696-parameter model in bf16. How many bytes
# does each rank hand to the gradient reduce-scatter per step with FSDP2's default, and with
# `reduce_dtype=torch.float32`?

# %%
guess_reduce_bytes = {"default": None, "fp32": None}

# %% [markdown]
# The next cell counts them: a `TorchDispatchMode` sees every operation torch runs, FSDP2's own
# collectives (`c10d` ops) included, with their tensors; it records each reduce-scatter's input.

# %%
%%distributed
from torch import nn
from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard
from torch.utils._python_dispatch import TorchDispatchMode


class CountReduceScatter(TorchDispatchMode):
    """Records (dtype, bytes) of the input of every reduce-scatter torch issues inside the block."""

    def __init__(self):
        super().__init__()
        self.seen = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if func.namespace == "c10d" and "reduce_scatter" in func._opname:
            t = args[1]                                   # (output, input, ...): the full-size input
            self.seen.append((str(t.dtype), t.numel() * t.element_size()))
        return func(*args, **(kwargs or {}))


reduced = {}
for name, policy in (("default", MixedPrecisionPolicy(param_dtype=torch.bfloat16)),
                     ("fp32", MixedPrecisionPolicy(param_dtype=torch.bfloat16,
                                                   reduce_dtype=torch.float32))):
    torch.manual_seed(0)
    net = nn.Sequential(nn.Linear(64, 256), nn.ReLU(), nn.Linear(256, 8))
    fully_shard(net, mp_policy=policy)
    with CountReduceScatter() as counter:
        net(torch.randn(16, 64)).float().pow(2).mean().backward()
    reduced[name] = counter.seen
    grad_dtypes = {str(p.grad.dtype) for p in net.parameters()}
    if rank == 0:
        print(f"{name:8} reduce-scatter inputs {counter.seen}: {sum(b for _, b in counter.seen):,} "
              f"bytes; sent per rank (ring, (t-1)/t): {sum(b for _, b in counter.seen) // 2:,}; "
              f"sharded gradients kept in {grad_dtypes}")

# %% [markdown]
# 18,696 × 2 = 37,392 bytes with FSDP2's default, 74,784 with `reduce_dtype=torch.float32`: the
# reduction's bytes halve only with the 16-bit reduction. In both, the sharded gradient that Adam
# reads is fp32 (the parameters' own dtype): FSDP2 casts the reduced shard up.
#
# ## 3. fp8: what changes (predicted)
#
# H100s multiply 8-bit floats on their tensor cores. Two formats: **E4M3** (4 exponent bits,
# 3 mantissa bits, largest 448) for weights and activations, **E5M2** (largest 57,344) for
# gradients (Micikevicius et al., "FP8 Formats for Deep Learning", 2022). With so little range,
# one loss scale is not enough: each block of numbers gets its own scale factor, chosen from its
# largest value. How large a block is differs by recipe: one scale per **tensor** in NVIDIA's
# original Transformer Engine recipe (chosen from a history of recent maxima, "delayed
# scaling"); per 1×128 tile of activations and per 128×128 block of weights in DeepSeek-V3's
# training (DeepSeek-AI 2024, section 3.3); one scale per 32 elements in the MXFP8 format (OCP
# Microscaling specification, 2023). Finer blocks let one outlier spoil fewer numbers, at the
# price of more scales to store and apply. torch has the formats as dtypes on every device, so
# the rounding with one per-tensor scale can be measured here:

# %%
torch.manual_seed(0)
# a tensor of small values, like activations' gradients
t = torch.randn(4096) * 1e-3
for name, dtype in (("e4m3", torch.float8_e4m3fn), ("e5m2", torch.float8_e5m2)):
    plain = t.to(dtype).float()
    # per-tensor scale: the largest value lands on the format's max
    scale = torch.finfo(dtype).max / t.abs().max()
    scaled = (t * scale).to(dtype).float() / scale
    err = lambda r: ((r - t).abs() / t.abs()).median().item()
    print(f"{name}: max {torch.finfo(dtype).max:8,.0f}; zeros without a scale "
          f"{(plain == 0).float().mean():5.1%}, with one {(scaled == 0).float().mean():5.1%}; median "
          f"relative error {err(plain):.2f} -> {err(scaled):.3f}")

# %% [markdown]
# What fp8 would change on an H100, **predicted** from the datasheet (nothing here measures it):
# - **Speed of the multiplies**: dense fp8 1,979 TFLOP/s against bf16's 989 (NVIDIA H100 SXM
#   datasheet, the "with sparsity" figures halved; `docs/hardware.md`): at most 2× on the matrix
#   multiplies, less on the step, since attention's softmax, the norms and the communication do not
#   speed up.
# - **Memory**: fp8 activations saved for backward would be half of bf16's. The model states do not
#   shrink: recipes keep the fp32 master weights and Adam's state, 12 bytes per parameter.
# - **Communication**: gradients are still reduced in bf16 or fp32 in the common recipes.

# %% [markdown]
# ## 4. A sharded checkpoint, loaded at another world size
#
# With FSDP (lesson 06) no rank holds the whole model, so no rank can `torch.save` it.
# `torch.distributed.checkpoint` (DCP) has every rank write its own shards in parallel, plus one
# `.metadata` file that says which piece of which tensor is where. Loading reads that map, so the
# ranks that load need not be the ranks that saved: another world size, another sharding.
#
# The cell below trains a small model with FSDP2's `fully_shard` on our 2 ranks for 3 steps with
# Adam and saves model and optimizer with `dcp.save`.
#
# **Predict:** the model has 64·256 + 256 + 256·8 + 8 = 18,696 parameters. How many bytes of
# tensors does each rank write (parameters and Adam's m and v, fp32)? How many files?

# %%
guess_bytes_per_rank, guess_files = None, None

# %%
import tempfile
ckpt_dir = tempfile.mkdtemp(prefix="kit-lesson14-")   # outside the checkout; the ranks see the same disk
%dist push ckpt_dir

# %%
%%distributed
import os
import torch.distributed.checkpoint as dcp
from torch import nn
from torch.distributed.fsdp import fully_shard
from torch.distributed.checkpoint.state_dict import get_state_dict

torch.manual_seed(0)
model = nn.Sequential(nn.Linear(64, 256), nn.ReLU(), nn.Linear(256, 8))
for layer in (model[0], model[2]):
    fully_shard(layer)
fully_shard(model)
opt = torch.optim.Adam(model.parameters(), lr=1e-2)
torch.manual_seed(1)
X, Y = torch.randn(16, 64), torch.randn(16, 8)
for _ in range(3):
    opt.zero_grad()
    nn.functional.mse_loss(model(X.chunk(world_size)[rank]), Y.chunk(world_size)[rank]).backward()
    opt.step()
model_sd, optim_sd = get_state_dict(model, opt)
dcp.save({"model": model_sd, "optim": optim_sd}, checkpoint_id=ckpt_dir)
mine = sum(p.to_local().numel() for p in model.parameters())
print(f"rank {rank} holds {mine:,} of 18,696 parameters "
      f"(first layer's weight: {tuple(model[0].weight.to_local().shape)} of "
      f"{tuple(model[0].weight.shape)})")
full = {k: v.full_tensor() for k, v in model.state_dict().items()}    # all-gathered, for the check below

# %%
import os
print(f"your guesses: {guess_bytes_per_rank} bytes per rank, {guess_files} files")
for f in sorted(os.listdir(ckpt_dir)):
    print(f"  {f:14} {os.path.getsize(os.path.join(ckpt_dir, f)):8,} bytes")
print(f"tensors: 3 x 18,696 x 4 bytes = {3 * 18_696 * 4:,} bytes in all, about {3 * 18_696 * 4 // 2:,} "
      f"per rank")

# %% [markdown]
# One `.distcp` file per rank and the `.metadata` map (rank 0 writes it), and the two `.distcp` files
# differ by about 21 KB. The map says why: for every item of the state dict it records its global
# shape, and for every piece of it which file holds it, at which offset, how many bytes. The cell
# below reads it and sorts each file's items into shards (a part of a tensor) and items held
# whole.

# %%
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.metadata import BytesStorageMetadata

meta = dcp.FileSystemReader(ckpt_dir).read_metadata()       # the .metadata file, as DCP reads it
for name in sorted(f for f in os.listdir(ckpt_dir) if f.endswith(".distcp")):
    items = [(i.fqn, where.length) for i, where in meta.storage_data.items()
             if where.relative_path == name]
    whole = [(k, n) for k, n in items if isinstance(meta.state_dict_metadata[k], BytesStorageMetadata)
             or len(meta.state_dict_metadata[k].chunks) == 1]   # one piece: every rank held all of it
    print(f"{name}: {len(items) - len(whole)} shards, {len(whole)} items held whole, "
          f"{sum(n for _, n in whole):,} bytes of them: {sorted({k.split('.')[-1] for k, _ in whole})}")
bias = [where.length for i, where in meta.storage_data.items() if i.fqn == "model.2.bias"]
print(f"model.2.bias: 8 floats, two shards of 4 (16 bytes each) stored in {bias} bytes")

# %% [markdown]
# Each file holds its rank's shards: 12 pieces (the two weights, the two biases, and Adam's `exp_avg`
# and `exp_avg_sq` of each), cut along the first dimension: the 256 × 64 weight is 128 rows on each
# rank. The items every rank holds whole are saved only once: Adam's `step` counter per tensor
# (a scalar) and the 12 entries of the optimizer's `param_groups` (`lr`, `betas`, ..., pickled).
# DCP's planner removes the duplicates and gives each to the rank with the fewest bytes planned so
# far (torch's `dedup_save_plans`). It walks rank 0's items first, so when the first duplicate comes
# up rank 0 already has its model shards planned and rank 1 nothing: rank 1 gets it, and all 16.
# Each item is stored as its own small record with a header of about 1.5 KB (the 16 bytes of a bias
# shard take about 1.6 KB), so these 16 tiny items are the ~21 KB by which rank 1's file is larger,
# and the headers are why the files together hold more than the 224 KB of tensors.
#
# Now load the checkpoint at **world size 1**: in this notebook's own process, with no process
# group at all, into an ordinary unsharded model. DCP reads the map and fills each full tensor
# from both ranks' files. torch warns that it assumes a single process (`UserWarning: torch.distributed
# is disabled ...`): here that is exactly the intent.

# %%
import torch.distributed.checkpoint as dcp

one = nn.Sequential(nn.Linear(64, 256), nn.ReLU(), nn.Linear(256, 8))
state = {"model": one.state_dict()}
dcp.load(state, checkpoint_id=ckpt_dir)     # no process group here: DCP loads in this one process
one.load_state_dict(state["model"])
%dist pull full --ranks 0
print("loaded at world size 1:", {k: tuple(v.shape) for k, v in one.state_dict().items()})
print("largest difference to the ranks' gathered weights:",
      max((one.state_dict()[k] - full[k]).abs().max().item() for k in full))

# %% [markdown]
# Bit for bit the weights the two ranks trained. The same call loads at 4 or 64 ranks: each
# reads the pieces that overlap the shards it holds.
#
# ## 5. Uneven inputs: `Join`
#
# DDP all-reduces the gradients in every backward, and all ranks must take part. If rank 1's
# data runs out after 3 batches while rank 0 has 5, rank 0's fourth backward waits for an
# all-reduce rank 1 never starts: the job hangs until the process group's timeout. (Lesson 09's
# `DistributedSampler` avoids this by padding or dropping samples.)
#
# `torch.distributed.algorithms.Join` is the other way: a rank whose data has run out
# **shadows** the collectives of the others, contributing zeros, until every rank is done.
#
# **Predict:** in rank 0's 4th and 5th steps, what gradient does DDP hand to the optimizer: its
# own batch's gradient, or half of it?

# %%
guess_join = None   # "own" or "half"

# %%
%%distributed
from torch.distributed.algorithms import Join
from torch.nn.parallel import DistributedDataParallel as DDP

def batches(r):
    g = torch.Generator().manual_seed(100 + r)
    return [(torch.randn(4, 8, generator=g), torch.randn(4, 1, generator=g))
            for _ in range(5 if r == 0 else 3)]

torch.manual_seed(0)
net = DDP(nn.Linear(8, 1))
sgd = torch.optim.SGD(net.parameters(), lr=0.1)
with Join([net]):                       # rank 1 shadows rank 0's last two all-reduces
    for xb, yb in batches(rank):
        sgd.zero_grad()
        nn.functional.mse_loss(net(xb), yb).backward()
        sgd.step()
joined = [p.detach().clone() for p in net.module.parameters()]
print(f"rank {rank}: {len(batches(rank))} batches, weight sum {net.module.weight.sum().item():+.6f}")

# %% [markdown]
# Both ranks end with the same weights. Which gradient rank 0 used in its last steps, the final
# check at the end decides against one process.
#
# ## 6. An elastic restart under torchrun
#
# `torchrun --max-restarts N` (lesson 10 used 0) watches its workers: when one dies, it stops
# the others and starts all of them again, up to N times. A restarted worker is a new process
# that remembers nothing, so the job resumes only as far as its last checkpoint.
#
# The script below trains a small model with DDP on 2 ranks for 8 steps on a fixed dataset (the
# targets are a fixed function of the inputs, so the loss falls), saving a DCP checkpoint after
# each step. On the first attempt (`TORCHELASTIC_RESTART_COUNT` is `0`), rank 1 raises an error in
# step 4. Every attempt starts by loading the latest checkpoint, if one exists.
#
# How it saves matters for a crash *during* a save. Saving over the same folder every step would
# leave, after such a crash, a folder that is half the old checkpoint and half the new: no valid
# checkpoint at all. So each save goes to a folder of its own (`step4/`), and only once `dcp.save`
# has returned on every rank (rank 0 writes `.metadata` last, after all ranks' files) does rank 0
# point `latest` at it, by writing a temporary file and renaming it over `latest`: a rename is
# atomic on POSIX filesystems, so a reader sees the old pointer or the new one, never half of one.
# Older folders are deleted beyond the last 2. Lesson 16 measures what this buys.
#
# **Predict:** at which step does the second attempt start? Will its losses equal those of an
# uninterrupted run?

# %%
guess_resume_step, guess_same_losses = None, None

# %% [markdown]
# The ranks of this notebook are stopped first, to leave their memory to torchrun's processes
# (the `Join` weights come along to the kernel for the final check).

# %%
%dist pull joined --ranks 0
%dist shutdown

# %%
import json, pathlib, subprocess, time

SCRIPT = '''
import json, os, shutil, sys, torch, torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP

ckpt, attempt = sys.argv[1], int(os.environ["TORCHELASTIC_RESTART_COUNT"])
rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
# Each attempt gets its own prefix in torchrun's store, so that the restarted group cannot read the
# addresses the crashed group left there (a race seen on this machine; pytorch/pytorch#167288).
store = dist.TCPStore(os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]), world, is_master=False)
dist.init_process_group("gloo", store=dist.PrefixStore(f"attempt-{attempt}", store), rank=rank,
                        world_size=world)
torch.manual_seed(0)
model = DDP(nn.Sequential(nn.Linear(16, 32), nn.Tanh(), nn.Linear(32, 1)))
opt = torch.optim.SGD(model.parameters(), lr=0.1)
torch.manual_seed(1)
X = torch.randn(8, 64, 16)                                   # 8 steps of a 64-sample global batch
Y = torch.tanh(X @ torch.randn(16, 1))                        # a fixed target the model can learn
state = {"model": model.state_dict(), "optim": opt.state_dict(), "step": torch.tensor(0)}
latest = os.path.join(ckpt, "latest")
if os.path.exists(latest):                                   # the pointer names a complete checkpoint
    dcp.load(state, checkpoint_id=os.path.join(ckpt, open(latest).read()))
    model.load_state_dict(state["model"]); opt.load_state_dict(state["optim"])
start = int(state["step"])
for step in range(start, 8):
    if attempt == 0 and rank == 1 and step == 4:
        raise RuntimeError("rank 1 crashes in step 4 (on purpose)")
    opt.zero_grad()
    loss = nn.functional.mse_loss(model(X[step].chunk(world)[rank]), Y[step].chunk(world)[rank])
    loss.backward()
    opt.step()
    full = loss.detach().clone(); dist.all_reduce(full); full /= world
    if rank == 0:
        print("LOSS " + json.dumps([attempt, step, full.item()]), flush=True)
    folder = f"step{step + 1}"
    dcp.save({"model": model.state_dict(), "optim": opt.state_dict(), "step": torch.tensor(step + 1)},
             checkpoint_id=os.path.join(ckpt, folder))
    if rank == 0:                                            # dcp.save returned: the folder is complete
        with open(latest + ".tmp", "w") as f:
            f.write(folder)
        os.replace(latest + ".tmp", latest)                  # atomic: old pointer or new, never half
        for old in sorted(os.listdir(ckpt)):
            if old.startswith("step") and int(old[4:]) <= step + 1 - 2:   # keep the last 2
                shutil.rmtree(os.path.join(ckpt, old))
dist.barrier()                                               # nobody leaves while another still saves
dist.destroy_process_group()
'''

# a fresh torchrun job on this busy machine has failed to start once in a while: say so, retry
for launch in (1, 2):
    # script and checkpoint: not in the checkout
    work = pathlib.Path(tempfile.mkdtemp(prefix="kit-lesson14-elastic-"))
    (work / "train.py").write_text(SCRIPT)
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2",
           "--max-restarts", "1", str(work / "train.py"), str(work / "ckpt")]
    t0 = time.monotonic()
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=240,
                          env=dict(os.environ, GLOO_SOCKET_IFNAME="lo"))
    print(f"$ torchrun ... --max-restarts 1 train.py   exit {proc.returncode}, "
          f"{time.monotonic() - t0:.0f} s")
    if proc.returncode == 0:
        break
    print("\n".join(line for line in proc.stderr.splitlines() if "Error" in line)[-2000:])
assert proc.returncode == 0, proc.stderr[-3000:]
runs = [json.loads(line[5:]) for line in proc.stdout.splitlines() if line.startswith("LOSS ")]
for attempt, step, loss in runs:
    print(f"  attempt {attempt}, step {step}: loss {loss:.6f}")
print("torchrun's log of the failure:", next(l for l in proc.stderr.splitlines()
                                             if "crashes in step 4" in l).strip())
print("left on disk:", sorted(os.listdir(work / "ckpt")), "latest ->",
      (work / "ckpt" / "latest").read_text())
print(f"your guesses: resumes at step {guess_resume_step}, same losses {guess_same_losses}")

# %% [markdown]
# The first attempt wrote checkpoints after steps 0 to 3 and died in step 4; torchrun restarted
# both workers (`TORCHELASTIC_RESTART_COUNT=1`), they loaded the checkpoint `latest` named
# (`step4`, written after step 3) and went on from step 4. On disk: the last two folders and the
# pointer. Whether the losses are those of an uninterrupted run, the plot compares with one
# process that trains on every 64-sample batch whole, without torchrun, without a crash.

# %%
torch.manual_seed(0)
ref = nn.Sequential(nn.Linear(16, 32), nn.Tanh(), nn.Linear(32, 1))
ref_opt = torch.optim.SGD(ref.parameters(), lr=0.1)
torch.manual_seed(1)
X = torch.randn(8, 64, 16)
Y = torch.tanh(X @ torch.randn(16, 1))
ref_losses = []
for step in range(8):
    ref_opt.zero_grad()
    loss = nn.functional.mse_loss(ref(X[step]), Y[step])
    loss.backward()
    ref_opt.step()
    ref_losses.append(loss.item())

fig, ax = plt.subplots(figsize=(8, 3.4))
ax.plot(range(8), ref_losses, "-", color="black", label="one process, no crash")
for attempt, color, mark in ((0, "#0072B2", "o"), (1, "#D55E00", "s")):
    pts = [(s, l) for a, s, l in runs if a == attempt]
    ax.plot(*zip(*pts), mark, color=color, label=f"torchrun attempt {attempt}")
ax.axvline(3.5, color="grey", ls=":", label="crash in step 4, resume from step 3's checkpoint")
ax.set(xlabel="step", ylabel="loss (64-sample batch)")
ax.set_title("Crash, restart, resume: the curve continues", fontsize="medium")
ax.legend(fontsize="small", loc="upper left", bbox_to_anchor=(1.01, 1.0), frameon=False)
plt.show()

# %% [markdown]
# ## What differs on real GPUs
#
# - fp16 and bf16 multiplies run on tensor cores (989 TFLOP/s dense on an H100, against 67 for
#   plain fp32): 16-bit training is first of all a speed win there. bf16 needs no loss scaling
#   and is the default on A100 and H100; fp16 with `GradScaler` is for GPUs without bf16 (V100, T4).
# - DCP writes each rank's shards to its own file, in parallel: on a cluster, to a shared
#   filesystem. `dcp.async_save` copies the shards to CPU memory and writes them in the
#   background while training goes on.
# - Crashes at scale are mostly hardware (a GPU, a link, a node); torchrun restarts on the same
#   nodes, and with `--nnodes MIN:MAX` it can also go on with fewer nodes, which is why loading at
#   another world size matters.
#
# ## Exercises
#
# **1.** A 7B-parameter model trained in bf16 with fp32 master weights and Adam. How many GB of
# model states in all? How many with ZeRO-3 (lesson 06) across 64 GPUs, per GPU?
#
# <details><summary>Answer</summary>
#
# 16 bytes × 7·10⁹ = 112 GB. Sharded across 64 GPUs: 112 / 64 = 1.75 GB per GPU.
# </details>
#
# **2.** A gradient entry of 3·10⁻⁹ in fp16. With which power-of-two loss scales S = 2ᵏ is it
# not flushed to zero? And from which k does a gradient of 1 overflow?
#
# <details><summary>Answer</summary>
#
# It survives when 3·10⁻⁹ · 2ᵏ ≥ 2⁻²⁵ ≈ 2.98·10⁻⁸, that is 2ᵏ ≥ 9.9, k ≥ 4 (2⁴ = 16 gives
# 4.8·10⁻⁸, which rounds to the smallest subnormal 6·10⁻⁸; k = 3 gives 2.4·10⁻⁸, which rounds to 0).
# A gradient of 1 overflows when 2ᵏ > 65,504: k ≥ 16 (65,536). GradScaler's start, 2¹⁶, is
# exactly there; it halves at once if a gradient that large exists.
# </details>
#
# **3.** The checkpoint of section 4 is loaded on 4 ranks with the same FSDP sharding. Which rows
# of the first layer's 256 × 64 weight does rank 3 read, and from which file?
#
# <details><summary>Answer</summary>
#
# FSDP shards along dimension 0: 256 / 4 = 64 rows per rank, rank 3 holds rows 192-255. At save
# time rank 1 held rows 128-255, so rank 3 reads them all from `__1_0.distcp`.
# </details>
#
# **4.** In section 6, a checkpoint is written after every step. The run is 10,000 steps, a
# checkpoint takes 30 s to write (blocking), a step 2 s, and one crash a day is expected. Is
# checkpointing every 100 steps a good trade?
#
# <details><summary>Answer</summary>
#
# 10,000 steps × 2 s = 20,000 s ≈ 5.6 h, so about a quarter of a crash per run. Every 100
# steps: 100 checkpoints × 30 s = 3,000 s (15% of the run). A crash loses on average half an
# interval, 50 steps × 2 s = 100 s, times 0.23 crashes ≈ 23 s. Far too often: the expected loss
# is tiny next to the writing cost. Young's rule (interval ≈ √(2 × write cost × mean time between
# failures) = √(2 × 30 × 86,400) ≈ 2,280 s ≈ 1,140 steps) says every thousand-odd steps, or use
# `dcp.async_save` to hide most of the 30 s.
# </details>
#
# ## Check against one process
#
# Two checks. The torchrun curve, crash and resume included, equals one uninterrupted process
# (the 2-rank DDP mean of two 32-sample halves is the 64-sample mean). And `Join`: one process
# replays rank 0's and rank 1's batches, averaging the two gradients in the first 3 steps and
# halving rank 0's alone in the last 2 (rank 1 shadowing with zeros, DDP dividing by the world
# size it started with, 2), and must land on the ranks' weights.

# %%
resumed = sorted((s, l) for a, s, l in runs if (a == 0 and s < 4) or a == 1)
assert [s for s, _ in resumed] == list(range(8)), resumed
assert max(abs(l - r) for (_, l), r in zip(resumed, ref_losses)) < 1e-5


def batches(r):                         # the same batches as on rank r in section 5
    g = torch.Generator().manual_seed(100 + r)
    return [(torch.randn(4, 8, generator=g), torch.randn(4, 1, generator=g))
            for _ in range(5 if r == 0 else 3)]


torch.manual_seed(0)
one = nn.Linear(8, 1)
opt1 = torch.optim.SGD(one.parameters(), lr=0.1)
b0, b1 = batches(0), batches(1)
for i in range(5):
    grads = []
    for xb, yb in ([b0[i], b1[i]] if i < 3 else [b0[i]]):
        one.zero_grad()
        nn.functional.mse_loss(one(xb), yb).backward()
        grads.append([p.grad.clone() for p in one.parameters()])
    for p, *gs in zip(one.parameters(), *grads):
        p.grad = sum(gs) / 2                 # both ranks: the mean; rank 0 alone: half of its own
    opt1.step()
for a, b in zip(joined, one.parameters()):
    assert torch.allclose(a, b, atol=1e-6), (a, b)
import shutil
for folder in (ckpt_dir, work):                # the temporary checkpoints and script
    shutil.rmtree(folder, ignore_errors=True)
"check passed"
