# %% [markdown]
# # 05 · Model parallel and pipeline parallel
#
# Data parallelism (lessons 02-04) copies the whole model onto every device. When the model
# does not fit on one device, split **the model** instead: the first layers on device 0, the
# next on device 1, and so on. Each device is a **stage**; the activations travel from stage to
# stage in forward, and their gradients travel back in backward.
#
# A word on names: in this lesson "model parallel" means this split **between** layers (inter-layer),
# as in GPipe. Megatron-LM and the Ultra-Scale Playbook usually mean **tensor** parallel by it: each
# layer's matrices split across devices (intra-layer), with collectives inside every layer. That
# one is not taught here; the end of this lesson says where it goes.
#
# Words used below:
# - **Stage**: the consecutive layers one rank holds. With p ranks there are p stages.
# - **Point-to-point**: `dist.send` / `dist.recv` move a tensor from one rank to one other rank
#   (lesson 00's collectives involve every rank).
# - **Micro-batch**: a slice of the batch. Pipelining feeds the stages micro-batches one after
#   another, so that several stages can work at once.
# - **Bubble**: the fraction of a step a stage sits idle, waiting for its neighbour.
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
# ## 1. A model split across two ranks, by hand
#
# A small MLP, 32 → 256 → 256 → 4. Rank 0 holds the first `Linear` and its `ReLU`; rank 1 the
# rest and the loss. One training step:
# 1. rank 0 runs its layers and **sends** the activation (batch × 256 floats) to rank 1;
# 2. rank 1 **receives** it, runs its layers and the loss, and runs backward down to its input;
# 3. rank 1 sends the gradient of that input back; rank 0 receives it and finishes backward.
#
# **Predict:** with a batch of 48, how many bytes cross between the ranks in one step? And how
# many bytes would DDP's all-reduce move for this model's gradients? Write your numbers in the
# next cell first.

# %%
guess_p2p_bytes, guess_ddp_bytes = None, None

# %%
%%distributed
from torch import nn

def make():
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(32, 256), nn.ReLU(), nn.Linear(256, 256), nn.ReLU(),
                         nn.Linear(256, 4)).to(device)

full = make()
stage = full[:2] if rank == 0 else full[2:]      # rank 0: layers 0-1; rank 1: layers 2-4 and the loss
torch.manual_seed(1)
X, Y = torch.randn(48, 32, device=device), torch.randn(48, 4, device=device)

if rank == 0:
    h = stage(X)
    dist.send(h.detach(), dst=1)                  # forward: activation to rank 1
    grad_h = torch.empty_like(h)
    dist.recv(grad_h, src=1)                      # backward: its gradient comes back
    h.backward(grad_h)
    moved = h.numel() * h.element_size() + grad_h.numel() * grad_h.element_size()
else:
    h = torch.empty(48, 256, device=device)
    dist.recv(h, src=0)
    h.requires_grad_()
    loss = nn.functional.mse_loss(stage(h), Y)
    loss.backward()                               # gradients of rank 1's layers and of h
    dist.send(h.grad, dst=0)
    print(f"loss {loss.item():.4f}")
n_params = sum(p.numel() for p in full.parameters())
if rank == 0:
    print(f"point-to-point per step: {moved:,} bytes (activation + its gradient)")
    print(f"all the gradients, as DDP would all-reduce them: {4 * n_params:,} bytes")
print(f"rank {rank} holds {sum(p.numel() for p in stage.parameters()):,} of {n_params:,} parameters")

# %% [markdown]
# 48 × 256 × 4 bytes each way: 98,304 bytes in all, about 3x less than this tiny model's 301 KB of
# gradients. The gap grows with the model: the activation between two stages has the size of
# one layer's output, the gradients the size of all the weights. And each rank holds only its
# part of the weights, gradients and Adam state.

# %% [markdown]
# ## 2. Naive model parallel: one stage works at a time
#
# In the cell above rank 1 waited in `recv` while rank 0 ran forward, and rank 0 waited while
# rank 1 ran. With p stages of equal cost, each stage computes 1/p of the step and waits the rest.
#
# **Predict:** on 2 ranks, what fraction of the step is each stage idle? (Keep it in
# `guess_idle` below.)
#
# The kit's `model_parallel` strategy does the same on the 1024-wide MLP of lessons 03-04 (cut
# into 2 stages of similar measured cost), and records every stage's compute on one clock.

