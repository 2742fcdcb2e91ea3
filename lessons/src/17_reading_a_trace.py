# %% [markdown]
# # 17 · Reading a profiler trace
#
# Lesson 03 measured how much of DDP's all-reduce hides behind backward, with the kit's own
# stamps. On a real cluster you answer that question from a **profiler trace**: `torch.profiler`
# records every operator of every rank, and you read the file in a trace viewer. This lesson
# profiles a small DDP run on 2 ranks, finds in the file what the kit measured, and works out the
# overlapped and exposed communication from the file alone.
#
# Words used below:
# - **Trace**: a JSON file of events in the Trace Event Format, which ui.perfetto.dev opens.
# - **Span**: one event with a name, a start `ts` and a duration `dur`, both in µs.
# - **Row**: where a viewer draws a span: one process per rank, one row per thread inside it.
#
# *On Colab?* Run the next cell first; elsewhere it does nothing.

# %%
import sys
if "google.colab" in sys.modules:
    %pip install -q "distributed-kit @ git+https://github.com/distributed-kit/distributed-kit"

# %%
%matplotlib inline
import json
import pathlib

from kit.experiments import ExperimentConfig, alpha_beta_allreduce_s, build_workload, run

# %% [markdown]
# ## 1. The run, and a prediction
#
# The run: the kit's `mlp` workload (layers 256 → 1024 → 1024 → 1024 → 1024 → 10) under DDP on 2
# CPU ranks, 64 samples per rank, one warm-up step and 3 measured steps, on lesson 03's slow
# **emulated** link (α = 50 µs per ring step, 0.25 GB/s), so that communication is long enough to
# see. `bucket_cap_mb=5` makes DDP send the gradients in two buckets, filled in gradient-ready
# order (lesson 03): the output layer (10,250 parameters) and the last two 1024 × 1024 layers
# (1,049,600 each) reach 5 MiB in the first bucket; the second holds the other 1024 × 1024 layer
# and the first layer (263,168). Every float is 4 bytes.
#
# **Predict:** (1) how many floats does each bucket's all-reduce carry? (2) The emulated link
# charges each bucket the ring formula `t = 2(p−1)·α + 2(p−1)/p · n/β` (lesson 01), one bucket
# after another. How many ms of link time per step, at least, will the trace show?

# %%
guess_floats, guess_link_ms = None, None   # (1) floats per bucket, (2) ms of link time per step

# %%
params = sum(p.numel() for p in build_workload("mlp").model.parameters())
bucket_floats = [10_250 + 2 * 1_049_600, 1_049_600 + 263_168]
link_ms = [1e3 * alpha_beta_allreduce_s(4 * n, 2, 50, 0.25) for n in bucket_floats]
print(f"your guesses: {guess_floats} floats, {guess_link_ms} ms")
print(f"parameters: {params:,} = {' + '.join(f'{n:,}' for n in bucket_floats)} floats per step")
print(f"predicted link time: {' + '.join(f'{t:.2f}' for t in link_ms)} = {sum(link_ms):.2f} ms per step")

# %% [markdown]
# ## 2. Profile it
#
# `profile=` names a folder: the profiler runs on both ranks during the steps, and the kit writes
# its files there.

# %%
cfg = ExperimentConfig(strategy="ddp", workload="mlp", batch_size=64, steps=3, warmup_steps=1,
                       bucket_cap_mb=5, interconnect="custom", link_alpha_us=50, link_gbps=0.25)
folder = pathlib.Path("lesson17_traces")   # next to this notebook: JupyterLab's file browser shows it
record = run(cfg, profile=str(folder))
for f in sorted(folder.rglob("*.json")):
    print(f"{f}: {f.stat().st_size / 2**20:.1f} MiB")
print(*[n for n in record["notes"] if "profiled" in n or "emulated" in n], sep="\n")

