# %% [markdown]
# # 09 · Data at scale: DistributedSampler, memory mapping, the page cache
#
# Lessons 02 to 08 fed the ranks with tensors made on the spot. Real training reads a dataset
# from disk, and two questions come up as soon as there are several ranks:
# - **Who reads what?** Every rank must read a different share of the samples, and a new
#   share each epoch. That is `DistributedSampler`'s job, with `set_epoch`.
# - **Where does the data live?** A dataset is often larger than the memory one rank may use.
#   `np.memmap` maps the file into every rank's address space without reading it; the operating
#   system loads pages when a batch touches them and keeps **one** copy in its page cache, shared
#   by every process on the machine.
#
# This lesson shows what goes wrong without a sampler or without `set_epoch`, then reads a file
# through `np.memmap` on two ranks and measures what each rank really costs in memory, what the
# second epoch owes to the page cache, and what DataLoader workers add.
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
print(f"rank {rank} of {world_size} on {device}")

# %% [markdown]
# ## 1. Who reads what: no sampler, a sampler, a sampler with `set_epoch`
#
# A dataset of 16 samples, 2 ranks, two epochs, read three ways:
# - **no sampler**: a plain `DataLoader(dataset)` on every rank;
# - **`DistributedSampler` without `set_epoch`**;
# - **`DistributedSampler` with `sampler.set_epoch(epoch)`** at the start of each epoch.
#
# **Predict, and write it down:** per epoch, how many samples does each rank read in each case,
# how many of rank 0's samples does rank 1 also read, and how many of rank 0's epoch-1 samples are
# the same as its epoch-0 samples?

# %%
guess_reads = {"no sampler": None, "sampler": None, "sampler + set_epoch": None}   # your counts first

