# %% [markdown]
# # 11 · Tensor parallel and sequence parallel
#
# Lesson 05 split the model **between** layers. Tensor parallelism splits **inside** every layer:
# each of t ranks holds 1/t of every weight matrix, computes 1/t of every multiply, and the ranks
# talk inside every layer (Shoeybi et al., "Megatron-LM", 2019). Sequence parallelism
# (Korthikanti et al., "Reducing Activation Recomputation in Large Transformer Models", 2022)
# then splits what tensor parallelism leaves whole: the LayerNorms' activations, along the
# sequence.
#
# Words used below:
# - **t**: the tensor-parallel size (here 2: our two ranks).
# - **Column-parallel** `Linear`: each rank holds some of the weight's output rows, so it
#   computes some of the output features. **Row-parallel**: each rank holds some input columns,
#   so it computes a **partial sum** of every output feature.
# - b, s, h: batch, sequence length, hidden size; a transformer layer's activations are b·s·h.
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
# ## 1. Megatron's MLP split, by hand
#
# A transformer's MLP is y = GELU(x Aᵀ) Bᵀ, with A of shape 4h × h and B of shape h × 4h.
# Megatron splits A by rows (columns in the paper's Y = GeLU(XA) notation, where A is h × 4h;
# column-parallel: rank r computes its 4h/t hidden features, no talking,
# since GELU works feature by feature) and B by columns (row-parallel: rank r multiplies its 4h/t
# features by its 4h/t columns of B, a partial sum of y). One **all-reduce** adds the partial sums.
#
# Backward mirrors it: each rank's slice of A gives a partial gradient of x, so the gradient of x
# needs one all-reduce too. Megatron names the two operators:
# - **f**: identity forward, all-reduce backward (in front of the column-parallel `Linear`);
# - **g**: all-reduce forward, identity backward (after the row-parallel `Linear`).
#
# **Predict:** for x of b·s·h = 4 × 8 × 64 floats, how many all-reduces does one forward and
# backward of this MLP make, and how many bytes does each carry?

# %%
guess_calls, guess_bytes_each = None, None

# %%
%%distributed
from torch import nn

class F(torch.autograd.Function):          # Megatron's f
    @staticmethod
    def forward(ctx, x):
        return x.view_as(x)
    @staticmethod
    def backward(ctx, grad):
        grad = grad.clone()
        dist.all_reduce(grad)
        calls.append(grad.numel() * grad.element_size())
        return grad

class G(torch.autograd.Function):          # Megatron's g
    @staticmethod
    def forward(ctx, x):
        x = x.clone()
        dist.all_reduce(x)
        calls.append(x.numel() * x.element_size())
        return x
    @staticmethod
    def backward(ctx, grad):
        return grad

b, s, h, t = 4, 8, 64, world_size
torch.manual_seed(0)
A, B = nn.Linear(h, 4 * h, bias=False), nn.Linear(4 * h, h, bias=False)     # the full MLP, on every rank
A_r = A.weight.detach().chunk(t, dim=0)[rank].clone().requires_grad_()      # my 4h/t rows of A
B_r = B.weight.detach().chunk(t, dim=1)[rank].clone().requires_grad_()      # my 4h/t columns of B
torch.manual_seed(1)
x = torch.randn(b, s, h, requires_grad=True)

calls = []
# the whole tensor-parallel MLP
y = G.apply(nn.functional.gelu(F.apply(x) @ A_r.T) @ B_r.T)
y.square().mean().backward()
print(f"rank {rank}: {len(calls)} all-reduces of {sorted(set(calls))} bytes; A_r {tuple(A_r.shape)}, "
      f"B_r {tuple(B_r.shape)}")

# %%
%%distributed
x1 = x.detach().clone().requires_grad_()          # the same MLP, unsplit, in this one process
y1 = B(nn.functional.gelu(A(x1)))
y1.square().mean().backward()
print(f"rank {rank}: output differs by {(y - y1).abs().max():.1e}, input gradient by "
      f"{(x.grad - x1.grad).abs().max():.1e}, my slice of A's gradient by "
      f"{(A_r.grad - A.weight.grad.chunk(t, 0)[rank]).abs().max():.1e}")