# %% [markdown]
# `all_ranks.json` holds both ranks on one clock; `ranks/` holds torch's own file per rank (for
# TensorBoard's profiler plugin and HolisticTraceAnalysis, `docs/measuring.md`). To see the merged
# file in **ui.perfetto.dev**, download it (JupyterLab's file browser: right-click, *Download*),
# open ui.perfetto.dev in your browser and drop the file on it; Perfetto reads it inside your
# browser. Perfetto is a web page of its own, so this notebook cannot show it, here or on Binder:
# the rest of this lesson reads the same file in Python and draws it.
#
# The note above matters for every number below: these steps ran **with the profiler on**, so
# they include its cost; compare them with each other, not with unprofiled runs.

# %% [markdown]
# ## 3. Read the trace in plain Python
#
# The file is `{"traceEvents": [...], ...}`. Events with `"ph": "M"` name the rows; events with
# `"ph": "X"` are spans. First, which rows does each rank have, and how many spans on each?

# %%
def load(folder):
    """The merged trace's events, and each row's name by (pid, tid)."""
    trace = json.loads((folder / "all_ranks.json").read_text())
    return trace["traceEvents"], {(e["pid"], e["tid"]): e["args"]["name"] for e in trace["traceEvents"]
                                  if e["ph"] == "M" and e["name"] == "thread_name"}


events, row_of = load(folder)
for (rank, tid), row in sorted(row_of.items()):
    n = sum(1 for e in events if e["ph"] == "X" and (e["pid"], e["tid"]) == (rank, tid))
    print(f"rank {rank}  {row:42s} {n:5d} spans")

# %% [markdown]
# The rows named `kit...` are the kit's: `kit` holds each step and its phases (forward, backward,
# optimizer; the *memory probe step* is one more step the kit runs after the measured ones),
# `kit: collectives` the collectives called from Python (the emulated link does its real
# all-reduce there, in a DDP comm hook, so each call carries its tensor's shape), and
# `kit: gradient buckets` each bucket from DDP's launch to its delivery; buckets in flight together
# go to an extra row, `(overlap 1)`. The `torch:` rows are `torch.profiler`'s: the rank's main
# thread runs forward and backward operator by operator (the row with thousands of spans), and
# gloo's two worker threads (usually named `pt_gloo_runloop`) run the real all-reduce, as
# `gloo:all_reduce` spans. A small function pulls spans out: by rank, row, name and time window.

# %%
def spans(rank, row, name, within=None, loaded=None):
    """(start_ms, end_ms, args) of `rank`'s spans whose name starts with `name`, on the rows named
    `row` (its "(overlap n)" rows too; "torch" means every torch row), starting inside `within`;
    from `loaded` (what `load` returns), else from this lesson's trace."""
    evs, rows = loaded or (events, row_of)
    out = []
    for e in evs:
        r = rows.get((e["pid"], e["tid"]), "")
        on_row = r.split(" (overlap")[0] == row or (row == "torch" and r.startswith("torch: "))
        if e["ph"] == "X" and e["pid"] == rank and on_row and e["name"].startswith(name):
            s, t = e["ts"] / 1e3, (e["ts"] + e["dur"]) / 1e3
            if within is None or within[0] <= s <= within[1]:
                out.append((s, t, e.get("args", {})))
    return sorted(out, key=lambda x: x[0])


measured = [f"step {k}" for k in range(cfg.steps)]
for rank in (0, 1):
    for step in measured:
        (s0, s1, _), = spans(rank, "kit", step)
        floats = [int(a["signature"].split("[")[1].rstrip("])")) for *_, a in
                  spans(rank, "kit: collectives", "all_reduce", (s0, s1))]
        took = [t - s for s, t, _ in spans(rank, "kit: gradient buckets", "bucket", (s0, s1))]
        print(f"rank {rank} {step}: all_reduce of {' + '.join(f'{n:,}' for n in floats)} floats; "
              f"buckets took {' and '.join(f'{x:.1f}' for x in took)} ms")

# %% [markdown]
# Each measured step all-reduces the two buckets you predicted, and together they carry every
# parameter once. Each bucket's span is longer than its link time (printed in section 1): a
# bucket goes onto the emulated link only after its real all-reduce on the loopback, and the
# second waits while the link carries the first. The `gloo:all_reduce` spans on gloo's threads
# are that real all-reduce; section 5 draws them.