# %%
import kit
from kit.experiments import ExperimentConfig, run
from kit.plots import step_timeline

guess_idle = None   # your fraction
mp = run(ExperimentConfig(strategy="model_parallel", workload="mlp", batch_size=64, steps=4,
                          warmup_steps=1),
         cluster=kit.current_cluster())
print(f"your guess {guess_idle}; idle (bubble) measured {mp['pipeline']['measured']:.0%}, formula "
      f"(p-1)/p = {mp['pipeline']['formula']:.0%}")
print(mp["notes"][0])
step_timeline(mp, title="Naive model parallel: one stage computes while the other waits")

# %% [markdown]
# The timeline shows it: while one rank computes (solid), the other waits in `recv` (crossed).
# The measured idle share is usually above (p-1)/p: the two stages are not exactly equal (the slower
# one sets the pace), and sending, receiving and Python between the operations take time too.
# Section 4 splits that difference.

# %% [markdown]
# ## 3. Pipelining: micro-batches, GPipe and 1F1B
#
# GPipe (Huang et al., 2018) cuts the batch into m micro-batches. Stage 0 sends micro-batch 1 on
# and starts micro-batch 2 at once, so both stages work at the same time. Counting time in
# slots of one micro-batch's work on one stage, the forward pass takes m + p - 1 slots, of which
# each stage works m and waits p - 1 (filling and draining the pipe); the backward pass again:
#
#   bubble = (p - 1) / (m + p - 1)
#
# GPipe runs all forwards, then all backwards. **1F1B** (one forward, one backward; Narayanan et
# al., PipeDream, 2019, and its flush variant, 2021) starts a micro-batch's backward as soon as
# the last stage has its forward, and alternates. Here are the two orders the kit's `pipeline`
# strategy runs, for p = 2 and m = 4 (`F2` = forward of micro-batch 2):

# %%
%%distributed
from kit.experiments import pipeline_schedule as schedule
for kind in ("gpipe", "1f1b"):
    # each entry is (op, chunk, micro-batch); the chunk is 0 unless the schedule is interleaved (section
    # 6)
    print(f"{kind:>5}: " + " ".join(f"{op}{i}" for op, _, i in schedule(kind, rank, world_size, 4)))

# %% [markdown]
# **Predict:** (a) the bubble for p = 2 and m = 1, 2, 4, 8, 16, for each schedule; (b) a stage
# keeps a micro-batch's saved activations from its forward until its backward. How many
# micro-batches does stage 0 hold at most under GPipe, and under 1F1B? Write them down here
# before you run the cell that computes them:

# %%
guess_bubble = {1: None, 2: None, 4: None, 8: None, 16: None}   # m -> your bubble, both schedules
guess_held_gpipe, guess_held_1f1b = None, None                   # stage 0, at m = 16

# %%
print(f"your guesses: bubble {guess_bubble}; held at m = 16: GPipe {guess_held_gpipe}, 1F1B "
      f"{guess_held_1f1b}")
p = 2
for m in (1, 2, 4, 8, 16):
    print(f"m = {m:2d}: bubble (p-1)/(m+p-1) = {(p - 1) / (m + p - 1):5.1%} for both schedules; "
          f"micro-batches held by stage 0: GPipe {m:2d}, 1F1B {min(p, m)}")

# %% [markdown]
# This 1F1B does not shorten the bubble: the same m + p - 1 slots, the same idle ones, only in a
# different order. What it changes is memory: stage r holds at most p - r micro-batches (the ones
# still on their way through the later stages), where GPipe holds all m.
#
# Other schedules do shorten it (section 6 measures an interleaved one). **Interleaved 1F1B** (Narayanan et al., SC 2021,
# the Megatron-LM paper) gives each device v non-consecutive chunks of layers, so that filling
# and draining the pipe take v times fewer full-stage slots: the bubble is divided by v, at the
# price of v times more point-to-point messages. **Zero-bubble** schedules (Qi et al., 2023) split
# each backward into the gradient for the input (needed by the previous stage now) and the
# gradient for the weights (needed only at the optimizer step), and fill the idle slots with the
# latter.