# %%
print(f"your guess: {guess_calls} all-reduces of {guess_bytes_each} bytes each")

# %% [markdown]
# Two all-reduces, one in forward (g) and one in backward (f), each of b·s·h × 4 bytes =
# 8,192 bytes; the output and every gradient equal the unsplit MLP's (to float rounding). The
# attention block is split the same way: q, k and v column-parallel **by heads** (each rank
# computes whole heads, so attention itself needs no talking), the output projection
# row-parallel. So a transformer layer makes **2 all-reduces in forward and 2 in backward**, each
# of b·s·h elements.

# %% [markdown]
# ## 2. A whole GPT, by hand and with `parallelize_module`, collectives counted
#
# The kit's `tensor_parallel` applies this split to every block of a small GPT (h = 64, 4 heads,
# 2 layers, b = 4 sequences of s = 32 tokens) with the same f and g; `torch_tensor_parallel` asks
# torch to do it: `parallelize_module` with `ColwiseParallel` for q, k, v and the MLP's first
# `Linear`, `RowwiseParallel` for the others, on a one-dimensional `DeviceMesh`. torch then
# stores the weights as DTensors and inserts the collectives itself. Both train 3 steps, count
# every collective, and compare with one process. Read them beside this lesson, in
# `kit/experiments/parallel/tensor.py`: f and g are `copy_to_tp` and `reduce_from_tp`, the layers
# `ColumnParallelLinear` and `RowParallelLinear`, and `check_tp` the check run below.
#
# **Predict:** how many all-reduces, and how many payload bytes in all, for 3 steps of 2 layers?

# %%
guess_tp_calls, guess_tp_bytes = None, None

# %%
%%distributed
from kit.experiments import check_tp
hand, torch_tp = check_tp(impl="hand"), check_tp(impl="torch")
if rank == 0:
    pred = hand["bytes"]["predicted"]["tp/all_reduce"]
    print(f"predicted: 4 x 2 layers x 3 steps = {pred['calls']} all-reduces, {pred['payload_bytes']:,} "
          f"bytes (4 x 32 x 64 x 4 = {4 * 32 * 64 * 4:,} each)")
    for name, r in (("by hand", hand), ("parallelize_module", torch_tp)):
        counted = {k: (v["calls"], int(v["payload_bytes"])) for k, v in r["bytes"]["measured"].items()}
        print(f"{name:>18}: (calls, bytes) {counted}; weights differ from one process by "
              f"{r['diffs']['weights']:.1e} (training moved them {r['weights_moved']:.1e})")

# %%
print(f"your guess: {guess_tp_calls} all-reduces, {guess_tp_bytes} bytes")

# %% [markdown]
# Both do 24 all-reduces of 32 KiB, the count predicted, and end at the weights one process
# reaches on the whole batch. (For torch's version the kit counts the functional collectives
# that DTensor issues.)
#
# ## 3. Sequence parallel: the activations the split leaves whole
#
# Tensor parallelism splits q, k, v, the attention output and the 4h-wide MLP tensors over t,
# but the LayerNorms and the residual stream run on every rank on the whole b·s·h. Sequence
# parallelism cuts those along the sequence: each rank holds s/t tokens there. Where the
# column-parallel `Linear` needs all tokens, an **all-gather** collects them; where the
# row-parallel `Linear` produced partial sums, a **reduce-scatter** adds them and hands each rank
# its tokens (`kit/experiments/parallel/sequence.py`: `sequence_parallel`, and `check_sp` below).
# An all-reduce *is* a reduce-scatter followed by an all-gather, so each all-reduce
# it replaces costs the same bytes on the wire. The backward's re-gathers and the two gathers at
# the ends of the blocks (below) come on top: 37.5% more bytes per rank here. Megatron overlaps
# the re-gathers with the input-gradient multiplies, and the reduce-scatters of those input
# gradients with the weight-gradient multiplies (Korthikanti et al. 2022; Megatron-LM's
# `LinearWithGradAccumulationAndAsyncCommunication.backward`).
#
# **Predict:** the activations one block saves for backward, per rank, for one process, tensor
# parallel (t = 2) and sequence parallel. The kit's count (fp32, no dropout, flash attention that
# keeps no s × s scores): per block 16·b·s·h floats, of which 12 (q, k, v, attention output, the
# two 4h tensors) are split by tensor parallelism and 4 (LayerNorm inputs and outputs) only by
# sequence parallelism, plus a few floats per token.