# %% [markdown]
# ## 4. Overlapped and exposed communication, from the spans
#
# The kit's rule (`docs/measuring.md`): communication is **overlapped** where a bucket is in
# flight between the start of backward and the moment backward writes the *last gradient*; the rest of
# the buckets' time is **exposed**: the step waited for it. The trace's `backward` span runs until
# `backward()` returns, which in DDP includes waiting for the buckets, so the last gradient must
# come from torch's rows: autograd runs each node of the backward graph as an
# `autograd::engine::evaluate_function: ...` span, and the node that writes a parameter's `.grad`
# is `AccumulateGrad`. The last of them to start inside backward marks the last gradient.
#
# **Predict:** at least how many ms of each step must be exposed, however long backward computes?
# (Which bucket holds the last gradient, and when can it go onto the link?)

# %%
guess_exposed_ms = None   # the least exposed communication per step

# %%
def union(intervals):
    """Merge overlapping (start, end) intervals into disjoint ones."""
    out = []
    for s, t in sorted(intervals):
        if out and s <= out[-1][1]:
            out[-1] = (out[-1][0], max(out[-1][1], t))
        else:
            out.append((s, t))
    return out


def read_step(rank, step):
    """One step of one rank, from the trace alone (all in ms on the common clock)."""
    (s0, s1, _), = spans(rank, "kit", step)
    (b0, b1, _), = spans(rank, "kit", "backward", (s0, s1))
    last_grad = spans(rank, "torch", "autograd::engine::evaluate_function: torch::autograd::Accum",
                      (b0, b1))[-1][0]
    buckets = [(s, t) for s, t, _ in spans(rank, "kit: gradient buckets", "bucket", (s0, s1))]
    comm = union(buckets)
    total = sum(t - s for s, t in comm)
    overlap = sum(max(0.0, min(t, last_grad) - max(s, b0)) for s, t in comm)
    return {"start": s0, "backward": (b0, b1), "last_grad": last_grad, "buckets": buckets,
            "comm_ms": total, "comm_overlap_ms": overlap, "comm_exposed_ms": total - overlap}


print(f"your guess: at least {guess_exposed_ms} ms exposed; "
      f"the last bucket's link time: {link_ms[-1]:.2f} ms")
print("rank step    | trace: comm overlapped exposed | record: comm overlapped exposed (ms)")
gaps = []
for row in record["steps"]:
    mine = read_step(row["rank"], f"step {row['step']}")
    gaps.append(abs(mine["comm_overlap_ms"] - row["comm_overlap_ms"]))
    print(f"{row['rank']:4d} {row['step']:4d}    |       " + " ".join(f"{mine[k]:8.2f}" for k in
          ("comm_ms", "comm_overlap_ms", "comm_exposed_ms")) + "  |        " + " ".join(
          f"{row[k]:8.2f}" for k in ("comm_ms", "comm_overlap_ms", "comm_exposed_ms")))
print(f"overlapped, trace against record: at most {max(gaps):.3f} ms apart")

# %% [markdown]
# Compare the two sides row by row. The bucket spans in the file are the kit's own stamps (the
# step clock, written into the trace), so `comm` agrees to the rounding of the file's µs. The split
# differs only by where each side puts the last gradient: the kit stamps it in a hook that runs
# inside that last `AccumulateGrad`, the trace gives the span's start; the difference printed is
# what separates those two moments in this run. Every exposed figure is above the last bucket's
# link time: that bucket holds the last gradient, so all of its time on the link comes after
# backward's compute, whatever else overlaps.

# %% [markdown]
# ## 5. One step, drawn from the trace
#
# The question the plot answers: **on each rank, what ran while the buckets were in flight?** Per
# rank, one lane of phases (backward split at the last gradient), one lane per bucket (the last
# part of each bar, hatched, is its link time from the formula: the link delivers a bucket when
# its time on the wire is over), and the real all-reduce from gloo's rows.