# %% [markdown]
# ### Measure the activations, by hand
#
# The next cell runs the by-hand split of section 1 as a pipeline: the micro-batches in the
# order the kit's `schedule` gives, with non-blocking sends (`isend`; a blocking one could
# deadlock when both ranks send at once in 1F1B). The kit's `ActivationMeter` counts the bytes
# autograd saves for each micro-batch's backward (weights excluded); `live` adds a micro-batch's
# bytes at its forward and removes them at its backward.

# %%
%%distributed
from kit.experiments import ActivationMeter

def pipeline_step(kind, m):
    """One step of this rank's stage over m micro-batches in `kind` order; returns (loss, peak bytes)."""
    meter, held, sends = ActivationMeter(stage.parameters()), {}, []
    live = peak = 0
    loss = 0.0
    for op, _, i in schedule(kind, rank, world_size, m):
        if op == "F":
            with meter.record():
                if rank == 0:
                    out, inp = stage(X.chunk(m)[i].clone()), None
                    sends.append((dist.isend(out.detach(), 1), out))
                else:
                    inp = torch.empty(X.shape[0] // m, 256, device=device)
                    dist.recv(inp, 0)
                    inp.requires_grad_()
                    out = nn.functional.mse_loss(stage(inp), Y.chunk(m)[i].clone()) / m
                    loss += out.item()
            held[i] = (inp, out, meter.bytes)
            live += meter.bytes
            peak = max(peak, live)
        else:
            inp, out, nbytes = held.pop(i)
            if rank == 0:
                grad = torch.empty_like(out)
                dist.recv(grad, 1)
                out.backward(grad)
            else:
                out.backward()
                sends.append((dist.isend(inp.grad, 0), inp.grad))
            live -= nbytes                                   # this micro-batch's saved tensors are freed
    for work, _ in sends:
        work.wait()
    return loss, peak

peaks = {}
for kind in ("gpipe", "1f1b"):
    for m in (1, 2, 3, 4, 6, 8, 12, 16):
        stage.zero_grad()
        peaks[kind, m] = pipeline_step(kind, m)[1]
print("activation peak (bytes): " + ", ".join(f"{k} m={m}: {v:,}"
                                              for (k, m), v in peaks.items() if m in (1, 4, 16)))
peaks

# %% [markdown]
# ## 4. Measure the bubble: GPipe and 1F1B on the kit's MLP
#
# Now the timing, with the kit's `pipeline` strategy on the 1024-wide MLP, batch 64, for a few m.
# Every stage's forward and backward intervals are recorded on one clock shared by both ranks,
# and the bubble is measured as 1 - (sum of the stages' busy time) / (p × span of the step).

# %%
from kit.experiments import sweep

base = ExperimentConfig(strategy="pipeline", workload="mlp", batch_size=64, steps=3, warmup_steps=1)
ms = [1, 2, 4, 8, 16]
pipe = {kind: sweep(base.replace(schedule=kind), "micro_batches", ms, cluster=kit.current_cluster())
        for kind in ("gpipe", "1f1b")}
for kind, recs in pipe.items():
    for r in recs:
        b = r["pipeline"]
        print(f"{kind:>5} m={b['micro_batches']:2d}: bubble measured {b['measured']:4.0%} (quietest "
              f"step {b['quietest_step']['measured']:4.0%}), formula {b['formula']:4.0%}; step "
              f"{r['summary']['step_ms']:6.1f} ms")

# %% [markdown]
# The formula assumes two things: a micro-batch of B/m samples takes 1/m of the batch's time, and
# passing it to the next stage is free. The kit's time model (the planner's, in
# `kit/experiments/theory/local_time.py`) drops both assumptions: fed three numbers measured on
# this machine, it prices each micro-batch as its matmuls at the measured rate **plus** a fixed
# cost per operation (Python, dispatch, autograd), and each hand-off between the stages at its
# measured time. The next cell measures those numbers on the ranks, in a few seconds:
# - the matmul rate and one operation's fixed cost, every rank computing at once
#   (`calibrate_rank`);
# - one hand-off of each micro-batch's activation (64/m rows of 1024 floats): rank 0 computes,
#   then sends, while rank 1 waits in `recv`, as a pipeline stage does (`handoff_rank`).

# %%
%%distributed
from kit.experiments import build_workload, calibrate_rank, handoff_rank
mlp = build_workload("mlp").model                  # the model the sweep ran: its blocks' Linear shapes
blocks = [[(x.in_features, x.out_features) for x in b.modules() if isinstance(x, nn.Linear)]
          for b in mlp]
machine = calibrate_rank()
handoff_ms = handoff_rank([64 // m * 1024 * 4 for m in (1, 2, 4, 8, 16)])   # bytes -> ms
if rank == 0:
    print(f"matmul {machine['matmul_gflops']:.1f} GFLOP/s per rank, one op {machine['op_us']:.0f} us; "
          "hand-off ms: " + ", ".join(f"{n // 4096} rows {t:.2f}" for n, t in handoff_ms.items()))

# %% [markdown]
# The question the next plot answers: **does the measured bubble fall with m as the formula
# says, and what happens to the activations a stage holds?** Left: the bubble; the formula (dashed)
# and the time model with this machine's measured costs (solid) are predictions, the kit's
# measurements are points. Right: each stage's activation peak from the by-hand pipeline (points),
# and the prediction (lines): GPipe holds all m micro-batches of B/m samples, the whole batch;
# 1F1B at most p - r of them.

# %%
%dist pull peaks machine handoff_ms blocks
import matplotlib.pyplot as plt
from statistics import median
from kit.experiments import mlp_pipeline_bubble
from kit.plots import bubble_model
hand = peaks                                       # {rank: {(schedule, m): peak bytes}} from the ranks
gflops = median(c["matmul_gflops"] for c in machine.values())   # both ranks' calibrations
op_us = median(c["op_us"] for c in machine.values())
predicted = {m: mlp_pipeline_bubble(blocks[0], 64, m, gflops, op_us, handoff_ms[0][64 // m * 4096])
             for m in ms}
rows = [{"micro_batches": m, "formula": (p - 1) / (m + p - 1), "predicted": predicted[m],
         "measured": r["pipeline"]["measured"]} for m, r in zip(ms, pipe["gpipe"])]
for row in rows:
    print(f"m = {row['micro_batches']:2d}: formula {row['formula']:4.0%}, time model "
          f"{row['predicted']:4.0%} (both predicted); GPipe measured {row['measured']:4.0%}")
fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(9.6, 5.2))
bubble_model(rows, title="Bubble: formula, time model, measured (p = 2)", ax=ax1,
             measured_label="gpipe measured (mean of steps)",
             predicted_label="time model, this machine's measured costs (predicted)")
ax1.plot(ms, [r["pipeline"]["measured"] for r in pipe["1f1b"]], "s", color="#E69F00",
         label="1f1b measured (mean of steps)")
for kind, color, mark in (("gpipe", "#0072B2", "o"), ("1f1b", "#E69F00", "s")):
    ax1.plot(ms, [r["pipeline"]["quietest_step"]["measured"] for r in pipe[kind]], mark, mfc="none",
             color=color, label=f"{kind} quietest step (measured)")
ax1.legend(fontsize="x-small", loc="upper center", bbox_to_anchor=(0.5, -0.2), ncol=2)
mm = list(range(1, 17))
m_hand = sorted({m for _, m in hand[0]})
for r, style in ((0, "-"), (1, "--")):
    whole = hand[r]["gpipe", 1]                    # one micro-batch = the whole batch
    for kind, color, mark in (("gpipe", "#0072B2", "o"), ("1f1b", "#E69F00", "s")):
        held = [m if kind == "gpipe" else min(p - r, m) for m in mm]
        ax2.plot(mm, [whole * h / m / 1024 for h, m in zip(held, mm)], style, color=color, alpha=0.6,
                 label=f"{kind} stage {r} predicted")
        ax2.plot(m_hand, [hand[r][kind, m] / 1024 for m in m_hand], mark, color=color,
                 mfc=None if r == 0 else "none", label=f"{kind} stage {r} measured")
ax2.set(xlabel="micro-batches m", ylabel="activation peak per stage (KiB)", xscale="log", yscale="log",
        xticks=ms)
ax2.set_xticklabels(ms)
ax2.set_title("Activations held at once\n(by-hand pipeline, batch 48)", fontsize="medium")
ax2.legend(fontsize="x-small", ncol=2, loc="upper center", bbox_to_anchor=(0.5, -0.2))
plt.tight_layout()
plt.show()

# %% [markdown]
# The right panel matches the prediction: GPipe's peak does not move with m (m micro-batches of
# B/m samples are the whole batch), 1F1B's falls as 1/m once m ≥ p - r. These are exact byte
# counts, the same on any machine.
#
# Same bubble, less memory: does 1F1B cost anything in time? **Predict**, then let `compare` run
# GPipe and 1F1B with m = 4 interleaved, 6 times each.

# %%
guess_1f1b = None   # "faster", "same" or "slower" than GPipe

# %%
from kit.experiments import compare, conclude
sched = compare(base.replace(micro_batches=4), base.replace(micro_batches=4, schedule="1f1b"),
                cluster=kit.current_cluster())
conclude(sched, same="On this machine GPipe and 1F1B steps could not be told apart: the same work in "
                     "the same number of slots, in another order.",
         faster="On this machine 1F1B steps were faster than GPipe's: the new order changed something "
                "the formula does not count (when sends and receives wait, how memory is reused).",
         slower="On this machine 1F1B steps were slower than GPipe's: the new order changed something "
                "the formula does not count (when sends and receives wait, how memory is reused).");
print(f"your guess: 1F1B {guess_1f1b}")

# %% [markdown]
# The left panel is the timing, with two predictions. The formula (dashed) falls from 50% to 6%.
# The time model (solid) prices what the formula leaves out: each micro-batch pays its operations'
# fixed cost and two hand-offs whatever its size, so with more, smaller micro-batches those costs
# take a growing share of every slot, and the solid line falls less than the dashed one (it can
# never go below it: every cost it adds is positive). Compare your points with both lines. What
# sits above the solid line is what neither prediction prices; the record's `pipeline` field
# splits the measured bubble into the formula, plus **imbalance** (the slower stage sets the
# pace), plus **overhead** per micro-batch slot (send, receive, Python between operations, and the
# ranks losing their cores to other processes):
#
# <details><summary>Our runs (numbers you will not see in yours)</summary>
#
# In one Run All (2 shared CPU cores, load average 8 to 11 from other jobs) GPipe's measured
# bubble stayed between 49% and 67% for every m, the time model predicted 52%, 42%, 35%, 34% and
# 32% for m = 1 to 16 (28 GFLOP/s per rank, 276 us per operation, hand-offs of 0.35-0.56 ms), and
# the formula 50% to 6%. The model came within 7 points at m = 2 and 15 at m = 1; from
# m = 4 on, 24 to 33 points of the measured bubble were in neither prediction: the stage imbalance
# and the overhead below.
# </details>

# %%
for r in pipe["gpipe"]:
    b = r["pipeline"]
    print(f"m={b['micro_batches']:2d}: measured {b['measured']:4.0%} = formula {b['formula']:4.0%} "
          f"+ imbalance {b['imbalance']:+4.0%} + overhead {b['overhead']:+4.0%} "
          f"({b['overhead_ms_per_slot']:5.2f} ms per slot); stage busy ms "
          + ", ".join(f"{x:6.1f}" for x in b["stage_busy_ms"]))
step_timeline(pipe["gpipe"][2], title="GPipe, m = 4: forwards, then backwards")

# %% [markdown]
# Read the stage busy times and the overhead per slot in your numbers. Two things can grow with m:
# - the **busy** time itself: a matrix multiply on 4 samples does less per call than one on 64,
#   and every operation pays a fixed cost in Python and dispatch;
# - the **overhead** every slot pays for a send, a receive and the bookkeeping between them.
#
# <details><summary>Our runs (numbers you will not see in yours)</summary>
#
# When this lesson was written, stage 0's busy time grew about 9x from m = 1 to m = 16, and
# every slot paid an overhead of a few ms.
# </details>
#
# The formula counts neither: it assumes that cutting the batch into m pieces cuts each piece's
# time by m, and that passing a micro-batch on is free. On GPUs, with micro-batches large enough
# to keep each device busy, both come closer to true; here two stages share two CPU cores.
#
# **Predict:** is the whole step faster with m = 2 or with m = 16 on this machine?
# `compare` runs both interleaved, 9 times each, 2 timed steps a run (with 9 pairs the verdict
# tolerates one pair that a busy spell of this shared machine spoilt; with 6 it does not).

# %% tags=["verdict:slower"]
guess_faster_m = None   # 2 or 16
print(f"your guess: m = {guess_faster_m} is faster")
res = compare(base.replace(micro_batches=2), base.replace(micro_batches=16), repeats=9, steps=2,
              cluster=kit.current_cluster())
conclude(res, slower="On this machine 16 micro-batches make the step slower than 2: per-micro-batch "
                     "costs outweigh the shorter bubble.");

# %% [markdown]
# With 16 micro-batches the step is slower than with 2 (the verdict above), although the formula's
# bubble falls from 33% to 6%. Choose m by measuring: the bubble says m should be large, the
# per-micro-batch cost says it should be small, and where they balance depends on the hardware.

# %% [markdown]
# ## 5. Bytes between stages against DDP's gradients
#
# **Predict:** per step, how many bytes cross the cut of the 1024-wide MLP with batch 64 (one
# activation and its gradient per sample, fp32)? How does it compare with the 13.1 MiB of
# gradients DDP all-reduces every step (lesson 03)?

# %%
guess_cut_bytes = None
print(f"your guess: {guess_cut_bytes}")
p2p = pipe["gpipe"][0]["comm"]["bytes_per_step"]
print(f"predicted: 2 x 64 x 1024 x 4 = {2 * 64 * 1024 * 4:,} bytes; measured at the sends: "
      + ", ".join(f"m={r['config']['micro_batches']}: {r['comm']['bytes_per_step']:,}"
                  for r in pipe["gpipe"]))
print(f"DDP all-reduces S = 4P = {4 * 3_422_218:,} bytes per step: {4 * 3_422_218 / p2p:.0f}x more")

# %% [markdown]
# Point-to-point traffic does not depend on m (the same samples cross, in more pieces) and is
# 26x less than DDP's gradients here. This is why large runs place the parallelisms by how much
# and how often each one communicates (Megatron-LM, Narayanan et al., SC 2021):
# - **tensor parallel**, which communicates inside every layer, forward and backward, takes the
#   fastest links: the GPUs of one node, over NVLink;
# - **pipeline** stages cross machines: they pass one activation per micro-batch;
# - **data parallel** is the outer dimension, also across machines: its all-reduce happens once
#   per step and overlaps backward (lesson 03), and the node's NICs carry it together (lesson 01).

# %% [markdown]
# ## What differs on real GPUs
#
# - Each stage has its own device: two stages really compute at once, and a large
#   micro-batch keeps a GPU busy, so the measured bubble comes much closer to the formula.
# - The sends go over NVLink or the network, asynchronously; the kit records them as
#   `send to r` / `recv from r` on the same clock.
# - The trade-off stays: more micro-batches shrink the bubble, but each one must be big enough
#   to keep the device busy, and activations limit how many GPipe can keep (1F1B's reason to exist).

# %% [markdown]
# ## Exercises

# %% [markdown]
# **1.** p = 4 stages, m = 4 micro-batches. What is the bubble? How many micro-batches are needed
# for a bubble below 10%?
#
# <details><summary>Answer</summary>
#
# 3 / (4 + 3) = 3/7 = 43%. (p-1)/(m+p-1) < 0.1 means 3 < 0.1 (m + 3), m + 3 > 30, m ≥ 28.
# GPipe's paper calls the bubble negligible when m ≥ 4p (here 16: 3/19 = 16%).
# </details>

# %% [markdown]
# **2.** p = 4, m = 16, and one micro-batch's activations on stage 0 take 1 GB. What does stage 0
# hold at most under GPipe, and under 1F1B?
#
# <details><summary>Answer</summary>
#
# GPipe: all 16 micro-batches, 16 GB. 1F1B: at most p - 0 = 4 micro-batches, 4 GB. The bubble
# is 3/19 = 16% in both.
# </details>

# %% [markdown]
# **3.** Naive model parallel on 8 GPUs: what fraction of the time is each GPU idle?
#
# <details><summary>Answer</summary>
#
# (p-1)/p = 7/8 = 87.5%: only one of the 8 computes at a time.
# </details>

# %% [markdown]
# **4.** A transformer with hidden size 4096, sequence length 2048, micro-batch 1, activations in
# bf16, cut into stages. How many bytes cross one cut per micro-batch, in forward and backward
# together? Compare with the 2 bytes per parameter of bf16 gradients that DDP would all-reduce
# for a 7B-parameter model.
#
# <details><summary>Answer</summary>
#
# 2048 × 4096 × 2 bytes = 16 MiB each way, 32 MiB per micro-batch. DDP: 7e9 × 2 bytes = 14 GB
# per step; even 32 micro-batches (1 GiB) are 13x less.
# </details>

# %% [markdown]
# ## 6. Interleaved stages: a shorter bubble
#
# The bubble is p - 1 slots of filling and draining, each slot one micro-batch's work on one
# stage. **Interleaving** (Narayanan et al., "Efficient Large-Scale Language Model Training on
# GPU Clusters Using Megatron-LM", SC 2021) makes the slots smaller: each rank holds v
# non-consecutive **chunks** of layers instead of one block, chunk c of rank r being stage
# c·p + r of p·v. A micro-batch goes rank 0, rank 1, rank 0 again, rank 1 again; the pipe
# fills in p - 1 slots of 1/v the size. In Megatron-LM's **interleaved 1F1B** order (groups of
# p micro-batches go through chunk 0, then chunk 1, ...; backward starts as early as in 1F1B;
# m must be a multiple of p) the bubble is
#
#   bubble = (p - 1) / (v·m + p - 1)
#
# divided by about v; the price is v times more point-to-point messages. (Narayanan et al. write it
# as (1/v)·(p - 1)/m, the idle time over the *compute* time; divided by the whole step, compute
# plus idle, it becomes the form above: the two agree, they measure against different totals.)
# The kit's `pipeline` strategy runs it: `ExperimentConfig(strategy="pipeline",
# schedule="interleaved_1f1b", virtual_stages=2)`, and its record shows the measured bubble beside
# this formula.
#
# The kit's `pipeline_bubble` runs the same order on a pipeline made to show it: every chunk is the same stack of
# 512-wide `Linear` layers, every micro-batch the same rows, so every slot costs the same compute
# whatever m and v are (the MLP above shrank its micro-batches as m grew). It measures the
# share of the step each rank spends **waiting** in `recv` for a neighbour (and before its first
# and after its last operation): the schedule's bubble. It runs in two modes:
# - **real compute**: the layers run on the CPU. v = 2 makes twice as many operations, each half
#   the size, and twice as many messages: on a shared CPU their per-operation cost (section 4)
#   and the ranks losing their cores to other processes land in the waiting share too.
# - **emulated compute** (`emulate_ms=30`): each stage *sleeps* 30 ms per micro-batch forward
#   (30/v per chunk, twice that backward) instead of computing; the messages are real but small
#   (8 rows). A sleeping rank needs no CPU, so other processes cannot stretch it: what is left is
#   the schedule. Its numbers are labelled emulated. (30 ms, because each operation still costs some
#   Python, a message and, on a busy machine, a wait for a core on waking: at 10 ms per slot these
#   blurred v = 1 and v = 2 together under load.)
#
# Each mode runs v = 1 and v = 2 interleaved, 6 pairs for real compute and 9 for the emulated
# (v = 1 first, then v = 2 first, ...; with 9 pairs the verdict tolerates one pair that a busy spell
# of this shared machine spoilt), and
# the same verdict as `compare` judges the pairs' ratio of waiting shares (v = 2 over v = 1;
# "faster" means v = 2 waited a smaller share of its step).
#
# **Predict:** p = 2, m = 4: the bubble with v = 1 and with v = 2 chunks per rank. Which mode
# will show the formula's direction on this machine?

# %%
guess_bubble_v1, guess_bubble_v2 = None, None

# %%
%%distributed
from kit.experiments import pipeline_bubble
modes = {"real": dict(rows=128, layers_per_rank=4), "emulated": dict(emulate_ms=30, rows=8)}
# 9: the emulated verdict then tolerates one pair a busy spell spoilt
pairs = {"real": 6, "emulated": 9}
waits = {mode: {1: [], 2: []} for mode in modes}
for mode, how in modes.items():
    for pair in range(pairs[mode]):
        for v in ((1, 2) if pair % 2 == 0 else (2, 1)):   # who goes first alternates, as in compare
            r = pipeline_bubble(micro_batches=4, virtual=v, steps=2, **how)
            waits[mode][v].append(r["waiting"])
            waits[mode].setdefault(f"formula{v}", r["formula"])
            waits[mode].setdefault(f"descheduled{v}", []).append(r["descheduled"])

# %%
%dist pull waits --ranks 0
from statistics import median
from kit.experiments import conclude, paired_verdict, summary_line
print(f"your guesses: v = 1 {guess_bubble_v1}, v = 2 {guess_bubble_v2}")
bubble_verdicts = {}
for mode, w in waits.items():
    for v in (1, 2):
        print(f"{mode:8} v = {v}: formula {w[f'formula{v}']:.0%}; waiting per run "
              f"{' '.join(f'{x:.0%}' for x in w[v])} (median {median(w[v]):.0%}); "
              f"descheduled {median(w[f'descheduled{v}']):.0%} of the ranks' time")
    res = paired_verdict(w[1], w[2])   # the ratio is v = 2's waiting share over v = 1's, pair by pair
    res["summary"] = summary_line(res, f"v = 1 ({mode})", f"v = 2 ({mode})").replace(
        "step time ratio", "waiting-share ratio") + " (waiting shares compared, not step times)"
    bubble_verdicts[mode] = res

# %% tags=["verdict:faster"]
conclude(bubble_verdicts["emulated"],
         faster="Emulated compute (labelled so): v = 2 waits less than v = 1, the formula's direction; "
                "what sits above the formula's 20% and 11% is the real messages and the Python between "
                "operations.",
         slower="Emulated compute: v = 2 waited longer even without CPU contention; the messages and "
                "Python per operation outweighed the smaller fill and drain on this machine.",
         same="Emulated compute: v = 1 and v = 2 could not be told apart on this machine.");

# %%
conclude(bubble_verdicts["real"],
         faster="Real compute: v = 2 waited less than v = 1 on this machine, as the formula says.",
         slower="Real compute: v = 2 waited LONGER than v = 1 on this machine. Its twice as many "
                "operations and messages each pay the per-operation cost of section 4, and with other "
                "processes holding the cores (descheduled above) that cost is larger than the bubble it "
                "saves.",
         same="Real compute: v = 1 and v = 2 could not be told apart on this machine: the smaller "
              "bubble and the doubled per-operation cost are of similar size here, or the noise hides "
              "them.");

# %% [markdown]
# The formula gives 1/5 = 20% and 1/9 = 11%. The emulated mode shows its direction: with the CPU
# out of the way, the fill and drain shrink with v as Narayanan et al. say (that cell's verdict
# is checked on every Run All of this lesson). With real compute on a shared 2-core machine, v = 2
# often measures **higher**; a quieter machine may say otherwise: your verdict above is your
# machine's. Interleaving pays for its smaller bubble with v times the messages and operations; on
# GPUs those messages go over NVLink or the network, and a chunk must stay big enough to keep the
# device busy: v is bounded by the layers per rank.
#
# <details><summary>Our runs (numbers you will not see in yours)</summary>
#
# In our Run Alls (load 8 to 12 on 2 cores, the ranks descheduled about half of their time) the
# real-compute verdict said "slower": v = 2 waited about 1.4x as long a share as v = 1.
# </details>

# %% [markdown]
# ## Check against a reference
#
# Pipelining must not change the gradients: the mean of m micro-batch losses, each divided by m,
# is the full-batch mean loss. The by-hand pipeline of section 3, both schedules and several m,
# against one process that runs the whole model on the whole batch.

# %%
%%distributed
ref = make()
nn.functional.mse_loss(ref(X), Y).backward()
ref_grads = [p.grad for p in (ref[:2] if rank == 0 else ref[2:]).parameters()]
for kind in ("gpipe", "1f1b"):
    for m in (1, 4, 16):
        stage.zero_grad()
        pipeline_step(kind, m)
        for mine, want in zip(stage.parameters(), ref_grads):
            assert torch.allclose(mine.grad, want, atol=1e-6), (kind, m,
                                                                float((mine.grad - want).abs().max()))
"check passed"