# %%
guess_act_one, guess_act_tp, guess_act_sp = None, None, None

# %%
%%distributed
from kit.experiments import check_sp
sp = check_sp()
if rank == 0:
    a_tp, a_sp = hand["activations"], sp["activations"]
    acts = {"one process": (a_tp["single_process_bytes_per_layer"],
                            a_tp["predicted_one_process"]["bytes"]),
            "tensor parallel": (a_tp["measured_bytes_per_layer"], a_tp["predicted"]["bytes"]),
            "sequence parallel": (a_sp["measured_bytes_per_layer"], a_sp["predicted"]["bytes"])}
    for name, (m, p) in acts.items():
        print(f"{name:>17}: measured {m:7,} bytes per block, predicted {p:9,.0f}")
    print("sequence parallel's collectives, 3 steps:")
    for k, v in sp["bytes"]["measured"].items():
        want = sp["bytes"]["predicted"][k]
        print(f"  {k:>20}: measured {v['calls']:2d} calls, {int(v['payload_bytes']):9,} bytes; "
              f"predicted {want['calls']:2d}, {int(want['payload_bytes']):9,}")
    print(f"weights differ from one process by {sp['diffs']['weights']:.1e}")

# %%
%dist pull acts --ranks 0
print(f"your guesses: one process {guess_act_one}, tensor parallel {guess_act_tp}, sequence parallel "
      f"{guess_act_sp}")
import matplotlib.pyplot as plt
fig, ax = plt.subplots(figsize=(6.5, 3.2))
names = list(acts)
ax.bar([i - 0.2 for i in range(3)], [acts[n][0] / 1024 for n in names], 0.4, color="#0072B2",
       label="measured (saved tensors)")
ax.bar([i + 0.2 for i in range(3)], [acts[n][1] / 1024 for n in names], 0.4, color="white",
       edgecolor="black", hatch="..", label="predicted")
ax.set_xticks(range(3), names)
ax.set(ylabel="KiB saved per block, per rank")
ax.set_title("Activations of one block: t = 2", fontsize="medium")
ax.legend(fontsize="small")
plt.show()

# %% [markdown]
# Tensor parallelism leaves the replicated LayerNorm part on every rank; sequence parallelism
# divides **every** term by t: its measured bytes are half of one process's. The collectives:
# all-gathers and reduce-scatters instead of all-reduces, with 2 more all-gathers per layer in
# backward (the LayerNorm outputs are gathered again instead of kept whole), one all-gather at
# each end of the blocks (forward before the head, backward after the embedding: 2 × 2 layers + 2
# = 6 a step beyond tensor parallel's, so 42 in 3 steps) and one all-reduce of the LayerNorms'
# and biases' gradients per step (each rank saw only its tokens).
#
# ## 4. Why tensor parallel stays inside a node
#
# Per layer and micro-batch, tensor parallelism all-reduces b·s·h activations 4 times. For
# Llama-3 70B (h = 8,192, 80 layers) with b = 1, s = 4,096 tokens in bf16, that is 64 MiB per
# all-reduce. The kit's planner prices one such all-reduce on 8 H100s two ways: inside a node
# (NVLink, 450 GB/s per GPU each way at peak) or one GPU in each of 8 nodes (InfiniBand, the
# GPU's 50 GB/s NIC). It prices neither at its peak: a link reaches a fraction of it that grows
# with the message (NCCL's measured bus bandwidth), so the cell prints the effective bus bandwidth
# each price implies, 2(t-1)/t × bytes / time. Next to it, the compute of one layer's forward and backward on the same 8 GPUs,
# at an assumed 52% of the dense bf16 peak (what Megatron-LM's largest runs reached, Narayanan et
# al. 2021; lesson 15 shows what such a share means; everything here is
# **predicted**, nothing measured).
#
# **Predict:** which is larger across nodes: the layer's tensor-parallel communication or its compute?