# %%
import matplotlib.pyplot as plt
from matplotlib.patches import Patch

COLORS = {"forward": "#0072B2", "backward: computing": "#56B4E9",
          "backward: after the last gradient": "#BBBBBB", "optimizer": "#009E73",
          "bucket: real all-reduce, waiting for the link": "#E69F00",
          "bucket: on the emulated link (formula)": "#D55E00",
          "gloo:all_reduce (torch's rows)": "#CC79A7"}


def draw_step(step, link_ms, title):
    fig, ax = plt.subplots(figsize=(9, 5.4), layout="constrained")
    ticks, labels, y = [], [], 0
    origin = min(read_step(rank, step)["start"] for rank in (0, 1))   # one clock for both ranks
    at = lambda s, t: (s - origin, t - s)
    for rank in (0, 1):
        st = read_step(rank, step)
        (s0, s1, _), = spans(rank, "kit", step)
        b0, b1 = st["backward"]
        bars = [(*spans(rank, "kit", "forward", (s0, s1))[0][:2], "forward"),
                (b0, st["last_grad"], "backward: computing"),
                (st["last_grad"], b1, "backward: after the last gradient"),
                (*spans(rank, "kit", "optimizer", (s0, s1))[0][:2], "optimizer")]
        for s, t, k in bars:
            ax.broken_barh([at(s, t)], (y - 0.4, 0.8), color=COLORS[k])
        ticks, labels, y = ticks + [y], labels + [f"rank {rank} · phases"], y - 1
        for i, (s, t) in enumerate(st["buckets"]):
            ax.broken_barh([at(s, t - link_ms[i])], (y - 0.4, 0.8),
                           color=COLORS["bucket: real all-reduce, waiting for the link"])
            ax.broken_barh([at(t - link_ms[i], t)], (y - 0.4, 0.8), hatch="//", edgecolor="white",
                           facecolor=COLORS["bucket: on the emulated link (formula)"], linewidth=0)
            ticks, labels, y = ticks + [y], labels + [f"rank {rank} · bucket #{i}"], y - 1
        gloo_rows = sorted({row_of[rank, e["tid"]] for e in events if e["ph"] == "X" and e["pid"] == rank
                            and e["name"] == "gloo:all_reduce" and s0 <= e["ts"] / 1e3 <= s1})
        for j, r in enumerate(gloo_rows):   # the threads gloo ran this step's all-reduces on
            ax.broken_barh([at(s, t) for s, t, _ in spans(rank, r, "gloo:all_reduce", (s0, s1))],
                           (y - 0.4, 0.8), color=COLORS["gloo:all_reduce (torch's rows)"])
            ticks, labels, y = ticks + [y], labels + [f"rank {rank} · gloo thread {j + 1}"], y - 1
        y -= 0.5
    ax.set_yticks(ticks, labels, fontsize="small")
    ax.set(xlabel="ms since the first rank began the step (one clock)", ylabel="rank · lane")
    ax.set_title(title, fontsize="medium")
    ax.legend(handles=[Patch(color=c, label=k) for k, c in COLORS.items()], loc="upper center",
              bbox_to_anchor=(0.5, -0.12), ncol=3, fontsize="small", frameon=False)
    return fig


draw_step("step 1", link_ms, "One step of 2 ranks from all_ranks.json (measured; link emulated)")
plt.show()

# %% [markdown]
# Read it against section 4. Bucket #0 leaves while backward still computes (light blue): the
# stretch of its bar under the light blue is the overlapped communication. After the last
# gradient, backward (grey) is DDP's work: launching bucket #1, waiting for both buckets (the
# exposed part) and copying the results into `.grad`. The orange part of each bucket holds its
# real all-reduce (the pink spans on gloo's threads) and, for bucket #1, the wait while the link
# carries bucket #0. The ranks did not begin the step at the same moment; compare where their
# pink spans end: neither rank can finish an all-reduce before the other has entered it.
#
# ## What differs on real GPUs
#
# - A GPU trace adds rows for each CUDA stream: compute kernels on one, NCCL's all-reduce kernels
#   on another. Overlap is then read between kernels on the device, not between host spans:
#   the host only queues GPU work, so a host span says when work was queued
#   (`docs/measuring.md`; the kit's own stamps on a GPU are CUDA events for that reason).
# - HolisticTraceAnalysis computes the overlap of communication and compute kernels from such
#   traces (`TraceAnalysis(trace_dir=".../ranks")`); on a CPU-only profile it has no kernels to
#   read, which is why this lesson does the arithmetic itself.