# %%
N_SAMPLES = 16
print(f"your guesses: {guess_reads}")
predicted = {"no sampler": {"per_rank": N_SAMPLES, "shared_with_other_rank": N_SAMPLES},
             "sampler": {"per_rank": N_SAMPLES // 2, "shared_with_other_rank": 0},
             "sampler + set_epoch": {"per_rank": N_SAMPLES // 2, "shared_with_other_rank": 0}}
predicted

# %%
%%distributed
from torch.utils.data import DataLoader, DistributedSampler

dataset = list(range(16))

def indices(loader, sampler=None, set_epoch=False):
    epochs = []
    for epoch in range(2):
        if set_epoch:
            sampler.set_epoch(epoch)
        epochs.append([i for batch in loader for i in batch.tolist()])
    return epochs

sampler_a = DistributedSampler(dataset, num_replicas=world_size, rank=rank, shuffle=True, seed=0)
sampler_b = DistributedSampler(dataset, num_replicas=world_size, rank=rank, shuffle=True, seed=0)
seen = {"no sampler": indices(DataLoader(dataset, batch_size=4)),
        "sampler": indices(DataLoader(dataset, batch_size=4, sampler=sampler_a), sampler_a),
        "sampler + set_epoch": indices(DataLoader(dataset, batch_size=4, sampler=sampler_b), sampler_b,
                                       True)}
for case, (e0, e1) in seen.items():
    print(f"{case:<20} epoch 0 {e0}\n{'':<20} epoch 1 {e1}")

# %% [markdown]
# Each rank printed its own indices. Now the counts, from both ranks' lists together:

# %%
%dist pull seen
measured = {}
for case in predicted:
    r0, r1 = seen[0][case], seen[1][case]
    measured[case] = {"per_rank": len(r0[0]), "shared_with_other_rank": len(set(r0[0]) & set(r1[0])),
                      "rank0_same_set_both_epochs": set(r0[0]) == set(r0[1]),
                      "rank0_same_order_both_epochs": r0[0] == r0[1]}
    print(f"{case:<20} {measured[case]}")

# %% [markdown]
# - **No sampler**: both ranks read all 16 samples, the same ones. Two ranks do the work of one,
#   twice, and with DDP each gradient step averages two copies of the same batch.
# - **Sampler without `set_epoch`**: each rank reads its 8, disjoint, but epoch 1 repeats epoch 0
#   exactly (same samples, same order): the shuffle is seeded by `seed + epoch`, and the epoch
#   stays 0. Every epoch trains on the same split, in the same order.
# - **Sampler with `set_epoch`**: a new shuffle each epoch, the same on every rank, so the ranks
#   stay disjoint and rank 0's share changes.
#
# The question the next plot answers: **does each rank read the share you predicted, and how
# much of it does the other rank read too?**

# %%
import matplotlib.pyplot as plt

cases = list(predicted)
fig, ax = plt.subplots(figsize=(8, 3.4))
x = range(len(cases))
for k, (key, label, color) in enumerate((("per_rank", "samples per rank per epoch", "#0072B2"),
                                         ("shared_with_other_rank",
                                          "of those, also read by the other rank", "#D55E00"))):
    off = -0.2 + 0.4 * k
    ax.bar([i + off for i in x], [measured[c][key] for c in cases], 0.36, color=color,
           label=f"{label} (measured)")
    ax.plot([i + off for i in x], [predicted[c][key] for c in cases], "k_", ms=28, mew=2,
            label="predicted" if k == 0 else None)
ax.set_xticks(list(x), cases)
ax.set_ylabel("samples (epoch 0)")
ax.set_title("2 ranks, 16 samples: prediction (black line) against each rank's real indices",
             fontsize="medium")
ax.spines[["top", "right"]].set_visible(False)
ax.legend(fontsize="small", loc="upper right")
plt.show()

# %% [markdown]
# ## 2. A dataset larger than the memory budget
#
# Suppose each rank may use about **200 MiB** for data, 400 MiB for the two ranks together (on
# Binder the kernel and the ranks share 1-2 GB, and torch alone takes about 220 MiB per rank). The
# dataset is a **256 MiB** file: no rank could hold it.
#
# - **In-memory copy** (`np.load(path)`): every rank reads the whole file into its own memory.
#   Two private copies.
# - **Memory map** (`np.load(path, mmap_mode="r")`, which is `np.memmap`): nothing is read when the
#   file is opened; a page (4 KiB) comes from disk the first time a batch touches it and stays
#   in the OS page cache. Both ranks map the same file, so they share those pages.
#
# Two ways to count a process's memory, both read from `/proc/<pid>/smaps_rollup`:
# - **RSS** counts every page the process has mapped, shared or not. A shared page is counted in
#   every process that maps it.
# - **PSS** (proportional set size) divides each shared page among the processes that map it: a
#   page two ranks share counts half in each. The ranks' PSS adds up to what they really cost.
#
# **Predict, and write it down:** with the 256 MiB file on 2 ranks, after an epoch in which each
# rank reads its half of the samples, how many MiB above their starting level do the two ranks
# hold together: RSS and PSS with memmap, and with the in-memory copy? (A hint for RSS: on a page
# fault Linux maps up to 16 neighbouring pages that are already cached, and a rank's random half
# of the 4 KiB samples lands in nearly every 64 KiB stretch of the file.)

# %%
guess_mib = {"memmap": {"RSS": None, "PSS": None}, "in-memory copy": {"RSS": None, "PSS": None}}

# %%
SIZE_MB, RANKS, BUDGET_MB = 256, 2, 400     # a larger file: raise SIZE_MB (see the end of section 3)
print(f"your guesses (MiB): {guess_mib}")
prediction_mib = {"memmap": {"RSS": RANKS * SIZE_MB, "PSS": SIZE_MB},
                  "in-memory copy": {"RSS": RANKS * SIZE_MB, "PSS": RANKS * SIZE_MB}}
prediction_mib

# %% [markdown]
# `kit.experiments.memmap_benchmark` writes a fresh 256 MiB file (each sample 4 KiB, its index
# in column 0), and has every rank read it through `np.memmap` with a `DistributedSampler`
# (`set_epoch` each epoch) and a `DataLoader`, two epochs, once with `num_workers=0` and once with
# `num_workers=2`; then the in-memory copy. Each rank samples its RSS and PSS every 0.1 s, its
# DataLoader workers included; the kernel adds the ranks up at the same moments. Before each
# configuration the file's pages are dropped from the page cache (`posix_fadvise`, no root
# needed), so epoch 0 reads from disk, and `mincore(2)` reports how much of the file was cached
# before each epoch. With `track_ids=True` each rank also returns the index it read from every
# sample's content.

# %%
import kit
from kit.experiments import memmap_benchmark
rec = memmap_benchmark(size_mb=SIZE_MB, world_size=RANKS, batch_size=256, num_workers=(0, 2),
                       track_ids=True, cluster=kit.current_cluster())
runs = {r["label"]: r for r in rec["runs"]}
print(f"file: {rec['file']['mib']:.0f} MiB, {rec['file']['samples']} samples on "
      f"{rec['file']['fs_type']}")
for label, r in runs.items():
    ranks = ", ".join(f"rank {p['rank']} RSS {p['extra_rss_mib']:.0f} / PSS {p['extra_pss_mib']:.0f}"
                      for p in r["per_rank"])
    print(f"{label:<22} together: RSS {r['sum_extra_rss_mib']:5.0f} MiB, PSS "
          f"{r['sum_extra_pss_mib']:5.0f} MiB | {ranks} | every sample once per epoch: "
          f"{r['coverage']['each_sample_once_per_epoch']}")

# %% [markdown]
# And what the budget says about the in-memory copy (the tool refuses it before writing anything):

# %%
from kit.experiments import MemmapBenchError
try:
    memmap_benchmark(size_mb=SIZE_MB, world_size=RANKS, budget_mb=BUDGET_MB)
except MemmapBenchError as e:
    print("refused:", e)

# %% [markdown]
# The question the next plot answers: **do the ranks together cost one copy of the file with
# memmap and one copy per rank without it, as predicted, and which fits the budget?** Dotted:
# the prediction; solid: the peak measured above the ranks' level before the data was opened.

# %%
shown = {"memmap": runs["memmap, num_workers=0"], "in-memory copy": runs["in-memory copy"]}
fig, ax = plt.subplots(figsize=(8, 3.6))
for i, (name, r) in enumerate(shown.items()):
    for j, (kind, color) in enumerate((("RSS", "#E69F00"), ("PSS", "#0072B2"))):
        key = f"sum_extra_{kind.lower()}_mib"
        pos = 2.5 * i + 1.1 * j
        ax.bar(pos - 0.22, r[key], 0.4, color=color, label=f"{kind} measured" if i == 0 else None)
        ax.bar(pos + 0.22, prediction_mib[name][kind], 0.4, color="white", edgecolor=color, hatch="..",
               label=f"{kind} predicted" if i == 0 else None)
ax.axhline(BUDGET_MB, color="#D55E00", ls=":", lw=1.5, label=f"budget, both ranks ({BUDGET_MB} MiB)")
ax.axhline(rec["file"]["mib"], color="black", ls="--", lw=1,
           label=f"the file, one copy ({rec['file']['mib']:.0f} MiB)")
ax.set_xticks([0.55, 3.05], [f"{n}\n(RSS, PSS)" for n in shown])
ax.set_ylabel("MiB, both ranks together")
ax.set_ylim(0, 1.5 * max(prediction_mib["in-memory copy"]["RSS"],
                         shown["in-memory copy"]["sum_extra_rss_mib"]))
ax.set_title(f"{SIZE_MB} MiB file on {RANKS} ranks: prediction against measurement", fontsize="medium")
ax.spines[["top", "right"]].set_visible(False)
ax.legend(fontsize="x-small", ncol=2, loc="upper left")
plt.show()

# %% [markdown]
# What the numbers say:
# - With memmap the ranks' **PSS together** is about one copy of the file (plus a few MiB of
#   batches): the page cache holds the file once, and PSS shares it out. That fits the budget.
# - Their **RSS together** is about two files: each rank's RSS counts the shared pages as if
#   they were its own. Adding up RSS double-counts; a memory limit that summed RSS would refuse a
#   job that fits.
# - The **in-memory copy** costs one private copy per rank: RSS and PSS agree, two files, over
#   the budget. That is the point of this lesson: **memory mapping lets every rank read a dataset
#   none of them could hold**, because the operating system keeps one copy and hands out pages.
#
# The kit's own plot shows the same run with the workers and the epochs (next section):

# %%
from kit.plots import memmap_memory
memmap_memory(rec)

# %% [markdown]
# ## 3. The second epoch, and DataLoader workers
#
# Epoch 0 starts with the file out of the page cache (`cached` before it is near 0%): every page
# comes from disk. Epoch 1 starts with the file cached (100% when memory allows): no disk. A
# second epoch that is faster than the first is the **operating system**, not the model or the
# loader "warming up". With a file larger than the machine's free memory the cache cannot keep it all,
# and every epoch reads (much of it) from disk again.
#
# One run of each epoch is not enough to say which is faster on this machine. The next cell reads
# a 128 MiB file cold then warm, six times (the cache dropped before each), and judges the pairs
# with the same statistic as `compare` (lessons 01-03): the median of the per-pair ratios, with a
# 95% interval.

# %%
from kit.experiments import conclude
from kit.experiments import cached_before_line, paired_verdict, summary_line
pairs = memmap_benchmark(size_mb=128, world_size=RANKS, batch_size=256, num_workers=[0] * 6,
                         in_memory=False,
                         cluster=kit.current_cluster())
cold_ms = [1e3 * r["epochs"][0]["seconds"] for r in pairs["runs"]]
warm_ms = [1e3 * r["epochs"][1]["seconds"] for r in pairs["runs"]]
print(cached_before_line(pairs))   # e.g. "... epoch 0 0%, epoch 1 100%": cold, then warm
print("epoch 0 (cold), ms:", " ".join(f"{v:6.1f}" for v in cold_ms))
print("epoch 1 (warm), ms:", " ".join(f"{v:6.1f}" for v in warm_ms))
epochs = paired_verdict(cold_ms, warm_ms)
epochs["summary"] = summary_line(epochs, "epoch 0 (cold)", "epoch 1 (warm)").replace(
    "step time ratio", "epoch time ratio").replace("interleaved pairs", "cold/warm pairs")
conclude(epochs, faster="On this machine the warm epoch was faster: its pages came from the page cache, "
                        "not the disk.",
         slower="On this machine the warm epoch was slower: something other than the disk (the "
                "machine's load) dominated here.",
         same="On this machine the two epochs could not be told apart: the disk is fast enough (or the "
              "machine busy enough) that reading from it did not show.");

# %% [markdown]
# **DataLoader workers** (`num_workers=2`) are separate processes, forked from the rank, that
# prepare batches in parallel. Each worker maps the file too, so in the first figure's memory
# panel **RSS** grows with every process (a forked worker also counts the parent's pages it
# inherited). **PSS** grows much less: the file's pages are still one copy in the page cache,
# shared out among more processes; what is added is the workers' own memory (their batches and
# the pages they copied on write), so check it against the budget too: on this machine you
# measured it in the printout below. Workers pay off when preparing a batch costs real CPU
# (decoding images, augmenting text) and there are spare cores. Here a batch is a memory copy,
# and two ranks with two workers each are six processes on two cores. The run of section 2:

# %%
def cached(share):  # the file's share in the page cache as the epoch began; None: not measured, not 0%
    return "not measured" if share is None else f"{100 * share:3.0f}%"


for label, r in runs.items():
    e0, e1 = r["epochs"]
    print(f"{label:<22} epoch 0: {e0['samples_per_s']:9,.0f} samples/s "
          f"(cached before: {cached(e0['cached_before'])}) | epoch 1: "
          f"{e1['samples_per_s']:9,.0f} samples/s (cached: {cached(e1['cached_before'])}) | extra "
          f"RSS {r['sum_extra_rss_mib']:5.0f} MiB, PSS {r['sum_extra_pss_mib']:4.0f} MiB")

# %% [markdown]
# One run of each is no verdict. The next cell reads a 64 MiB file with `num_workers=0` and
# `num_workers=2` in turn, six rounds, alternating which goes first, and judges the **warm**
# epoch (from the page cache, so the disk is out of it and only the loading machinery is
# compared). A DataLoader starts its workers at the beginning of every epoch (unless
# `persistent_workers=True`), and that start-up is part of what is timed, as in a real loop.

# %%
order = [w for k in range(6) for w in ((0, 2) if k % 2 == 0 else (2, 0))]
wk = memmap_benchmark(size_mb=64, world_size=RANKS, batch_size=256, num_workers=order, in_memory=False,
                      cluster=kit.current_cluster())
warm = {0: [], 2: []}
for r in wk["runs"]:
    warm[r["num_workers"]].append(1e3 * r["epochs"][1]["seconds"])
print("warm epoch, num_workers=0, ms:", " ".join(f"{v:6.1f}" for v in warm[0]))
print("warm epoch, num_workers=2, ms:", " ".join(f"{v:6.1f}" for v in warm[2]))
workers = paired_verdict(warm[0], warm[2])
workers["summary"] = summary_line(workers, "num_workers=0", "num_workers=2").replace(
    "step time ratio", "epoch time ratio")
conclude(workers, faster="On this machine two workers per rank made the warm epoch faster: preparing "
                         "batches in parallel outweighed starting the workers and sharing the cores.",
         slower="On this machine two workers per rank made the warm epoch slower: starting four worker "
                "processes and sharing two cores among six processes cost more than the parallel "
                "batches saved.",
         same="On this machine the two could not be told apart within the noise.");

# %% [markdown]
# Whatever this machine said about time, the memory panel's lesson holds everywhere: workers
# multiply RSS, while the file itself is still paid for once. On a machine with spare cores and
# a real decoding step, workers are what keeps the model fed.
#
# **To scale the file up**, set `SIZE_MB` in section 2 (and `BUDGET_MB`): the time grows with
# the file, since epoch 0 reads it all from disk. To see a file larger than the machine's
# memory, pass `in_memory=False` (the in-memory copy would not fit) and a `size_mb` above the
# available memory (`free -m`); the tool refuses a file larger than the free disk. On Binder,
# `memmap_benchmark(size_mb=1536, budget_mb=2048, in_memory=False)` reads a file no rank could
# hold.

# %% [markdown]
# ## What differs at scale
#
# - Many nodes: each node has its own page cache, so each node's ranks share one copy of what
#   they read; a network file system adds the network to the cold epoch.
# - GPUs: the batch still comes through host memory. Workers prepare the next batches while the
#   GPU computes; `pin_memory=True` puts each batch in page-locked memory, and the copy to the GPU
#   overlaps compute only when it is asked for asynchronously, `batch.to(device,
#   non_blocking=True)` (a plain `.to(device)` waits for the copy).
# - Datasets of many small files (images) behave the same way per file; packing them into a few
#   large files (WebDataset shards, Arrow, `.npy`) keeps reads sequential and memory-mappable.

# %% [markdown]
# ## Exercises

# %% [markdown]
# **1.** A dataset has 1,000 samples and there are 3 ranks. How many samples does each rank read
# per epoch with `DistributedSampler` and the default `drop_last=False`, and with
# `drop_last=True`? Which samples are read twice, or never?
#
# <details><summary>Answer</summary>
#
# `drop_last=False`: ceil(1000 / 3) = 334 each, 1,002 in all: the sampler pads the shuffled list
# by repeating its first 2 entries, so 2 samples are read twice in that epoch. `drop_last=True`:
# floor(1000 / 3) = 333 each, 999 in all: the last shuffled sample is not read that epoch (a
# different one each epoch, thanks to `set_epoch`).
# </details>

# %% [markdown]
# **2.** 8 ranks on one machine memory-map a 40 GiB file, and in a warm epoch each rank's RSS
# reaches the whole file. What do the 8 RSS values add up to, what is each rank's PSS, and what
# would in-memory copies cost?
#
# <details><summary>Answer</summary>
#
# RSS: 8 × 40 = 320 GiB, on a machine that may have far less. PSS: 40 / 8 = 5 GiB per rank,
# 40 GiB together: one copy in the page cache. In-memory copies: 8 × 40 = 320 GiB of private
# memory, which the machine must really have.
# </details>

# %% [markdown]
# **3.** Binder guarantees 1,024 MiB for everything (and allows up to 2,048 when the machine
# has room), and each torch rank takes about 220 MiB before any data. With 2 ranks, what is the
# largest file that the in-memory copy could hold (ignore the kernel)? And with memmap?
#
# <details><summary>Answer</summary>
#
# Each rank holds its own copy: (1024 − 2 × 220) / 2 = 584 / 2 = 292 MiB per file within the
# guarantee, (2048 − 2 × 220) / 2 = 804 MiB if Binder allows 2 GB. With
# memmap the file is limited by the disk, not the memory: pages the cache cannot keep are read
# again from disk (the cache is clean and reclaimable), so a larger file still reads, more
# slowly.
# </details>

# %% [markdown]
# **4.** 2 ranks with `num_workers=2` each: how many processes read the data, and how many
# processes then compete for this machine's 2 cores?
#
# <details><summary>Answer</summary>
#
# 2 × 2 = 4 worker processes read the data; with the 2 ranks, 2 + 4 = 6 processes share 2 cores,
# 3 per core.
# </details>

# %% [markdown]
# **5.** Your 256 MiB file has 65,536 samples of 4 KiB. With 2 ranks and `batch_size=256`, how many
# batches does each rank load per epoch?
#
# <details><summary>Answer</summary>
#
# 65,536 / 2 = 32,768 samples per rank, 32,768 / 256 = 128 batches.
# </details>

# %% [markdown]
# ## Check against a reference
#
# The whole pipeline on both ranks, against one process reading the file: rank 0 writes a small
# `.npy` file (1,000 samples, column 0 the index), every rank maps it with
# `np.load(mmap_mode="r")` and reads its share through `DistributedSampler` with `set_epoch`,
# two epochs. Per epoch the ranks' indices together must be every sample exactly once, each
# rank's share must be torch's own `DistributedSampler` split, rank 0's share must change between
# epochs, and every row read must equal the in-memory reference.

# %%
%%distributed
import os, tempfile
import numpy as np
from torch.utils.data import DataLoader, Dataset, DistributedSampler

class Mapped(Dataset):
    def __init__(self, path):
        self.x = np.load(path, mmap_mode="r")          # np.memmap: nothing read yet
    def __len__(self):
        return len(self.x)
    def __getitem__(self, i):
        return torch.from_numpy(np.array(self.x[i]))   # this sample's pages, read now

box = [os.path.join(tempfile.mkdtemp(prefix="kit-09-"), "data.npy") if rank == 0 else None]
dist.broadcast_object_list(box, src=0)
path = box[0]
n = 1000
if rank == 0:
    ref = np.random.default_rng(0).random((n, 16), dtype=np.float32)
    ref[:, 0] = np.arange(n)
    np.save(path, ref)
dist.barrier()
ds = Mapped(path)
sampler = DistributedSampler(ds, num_replicas=world_size, rank=rank, shuffle=True, seed=0)
loader = DataLoader(ds, batch_size=64, sampler=sampler)
mine = []
for epoch in range(2):
    sampler.set_epoch(epoch)
    rows = torch.cat(list(loader))
    ids = rows[:, 0].long().tolist()
    assert ids == list(sampler), "read the indices the sampler gave"
    mine.append((ids, rows))
everyone = [None] * world_size
dist.all_gather_object(everyone, mine)
if rank == 0:
    full = np.load(path)                                  # the single-process, in-memory reference
    for epoch in range(2):
        union = sorted(i for part in everyone for i in part[epoch][0])
        assert union == list(range(n)), f"epoch {epoch}: not every sample exactly once"
        for r, part in enumerate(everyone):
            ids, rows = part[epoch]
            want = DistributedSampler(range(n), num_replicas=world_size, rank=r, shuffle=True, seed=0)
            want.set_epoch(epoch)
            assert ids == list(want), f"rank {r} epoch {epoch}: not torch's split"
            assert torch.equal(rows, torch.from_numpy(full[ids])), f"rank {r} read other bytes"
    assert set(everyone[0][0][0]) != set(everyone[0][1][0]), "rank 0 read the same share twice"
    print(f"{world_size} ranks, {n} samples, 2 epochs: each sample exactly once per epoch, rows equal "
          f"the reference")
dist.barrier()
if rank == 0:
    os.remove(path)
    os.rmdir(os.path.dirname(path))
"check passed"