# %%
guess_ib_vs_compute = None   # "communication" or "compute"

# %%
from kit.experiments import MODELS, cluster_spec, planned_allreduce_s

m, c, t, s = MODELS["llama3-70b"], cluster_spec(nodes=128, gpus_per_node=8, accelerator="h100"), 8, 4096
nbytes = 1 * s * m.hidden * 2
# tp ranks 1 apart: the same node; 8 apart: one per node
comm_ms = {"NVLink (one node)": 4 * planned_allreduce_s(nbytes, t, 1, c) * 1e3,
           "InfiniBand (8 nodes)": 4 * planned_allreduce_s(nbytes, t, 8, c) * 1e3}
# FLOP per token of one layer: 6 per parameter (forward and backward) plus the attention scores,
# 12·h·s (PaLM, App. B), as the planner's model_flops_per_token counts them
layer_flops_per_token = 6 * sum(m.layer_params()) + 12 * m.hidden * s
compute_ms = layer_flops_per_token * s / t / (c.accelerator.peak_tflops["bf16"] * 1e12 * 0.52) * 1e3
print(f"your guess: {guess_ib_vs_compute}")
print(f"one layer, one micro-batch of {s} tokens, t = {t} (predicted):")
print(f"  compute, forward + backward   {compute_ms:5.1f} ms")
for name, ms in comm_ms.items():
    busbw_gbps = 2 * (t - 1) / t * nbytes / (ms / 4 * 1e-3) / 1e9
    print(f"  4 all-reduces of {nbytes / 2**20:.0f} MiB, {name:<20} {ms:4.1f} ms = "
          f"{ms / compute_ms:.1f}x the compute (effective bus bandwidth {busbw_gbps:.0f} GB/s)")

# %% [markdown]
# Inside a node the communication is about half the compute (and Megatron overlaps part of it);
# across nodes it is about twice the compute, on every layer, in every micro-batch. That is why
# the planner only considers tensor-parallel groups that fit in a node (t divides 8), and why
# large runs put t = 8 on NVLink and the other dimensions across nodes (lesson 13).
#
# ### Hiding the all-reduce behind the next matmul (emulated)
#
# A row-parallel layer's all-reduce need not wait for the whole multiply: split the rows (tokens)
# into k chunks, and send chunk i's partial sums while chunk i+1 is multiplied. Only the last
# chunk's all-reduce stays exposed. This is the idea of **async tensor parallelism** (torch's
# `torch.distributed._symmetric_memory`, torchtitan's `enable_async_tensor_parallel`) and of
# Megatron's communication overlap; on GPUs it needs the collective and the matmul on separate
# streams, which a 2-core CPU with gloo cannot give fairly. So the link is **emulated**: a thread
# that sleeps for each chunk's all-reduce time, one message after another (a link is FIFO), set to
# half the compute, as the NVLink row above predicted. The matmuls are real (one thread).
#
# **Predict:** with 4 chunks and communication half the compute, what share of the unoverlapped
# step does the overlapped one take?

# %%
guess_overlap_share = None

# %%
import time
from concurrent.futures import ThreadPoolExecutor
from statistics import median

import torch
from kit.experiments import conclude, paired_verdict, summary_line

threads_before = torch.get_num_threads()
torch.set_num_threads(1)
# this rank's rows of the input, its weight shard
x_rows, w_shard = torch.randn(1024, 512), torch.randn(512, 512)
chunks = 4
wall_s = []
for _ in range(7):
    t0 = time.perf_counter()
    for part in x_rows.chunk(chunks):
        part @ w_shard
    wall_s.append(time.perf_counter() - t0)
# what one layer's multiplies (its k chunks) take here, now
compute_s = median(wall_s)
# each chunk's all-reduce, emulated
comm_s = 0.5 * compute_s / chunks
link = ThreadPoolExecutor(max_workers=1)                               # the link: one message at a time