# %% [markdown]
# ## Exercises
#
# **1.** Profile the same run with `bucket_cap_mb=1`. How many bucket spans will each rank's
# measured step have in the trace? And its warm-up step? Write your guess, then run the cell: it
# counts them in the new trace.

# %%
guess_buckets = {"measured step": None, "warm-up step": None}

# %%
from kit.experiments import shutdown

shutdown()   # fresh ranks: the first run left its ranks larger, and Binder gives us 1 GiB
folder1 = pathlib.Path("lesson17_traces_cap1")
run(cfg.replace(bucket_cap_mb=1), profile=str(folder1))
loaded1, counts = load(folder1), {}
for rank in (0, 1):
    for step in ["warm-up step"] + measured:
        (s, t, _), = spans(rank, "kit", step, loaded=loaded1)
        counts[rank, step] = len(spans(rank, "kit: gradient buckets", "bucket", (s, t), loaded=loaded1))
print(f"your guess: {guess_buckets}")
for (rank, step), n in counts.items():
    print(f"rank {rank}, {step}: {n} bucket span{'' if n == 1 else 's'}")

# %% [markdown]
# <details><summary>Answer</summary>
#
# Every measured step has **4** bucket spans: with a 1 MiB cap each 4 MiB layer fills a bucket
# on its own, the output layer shares one with the layer before it, and the first layer (1 MiB)
# is the last bucket (lesson 03, section 2). The warm-up step has **1**: before its first backward
# DDP does not know the order gradients arrive in, so it puts them all in one bucket and rebuilds
# the buckets after that step.
# </details>
#
# **2.** In section 5's plot, which bucket's link time could no bucket size hide behind backward?
#
# <details><summary>Answer</summary>
#
# The last bucket's: it holds the last gradient (the first layer's), so it is launched only when
# backward's compute is over, and all of its link time is exposed whatever the cap.
# </details>

# %% [markdown]
# ## Check against a reference
#
# The arithmetic of section 4 must be the kit's: `kit.experiments.breakdown_ms`, the step clock's
# own, gives the same overlapped and exposed ms from the same spans; the buckets' union equals the
# record's `comm_ms` to the file's rounding; every measured step carries every parameter once, in
# as many buckets as DDP built; and exercise 1's trace has 4 buckets per step.

# %%
from kit.experiments import breakdown_ms

for row in record["steps"]:
    mine = read_step(row["rank"], f"step {row['step']}")
    b0, b1 = mine["backward"]
    ref = breakdown_ms([("backward", "compute", b0, b1)], mine["buckets"], mine["last_grad"])
    for k in ("comm_ms", "comm_overlap_ms", "comm_exposed_ms"):
        assert abs(ref[k] - mine[k]) < 1e-9, (k, ref[k], mine[k])
    assert abs(mine["comm_ms"] - row["comm_ms"]) < 0.01, (mine["comm_ms"], row["comm_ms"])
    (s0, s1, _), = spans(row["rank"], "kit", f"step {row['step']}")
    floats = [int(a["signature"].split("[")[1].rstrip("])"))
              for *_, a in spans(row["rank"], "kit: collectives", "all_reduce", (s0, s1))]
    assert sum(floats) == params and len(floats) == len(record["comm"]["buckets"]) == 2, floats
assert all(counts[r, f"step {k}"] == 4 for r in (0, 1) for k in range(cfg.steps)), counts
assert all(counts[r, "warm-up step"] == 1 for r in (0, 1)), counts
"check passed"