def layers(overlap, n=6):
    """Wall seconds of n layers in a row (one is C + M, a few ms: too short to time alone here)."""
    t0 = time.perf_counter()
    for _ in range(n):
        sent = []
        for part in x_rows.chunk(chunks):
            y = part @ w_shard                                         # partial sums of these rows
            if overlap:
                # on the link while the next chunk computes
                sent.append(link.submit(time.sleep, comm_s))
        if not overlap:
            # the layer's all-reduce after its multiplies: one wait, as long as the k chunks' together
            time.sleep(chunks * comm_s)
        for done in sent:
            # the next layer needs every row's sum (attention mixes tokens)
            done.result()
    return time.perf_counter() - t0


layers(True), layers(False)
walls = {False: [], True: []}
for pair in range(9):
    for overlap in ((False, True) if pair % 2 == 0 else (True, False)):
        walls[overlap].append(1e3 * layers(overlap) / 6)
torch.set_num_threads(threads_before)
overlap_verdict = paired_verdict(walls[False], walls[True])
overlap_verdict["summary"] = summary_line(overlap_verdict, "all-reduce after the layer",
                                          "overlapped (emulated link)")
print(f"your guess: {guess_overlap_share}")
print(f"per layer: compute C {1e3 * compute_s:.1f} ms, "
      f"emulated communication M {1e3 * chunks * comm_s:.1f} ms")
print(f"medians: in turn {median(walls[False]):.1f} ms, overlapped {median(walls[True]):.1f} ms; "
      f"formula (C + M/k) / (C + M) = {(1 + 0.5 / chunks) / 1.5:.2f}")

# %% tags=["verdict"]
conclude(overlap_verdict, faster="Overlapped, only the last chunk's communication is exposed: the layer "
                                 "is faster.",
         same="This machine's noise hid the overlap in this run.",
         slower="The overlapped layer measured slower: something disturbed the runs, rerun this cell.");

# %% [markdown]
# With a core to itself the overlapped layer takes about (C + M/k) / (C + M) of the other's time,
# here 0.75: each layer waits for its last chunk's all-reduce, since the next layer needs every
# token's sum. On this shared machine the multiplies themselves wait for the core, C is one timing
# taken before the loop, and a sleep's wake-up can come late when the cores are busy, so the
# verdict above says what this run could show. In three runs of this cell at load 2.7 on 2 cores,
# the ratio was 0.80 and 0.82 (both "faster"), and once 0.48, when the layers that wait measured
# 15.5 ms where C + M was 9.7: something else had the core. No ordering is claimed here.
# And 0.75 is a best case: on a real link k messages of M/k cost more than one of M (the effective
# bus bandwidth above grows with the message), and on a GPU the multiplies beside a collective run
# slower, sharing the chip with it. The planner models the overlap with `tp_overlap=True` (only what
# the matmuls cannot cover stays exposed):

# %%
from kit.experiments import plan
for overlap in (False, True):
    top = plan("llama3-70b", nodes=128, gpus_per_node=8, accelerator="h100", seq_len=4096, tp=8,
               tp_overlap=overlap).layouts[0]
    print(f"tp_overlap={overlap!s:5}: {top.name()}: step {top.step_s:.2f} s, MFU {top.mfu:.0%} "
          f"(predicted)")

# %% [markdown]
# ## 5. Clipping the gradient norm across shards
#
# Gradient clipping scales every gradient by max_norm / ‖g‖ when the norm ‖g‖ of **all** gradients
# together is larger than max_norm. Under tensor parallelism no rank holds all of them: a split
# weight's gradient is spread over the ranks, a replicated one (the row-parallel bias) is on every
# rank whole. The global norm is √(Σ over ranks of the split gradients' squares + the replicated
# ones' squares counted once). A rank that clips with the norm of what it holds scales by its own
# factor: the ranks' copies of the replicated parameters drift apart.
#
# **Predict:** on 2 ranks, is each rank's local norm larger or smaller than the global one?

# %%
guess_local_norm = None   # "larger" or "smaller"

# %%
%%distributed
from torch import nn
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module

def clip_model():
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(16, 64), nn.ReLU(), nn.Linear(64, 16))

xc = torch.randn(8, 16, generator=torch.Generator().manual_seed(1))   # the same input on both ranks (TP)
one = clip_model()
one(xc).pow(2).sum().backward()
norm_one = float(nn.utils.clip_grad_norm_(one.parameters(), max_norm=1.0))   # one process: the reference
mesh = init_device_mesh("cpu", (world_size,))
tpm = parallelize_module(clip_model(), mesh, {"0": ColwiseParallel(), "2": RowwiseParallel()})
tpm(xc).pow(2).sum().backward()
grads = [p.grad for p in tpm.parameters()]
# what this rank holds
local = sum(float(g.to_local().pow(2).sum()) for g in grads) ** 0.5
split = torch.tensor(sum(float(g.to_local().pow(2).sum()) for g in grads if g.placements[0].is_shard()),
                     dtype=torch.float64)
# split: summed over ranks
dist.all_reduce(split)
by_hand = (float(split) + sum(float(g.to_local().pow(2).sum()) for g in grads
                              if not g.placements[0].is_shard())) ** 0.5            # replicated: once
norm_torch = nn.utils.clip_grad_norm_(tpm.parameters(), max_norm=1.0)               # DTensor-aware
print(f"rank {rank}: local norm {local:.4f}; by hand {by_hand:.4f}; clip_grad_norm_ "
      f"{float(norm_torch.full_tensor()):.4f}; one process {norm_one:.4f}; placements "
      f"{[p.placements[0] for p in tpm.parameters()]}")

# %% [markdown]
# Each rank's local norm is smaller than the global one (it misses the other rank's half of every
# split gradient), and differs between the ranks. `torch.nn.utils.clip_grad_norm_` gets it right
# because the gradients are DTensors: it computes each one's norm and reduces the split ones across
# the mesh, the sum the cell did by hand, and returns the norm as a DTensor. Every parameter must
# be a DTensor for that: on torch 2.13 a plain-tensor parameter beside DTensor ones (a LayerNorm
# left out of `parallelize_module`) makes it refuse with "got mixed torch.Tensor and DTensor".
# FSDP2 and pipeline stages need the same care: each rank holds a shard, or other layers, and the
# squares must be summed over every group that splits the parameters (Megatron-LM all-reduces the
# squared norm over the model-parallel group, once).
#
# ## 6. The loss over a split vocabulary
#
# The output layer multiplies h by a vocabulary of V words (128,256 in Llama 3): its weight is the
# largest single matrix, and its logits, b·s·V floats, the largest activation (the planner charges
# them separately). Megatron splits that layer by columns, so each rank computes the logits of V/t
# words, and computes the cross-entropy **without ever gathering them**: per token it needs the
# largest logit (for a stable softmax), the sum of the exponentials, and the target's logit, and
# each is a reduction over the vocabulary that the ranks can do in parts:
# 1. each rank's max over its words, then an all-reduce (max);
# 2. each rank's Σ exp(logit - max), then an all-reduce (sum);
# 3. the target's logit from the rank that holds that word (0 elsewhere), then an all-reduce (sum).
#
# loss = log Σ exp - (target logit - max). torch calls this **loss parallel**
# (`torch.distributed.tensor.parallel.loss_parallel`).
#
# **Predict:** b·s = 64 tokens, V = 1,000 words, t = 2: how many floats does each rank all-reduce,
# against the 64,000 an all-gather of the logits would collect?

# %%
guess_vocab_floats = None

# %%
%%distributed
V, T = 1000, 64
gv = torch.Generator().manual_seed(3)
# the same on every rank, for the check
logits_full = torch.randn(T, V, generator=gv) * 3
target = torch.randint(0, V, (T,), generator=gv)
lo, hi = rank * V // world_size, (rank + 1) * V // world_size       # this rank's words
mine = logits_full[:, lo:hi]
reduced = 0
m = mine.max(dim=1).values
dist.all_reduce(m, op=dist.ReduceOp.MAX)
sum_exp = (mine - m[:, None]).exp().sum(dim=1)
dist.all_reduce(sum_exp)
here = (target >= lo) & (target < hi)
picked = torch.where(here, mine[torch.arange(T), (target - lo).clamp(0, hi - lo - 1)], torch.zeros(T))
dist.all_reduce(picked)
reduced = m.numel() + sum_exp.numel() + picked.numel()
vocab_loss = (sum_exp.log() - (picked - m)).mean()
full_loss = torch.nn.functional.cross_entropy(logits_full, target)
print(f"rank {rank}: words {lo}-{hi - 1}; loss {vocab_loss.item():.6f}, one process "
      f"{full_loss.item():.6f}; all-reduced {reduced} floats (3 x {T}), against {T * V:,} for gathering "
      f"the logits")

# %% [markdown]
# The loss is one process's to rounding, and each rank all-reduced 3 × 64 floats instead of
# gathering 64,000: the logits never leave their rank. The backward is as local: the gradient of
# the loss for a rank's logits is softmax − one-hot of the target, computable from the same three
# reduced numbers per token. For Llama 3's 128,256 words and 8,192 tokens per micro-batch in bf16,
# the logits are about 2 GiB per micro-batch; split over t = 8 ranks, about 250 MiB each.
#
# ## What differs on real GPUs
#
# - The collectives run on NVLink and NCCL; Megatron overlaps some of them with compute, and
#   sequence parallelism's all-gather in backward with the weight-gradient multiply.
# - Smaller per-GPU multiplies are less efficient: t = 8 gives each GPU 1/8 of every matrix,
#   which for small h leaves tensor cores idle.
#
# ## Exercises
#
# **1.** A layer with h = 4,096, b = 1, s = 8,192, bf16, t = 4. How many bytes does each
# all-reduce carry, and how many does each rank send on a ring per all-reduce?
#
# <details><summary>Answer</summary>
#
# b·s·h·2 = 8,192 × 4,096 × 2 = 64 MiB (67,108,864 bytes). A ring all-reduce sends 2(t-1)/t of
# it per rank: 1.5 × 64 = 96 MiB.
# </details>
#
# **2.** The MLP of section 1 with t = 4: what shapes do A_r and B_r have, and how many
# all-reduces does one forward and backward make?
#
# <details><summary>Answer</summary>
#
# A is 256 × 64, so A_r is 64 × 64 (256/4 rows); B is 64 × 256, so B_r is 64 × 64 (256/4
# columns). Still 2 all-reduces, whatever t: one in g (forward), one in f (backward).
# </details>
#
# **3.** With sequence parallelism and t = 4, what share of one process's per-block activations
# does each rank keep? And with tensor parallelism alone (use 16 floats per token and width,
# 12 of them split)?
#
# <details><summary>Answer</summary>
#
# Sequence parallel: 1/4, every term is divided. Tensor parallel alone: (4 + 12/4) / 16 = 7/16
# ≈ 44%, leaving out the few floats per token.
# </details>
#
# ## Check against one process
#
# Tensor parallel by hand, with `parallelize_module`, and sequence parallel: each trained 3 steps
# on 2 ranks and compared with one process training the same model on the same batches. The
# weights must agree, training must have moved them, and the counted all-reduces must be the
# predicted ones. The gradient norm across shards, and the loss over the split vocabulary, must
# be one process's.

# %%
%%distributed
for r in (hand, torch_tp, sp):
    assert r["max_abs_diff"] < 1e-4, (r["impl"], r["diffs"])  # weights and losses
    assert r["weights_moved"] > 100 * r["diffs"]["weights"], r["impl"]
for r in (hand, torch_tp):
    want = r["bytes"]["predicted"]["tp/all_reduce"]
    got = r["bytes"]["measured"]["tp/all_reduce"]
    assert got["calls"] == want["calls"] and got["payload_bytes"] == want["payload_bytes"], \
        (r["impl"], got, want)
act = sp["activations"]
assert act["measured_bytes_per_layer"] * world_size <= act["single_process_bytes_per_layer"] * 1.02
# the clipped norm across shards is one process's; what a rank holds alone is less
assert abs(float(norm_torch.full_tensor()) - norm_one) < 1e-4 * norm_one
assert abs(by_hand - norm_one) < 1e-4 * norm_one
assert local < norm_one
# the split vocabulary's loss
assert abs(vocab_loss.item() - full_loss.item()) < 1e-5 and reduced == 3 * T
"check passed"
