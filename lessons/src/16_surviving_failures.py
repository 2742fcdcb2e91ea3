# %% [markdown]
# # 16 · Surviving failures at scale
#
# Lesson 14 restarted a crashed job from its checkpoint. At scale that is not an accident to recover
# from once but the normal weather: Llama 3's 16,384 GPUs were interrupted 419 times in 54 days. This
# lesson measures what a job needs to survive it:
# 1. a rank that **hangs**: how the others notice (the process group's timeout), and how to find
#    which rank it is;
# 2. a crash **during** a save: checkpoints that are atomic and rotated;
# 3. a resume that repeats nothing: the data loader's position and the random number generators'
#    state in the checkpoint, so the resumed run is **bit-exact** against an uninterrupted one;
# 4. a rank **killed** mid-step under torchrun, restarted and resumed, bit-exact again;
# 5. the arithmetic: how often a job of N GPUs fails, and how often to checkpoint.
#
# Words used below:
# - **Timeout**: how long a collective waits for the other ranks before it fails
#   (`init_process_group(timeout=...)`).
# - **Watchdog**: NCCL's thread that checks every collective against that timeout on a GPU.
# - **Atomic**: seen whole or not at all, never half-written.
# - **MTBF**: mean time between failures.
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
# ## 1. A rank that hangs, and finding it
#
# A collective finishes only when every rank of the group has called it. If one rank never arrives
# (stuck reading a file, in a deadlock, on a GPU that stopped answering) the others wait. In a
# notebook the kit watches for this: `%dist where` (or `kit.current_cluster().where()`) asks every
# rank where it is, while the cell runs. The cell below lets rank 1 sleep 6 s before its all-reduce;
# 3 s in, a timer in this notebook asks the ranks.
#
# **Predict:** what will rank 0 say it is doing, 3 s in? And rank 1?

# %%
guess_rank0, guess_rank1 = None, None

# %%
import threading

import kit

answers = {}
asker = threading.Timer(3.0, lambda: answers.update(kit.current_cluster().where()))
asker.start()

# %%
%%distributed
import time
if rank == 1:
    time.sleep(6)              # stuck elsewhere: a slow filesystem, a lock, a GPU that stopped answering
t = torch.ones(2)
dist.all_reduce(t)
print(f"rank {rank}: the all-reduce finished, {t.tolist()}")

# %%
asker.join()
print(f"your guesses: rank 0 {guess_rank0}, rank 1 {guess_rank1}")
for r, text in sorted(answers.items()):
    print(f"--- rank {r}, 3 s in:\n{text.splitlines()[0]}")

# %% [markdown]
# Rank 0 waits at the all-reduce; rank 1 is still in `time.sleep`: the rank that never arrived is
# the one **not** waiting in the collective. (The kit holds every collective a cell calls at a
# pre-flight check until all ranks reach it, so a missing rank shows before anything blocks in
# gloo.) On a cluster there is no notebook to ask, and torch's own mechanisms take over:
#
# - **The timeout.** Every process group has one (`init_process_group(timeout=timedelta(...))`;
#   torch's default is 30 minutes for gloo, 10 for NCCL). With gloo the waiting call raises after
#   it. With NCCL a **watchdog** thread checks every collective against it and, by default
#   (`TORCH_NCCL_ASYNC_ERROR_HANDLING=3`), tears the process down, so that torchrun sees a dead
#   worker and restarts the job instead of the job hanging for ever.
# - **The flight recorder.** With `TORCH_NCCL_TRACE_BUFFER_SIZE=2000` (and
#   `TORCH_NCCL_DUMP_ON_TIMEOUT=1`) each rank keeps its last 2,000 collectives in a ring buffer and
#   dumps them on a timeout; `python -m torch.distributed.flight_recorder.fr_trace` reads every
#   rank's dump and names the rank whose sequence of collectives stops short. Llama 3's team used it
#   to find hung ranks (Dubey et al. 2024, section 3.3.4).
#
# The next cell does both by hand on CPU ranks, under torchrun: a 3 s timeout, rank 1 hangs for 60 s
# before the second all-reduce, and every rank logs each collective it **enters** to a file of its
# own, the flight recorder's idea in four lines.
#
# **Predict:** how long after rank 0 enters the second all-reduce does it fail? How long does the
# whole job take?

# %%
guess_fail_s, guess_job_s = None, None

# %% [markdown]
# The ranks of this notebook are stopped first (torchrun's processes need their memory) and started
# again when torchrun is done.

# %% tags=["rerun-in-order"]
%dist shutdown
import atexit, json, os, pathlib, shutil, subprocess, tempfile, time

HANG = '''
import datetime, json, os, sys, time, torch, torch.distributed as dist
log = open(os.path.join(sys.argv[1], f"rank{os.environ['RANK']}.log"), "w")
dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=3))
rank = dist.get_rank()

def collective(n):                      # log, then call: the log of a hung rank stops short
    log.write(f"enter all_reduce #{n}\\n"); log.flush()
    t0 = time.monotonic()
    try:
        dist.all_reduce(torch.ones(4))
    except RuntimeError as e:
        failed = [rank, n, time.monotonic() - t0, str(e).splitlines()[0][:160]]
        print("FAILED " + json.dumps(failed), flush=True)
        raise

collective(1)
if rank == 1:
    time.sleep(60)                      # hangs
collective(2)
'''

# scripts, logs and checkpoints: not in the checkout; one folder, kept when this cell runs again
# (section 3's module is in it) and removed when the kernel stops
if "work" not in globals():
    work = pathlib.Path(tempfile.mkdtemp(prefix="kit-lesson16-"))
    atexit.register(shutil.rmtree, work, True)
(work / "hang.py").write_text(HANG)
(work / "hang").mkdir(exist_ok=True)
t0 = time.monotonic()
proc = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node",
                       "2", str(work / "hang.py"), str(work / "hang")], capture_output=True, text=True,
                      timeout=120,
                      env=dict(os.environ, GLOO_SOCKET_IFNAME="lo"))
job_s = time.monotonic() - t0
failed = [json.loads(line[7:]) for line in proc.stdout.splitlines() if line.startswith("FAILED ")]
print(f"your guesses: fails after {guess_fail_s} s, job {guess_job_s} s")
print(f"torchrun exit {proc.returncode} after {job_s:.1f} s (including starting Python and torch twice)")
for rank_, n, waited_s, msg in failed:
    print(f"rank {rank_} failed in all_reduce #{n} after {waited_s:.1f} s: {msg}")
ledgers = {p.stem: p.read_text().split() for p in sorted((work / "hang").glob("rank*.log"))}
for name, words in ledgers.items():
    print(f"{name}: entered {words.count('enter')} all-reduce(s)")
entered = {name: words.count("enter") for name, words in ledgers.items()}
print("the rank that never arrived:", min(entered, key=entered.get))
# the notebook's ranks again, with the folder: section 3's cells use both, also after this runs again
%dist restart
%dist push work

# %% [markdown]
# Rank 0 failed about 3 s after it entered the second all-reduce: the timeout, not the 60 s rank 1
# slept. torchrun then saw a worker fail and stopped the other (it would restart both with
# `--max-restarts`, section 4). The logs name the culprit: rank 1 entered one all-reduce, rank 0
# two. On 16,384 GPUs that comparison, over each rank's last collectives, is what the flight
# recorder's analyser does.
#
# A timeout is a trade: too short and a slow but healthy step (a checkpoint save, a long data load)
# kills the job; too long and a hang wastes that many minutes on every GPU before the restart.
#
# ## 2. A crash during a save: atomic and rotated checkpoints
#
# A checkpoint written over the previous one in place has a dangerous moment: halfway through the
# write, the old checkpoint is gone and the new one is not complete. A crash then leaves nothing to
# resume from. Two habits remove the moment:
# - write to a temporary name, then **rename** it into place: `os.replace` is atomic on POSIX
#   filesystems (a reader sees the old file or the new one). For a folder of shards (DCP), write a
#   new folder per step and rename a small **pointer** file (`latest`) once every rank finished;
# - keep the last **k** checkpoints (rotation), in case the newest is complete but wrong.
#
# The cell below saves step 1's state, then starts saving step 2's and "crashes" halfway (it writes
# half of the bytes and stops, as a killed process would), both ways.
#
# **Predict:** after the crash, what can each way load?

# %%
guess_in_place, guess_atomic = None, None

# %% tags=["rerun"]
import io

import torch


def write(path, state, crash_halfway=False):
    """torch.save's bytes to path; crash_halfway writes only the first half (a process killed
    mid-write)."""
    buf = io.BytesIO()
    torch.save(state, buf)
    data = buf.getvalue()
    with open(path, "wb") as f:
        f.write(data[: len(data) // 2] if crash_halfway else data)
        f.flush()
        os.fsync(f.fileno())       # on disk, not only in the page cache, before anyone relies on it


def save_in_place(folder, state, crash_halfway=False):
    write(folder / "ckpt.pt", state, crash_halfway)


def save_atomic(folder, state, step, keep=2, crash_halfway=False):
    write(folder / f"step{step}.pt.tmp", state, crash_halfway)
    if crash_halfway:
        return                                        # the process died here
    os.replace(folder / f"step{step}.pt.tmp", folder / f"step{step}.pt")   # complete: give it its name
    (folder / "latest.tmp").write_text(f"step{step}.pt")
    os.replace(folder / "latest.tmp", folder / "latest")                   # then point at it
    for old in sorted(folder.glob("step*.pt"), key=lambda p: int(p.name[4:-3]))[:-keep]:
        old.unlink()                                  # rotation: the last `keep` stay


def load(path):
    try:
        return torch.load(path, weights_only=True)["step"]
    except Exception as e:
        return f"cannot load: {type(e).__name__}: {str(e).splitlines()[0][:80]}"


states = {s_: {"step": s_, "weights": torch.full((250_000,), float(s_))} for s_ in (1, 2)}   # 1 MB each
in_place, atomic = work / "in_place", work / "atomic"
for folder in (in_place, atomic):                     # empty, so the cell runs the same a second time
    shutil.rmtree(folder, ignore_errors=True)
    folder.mkdir(parents=True)
save_in_place(in_place, states[1])
save_in_place(in_place, states[2], crash_halfway=True)
save_atomic(atomic, states[1], step=1)
save_atomic(atomic, states[2], step=2, crash_halfway=True)
print(f"your guesses: in place {guess_in_place}, atomic {guess_atomic}")
print("in place:", sorted(p.name for p in in_place.iterdir()), "-> load:", load(in_place / "ckpt.pt"))
print("atomic:  ", sorted(p.name for p in atomic.iterdir()), "-> load latest:",
      load(atomic / (atomic / "latest").read_text()))
for s_ in (2, 3, 4):                                 # the run goes on: rotation keeps the last 2
    save_atomic(atomic, {"step": s_, "weights": torch.zeros(10)}, step=s_)
print("after steps 2-4 saved:", sorted(p.name for p in atomic.iterdir()))

# %% [markdown]
# In place, the crash destroyed the only checkpoint; the atomic way still loads step 1, and the
# half-written file has a name no loader reads. (The `fsync` matters on a real machine: a rename
# of data still in the page cache can survive a crash of the machine while the data does not.) DCP
# writes a folder of shards per save (lesson 14 wrote `step4/`, `step5/` ... and a `latest`
# pointer the same way); torch's `dcp.async_save` hides most of the write behind training.
#
# ## 3. A resume that repeats nothing: the loader's and the RNGs' state
#
# Restoring the model and the optimizer is not the whole state of a run. Two more things decide
# what the next step computes:
# - **the data loader's position**: which samples of the epoch were already seen, in which order.
#   `DistributedSampler` derives the order from `seed + epoch` (lesson 09), so (epoch, batches
#   done) is enough to find the place again;
# - **the random number generators**: dropout draws a fresh mask every step from torch's generator,
#   per rank. A restarted process starts from its seed, not from where the crash left it.
#
# The module below trains a small model with dropout under DDP on 64 samples (4 steps per epoch on
# 2 ranks) for 8 steps, and can save and load both. Its file is shared by the notebook's ranks
# and, in section 4, by torchrun's.

# %% tags=["rerun"]
RESUMABLE = '''
import os, torch, torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset

# 64 samples / (8 x 2 ranks): 4 steps per epoch
STEPS, BATCH = 8, 8


def build():
    torch.manual_seed(0)
    model = DDP(nn.Sequential(nn.Linear(16, 64), nn.ReLU(), nn.Dropout(0.3), nn.Linear(64, 1)))
    opt = torch.optim.Adam(model.parameters(), lr=1e-2)
    g = torch.Generator().manual_seed(1)
    data = TensorDataset(torch.randn(64, 16, generator=g), torch.randn(64, 1, generator=g))
    return model, opt, data


def batches(data, epoch, skip):
    """This rank's batches of `epoch` after the first `skip`: the order is the sampler's
    (seed + epoch)."""
    sampler = DistributedSampler(data, shuffle=True, seed=0)
    sampler.set_epoch(epoch)
    # a generator of its own: without one, every iteration of a DataLoader draws its workers' base seed
    # from torch's global generator, the one dropout uses, and a resumed run would draw it once more
    loader = DataLoader(data, batch_size=BATCH, sampler=sampler,
                        generator=torch.Generator().manual_seed(epoch))
    return list(loader)[skip:]


def train(model, opt, data, start=0, stop=STEPS, on_step=None):
    step = start
    while step < stop:
        epoch, done = divmod(step, len(data) // (BATCH * dist.get_world_size()))
        for x, y in batches(data, epoch, done):
            if step == stop:
                return
            if on_step:
                on_step(step)                                  # a chance to crash or save
            opt.zero_grad()
            nn.functional.mse_loss(model(x), y).backward()
            opt.step()
            step += 1


def state(model, opt, step, with_rng=True):
    out = {"model": model.state_dict(), "optim": opt.state_dict(), "step": step}
    if with_rng:
        out["rng"] = torch.get_rng_state()                     # this rank's: dropout draws from it
    return out


def restore(model, opt, saved):
    model.load_state_dict(saved["model"])
    opt.load_state_dict(saved["optim"])
    if "rng" in saved:
        torch.set_rng_state(saved["rng"])
    return saved["step"]


def flat(model):
    return torch.cat([p.detach().flatten() for p in model.parameters()])
'''
(work / "resumable.py").write_text(RESUMABLE)
%dist restart
%dist push work

# %% [markdown]
# Three runs on the notebook's 2 ranks: 8 steps uninterrupted; 5 steps, a checkpoint with the RNG
# state, a "crash" (new objects, and the RNG of a fresh process), a resume for steps 5-7; and the
# same with a checkpoint of only the model and the optimizer, resuming from the start of the
# epoch's data. Step 5 is the second batch of the second epoch: the crash falls mid-epoch.
#
# **Predict:** which resumed runs end on exactly the uninterrupted run's weights?

# %%
guess_exact = None   # "full", "naive", "both" or "neither"

# %% tags=["rerun", "rerun-in-order"]
%%distributed
import sys
sys.path.insert(0, str(work))
from resumable import build, flat, restore, state, train

model, opt, data = build()
train(model, opt, data)
uninterrupted = flat(model)

resumed = {}
for name, with_rng, skip_seen in (("full state", True, True), ("model + optimizer only", False, False)):
    model, opt, data = build()
    train(model, opt, data, stop=5)
    saved = state(model, opt, 5, with_rng)
    model, opt, data = build()                  # the crash: everything in memory is gone ...
    torch.manual_seed(1234 + rank)              # ... and a fresh process's generator is not where it was
    step = restore(model, opt, saved)
    if skip_seen:
        train(model, opt, data, start=step)     # the loader finds its place: epoch 1, after 1 batch
    else:
        train(model, opt, data, start=4, stop=4 + (8 - step))   # the epoch's data again, from its start
    resumed[name] = flat(model)
if rank == 0:
    for name, w in resumed.items():
        print(f"{name:>24}: bit-exact {torch.equal(w, uninterrupted)}, "
              f"largest difference {(w - uninterrupted).abs().max().item():.2e}")

# %% tags=["rerun-in-order"]
%dist pull uninterrupted resumed --ranks 0
print(f"your guess: {guess_exact}")

# %% [markdown]
# Only the full state gives back the same run, to the last bit. Without the generator's state the
# dropout masks after the resume differ from the uninterrupted run's; without the loader's position
# the resumed run sees the first batch of the epoch a second time and the last one not at all. Both
# look harmless in one loss curve and both make a resumed run a different run: a failure you cannot
# reproduce, a data mix that is not the one you planned. torchdata's `StatefulDataLoader` keeps the
# loader's position (with its workers' states) as a `state_dict`, for data pipelines less
# predictable than a sampler. With DataLoader workers, each worker's own seed matters too, and
# the loader itself draws from torch's global generator each time it is iterated unless it has a
# generator of its own (`resumable.py` gives it one): a third piece of state that is easy to miss.
#
# ## 4. A rank killed mid-step, restarted by torchrun, resumed bit-exact
#
# Now the real thing: torchrun with `--max-restarts 1`, a checkpoint after every step (atomic, a
# folder per step with a `latest` pointer, the last 2 kept; the RNG state of each rank in its own
# file), and on the first attempt rank 1 is **killed** (`SIGKILL`, as the kernel's OOM killer or a
# dying node would) in the middle of step 5, after its forward and before its backward.
#
# **Predict:** from which step does the second attempt resume, and does it end on the uninterrupted
# weights?

# %%
guess_resume_from, guess_bit_exact = None, None

# %% [markdown]
# The notebook's ranks stop again for torchrun's, and start again once it is done.

# %%
%dist shutdown
ELASTIC = '''
import os, signal, sys, torch, torch.distributed as dist
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from resumable import build, flat, restore, state, train

ckpt, attempt = sys.argv[1], int(os.environ["TORCHELASTIC_RESTART_COUNT"])
rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
store = dist.TCPStore(os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]), world, is_master=False)
dist.init_process_group("gloo", store=dist.PrefixStore(f"attempt-{attempt}", store), rank=rank,
                        world_size=world)
model, opt, data = build()
latest = os.path.join(ckpt, "latest")
start = 0
if os.path.exists(latest):
    folder = os.path.join(ckpt, open(latest).read())
    start = restore(model, opt, torch.load(os.path.join(folder, f"rank{rank}.pt"), weights_only=False))
print(f"ATTEMPT {attempt} rank {rank} starts at step {start}", flush=True)


def save_then_maybe_die(step):
    # the state before `step`: steps 0..step-1 done
    if step > start:
        folder = os.path.join(ckpt, f"step{step}")
        os.makedirs(folder, exist_ok=True)
        torch.save(state(model, opt, step), os.path.join(folder, f"rank{rank}.pt.tmp"))
        os.replace(os.path.join(folder, f"rank{rank}.pt.tmp"), os.path.join(folder, f"rank{rank}.pt"))
        dist.barrier()                                         # every rank's file is complete
        if rank == 0:
            with open(latest + ".tmp", "w") as f:
                f.write(f"step{step}")
            os.replace(latest + ".tmp", latest)
            for old in sorted(os.listdir(ckpt)):
                if old.startswith("step") and int(old[4:]) <= step - 2:
                    for f in os.listdir(os.path.join(ckpt, old)):
                        os.remove(os.path.join(ckpt, old, f))
                    os.rmdir(os.path.join(ckpt, old))
    if attempt == 0 and rank == 1 and step == 5:
        # dies after this forward
        model.register_forward_hook(lambda *_: os.kill(os.getpid(), signal.SIGKILL))


train(model, opt, data, start=start, on_step=save_then_maybe_die)
if rank == 0:
    torch.save(flat(model), os.path.join(ckpt, "final.pt"))
dist.barrier()
dist.destroy_process_group()
'''
(work / "elastic.py").write_text(ELASTIC)
# a fresh torchrun job on a busy machine has failed to start once in a while: say so, retry
for launch in (1, 2):
    ckpt = work / f"elastic{launch}"
    shutil.rmtree(ckpt, ignore_errors=True)           # a second run must not resume from the first's
    ckpt.mkdir(parents=True)
    t0 = time.monotonic()
    proc = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone",
                           "--nproc-per-node", "2",
                           "--max-restarts", "1", str(work / "elastic.py"), str(ckpt)],
                          capture_output=True, text=True, timeout=240,
                          env=dict(os.environ, GLOO_SOCKET_IFNAME="lo"))
    print(f"$ torchrun ... --max-restarts 1 elastic.py   exit {proc.returncode}, "
          f"{time.monotonic() - t0:.0f} s")
    if proc.returncode == 0:
        break
    print("\n".join(line for line in proc.stderr.splitlines()
                    if "Error" in line or "Signal" in line)[-2000:])
assert proc.returncode == 0, proc.stderr[-3000:]
import re
print("\n".join(sorted(re.findall(r"ATTEMPT \d rank \d starts at step \d+", proc.stdout))))
# each line's message, without the logger's prefix (date, pid, file) and the binary's path
print("torchrun's log:", "\n  ".join(l.split("] ", 1)[-1].split(" of binary:")[0].strip()[:160]
                                    for l in proc.stderr.splitlines()
                                    if "restart" in l.lower() or "SIGKILL" in l or "exitcode" in l))
final = torch.load(ckpt / "final.pt", weights_only=True)
print(f"your guesses: resumes from {guess_resume_from}, bit-exact {guess_bit_exact}")
print(f"left on disk: {sorted(p.name for p in ckpt.iterdir())}; the final weights equal the "
      f"uninterrupted run's bit for bit: {torch.equal(final, uninterrupted)}")
# the notebook's ranks again, with the folder, so that section 3's cells can run again
%dist restart
%dist push work

# %% [markdown]
# The first attempt saved the state before steps 1 to 5, and rank 1 died inside step 5; torchrun
# noticed the dead worker, stopped rank 0 and started both again. Each loaded the checkpoint
# `latest` named (the state before step 5: model, optimizer, its own generator, and the step that
# tells the sampler where it was), and the run ended on the uninterrupted run's weights exactly.
# (The checkpoint written as step 5 began holds the state before it: the half-done step 5 left
# nothing behind.)
#
# What this toy leaves out: on a cluster the restart usually lands on **other** machines (the
# failed node is drained), possibly **fewer** of them (`torchrun --nnodes MIN:MAX`), which is why
# DCP can load at another world size (lesson 14). Restarting the whole job costs minutes (scheduling,
# starting Python and torch, loading the checkpoint, rebuilding NCCL communicators); in-job recovery
# (torchft: replicas that drop out and rejoin without stopping the others) attacks that cost.
#
# ## 5. The arithmetic of failures at scale
#
# Failures of independent parts add up: if one GPU (with its share of hosts, links and switches)
# fails on average once every M₁ hours, a synchronous job on N of them fails every **M₁ / N** hours.
# Llama 3 405B's pre-training (Dubey et al. 2024, section 3.3.4, Table 5) measured it: on 16,384 H100s,
# **419 unexpected interruptions in 54 days** (466 with the planned ones), about 78% attributed to
# hardware, GPUs and their HBM3 memory the largest share; still more than 90% of the time was
# effective training.
#
# Every failure costs the restart time R plus the work since the last checkpoint, on average half
# an interval τ. Writing a checkpoint costs δ (the training that stops while it is written). The
# fraction of time lost is about δ/τ + (R + τ/2)/M, smallest at **τ = √(2·δ·M)** (Young 1974;
# Daly 2006 refines it).
#
# **Predict:** Llama 3's job MTBF in hours. With a checkpoint that blocks training for 60 s, the
# best interval?

# %%
guess_mtbf_h, guess_interval_min = None, None

# %%
hours = 54 * 24
mtbf_job_h = hours / 419
gpu_years = mtbf_job_h * 16_384 / (24 * 365)
print(f"your guesses: MTBF {guess_mtbf_h} h, interval {guess_interval_min} min")
print(f"Llama 3: {hours} h / 419 = one interruption every {mtbf_job_h:.2f} h on 16,384 GPUs; per GPU "
      f"{mtbf_job_h * 16_384:,.0f} h = {gpu_years:.1f} GPU-years between failures")
# checkpoint write (blocking), restart (assumed: 10 min)
delta_s, restart_s = 60.0, 600.0
print(f"{'GPUs':>7} {'job MTBF':>10} {'best interval':>14} {'time lost':>10}")
for n in (1_024, 4_096, 16_384, 65_536, 131_072):
    m_s = mtbf_job_h * 16_384 / n * 3600
    tau_s = (2 * delta_s * m_s) ** 0.5
    lost = delta_s / tau_s + (restart_s + tau_s / 2) / m_s
    print(f"{n:7,} {m_s / 3600:8.1f} h {tau_s / 60:11.0f} min {lost:10.1%}")

# %% [markdown]
# At Llama 3's 16,384 GPUs these costs lose about a sixth of the time (Llama 3 kept more than 90%
# effective: its restarts and checkpoints were cheaper than the 10 minutes and 60 s assumed here).
# At Llama 3's failure rate a job of 131,072 GPUs would fail every 23 minutes and lose about three
# quarters of its time to checkpoints, restarts and repeated work (predicted, from the formula): the reason large runs make checkpoints cheap (asynchronous, `dcp.async_save`, a copy to
# host memory while training goes on, so δ drops to seconds), restarts fast, and recovery partial
# (torchft, hot spares). Each halving of δ and R moves that row a long way down.
#
# ## What differs on real GPUs
#
# - NCCL's watchdog, not the calling thread, notices a timeout: the collective was queued on the
#   GPU, and the Python code may be steps ahead. With the default error handling the process is torn
#   down; the flight recorder's dump (one file per rank) is the record of what each rank issued.
# - A GPU can fail silently (wrong numbers, not a crash): large runs check loss spikes and gradient
#   norms, and compare ranks (Llama 3 reports silent data corruption among its interruptions).
# - Restarts go to other nodes: the checkpoint must be on storage every node reaches, and loading
#   at another world size (DCP) matters.
#
# ## Exercises
#
# **1.** A job of 4,096 GPUs at Llama 3's per-GPU failure rate checkpoints every 30 minutes; a
# restart takes 10 minutes. On average, how much time does one failure cost?
#
# <details><summary>Answer</summary>
#
# Half an interval of lost work plus the restart: 15 + 10 = 25 minutes. Its MTBF is
# 3.09 × 16,384 / 4,096 = 12.4 h, so about 3.4% of the time (plus the checkpoints themselves).
# </details>
#
# **2.** In section 3, why does restoring the RNG state alone not make the naive resume exact?
#
# <details><summary>Answer</summary>
#
# The loader would still start the epoch again: step 5 would train on the epoch's first batch (seen
# in step 4) instead of its second. Both the data position and the generators have to come back.
# </details>
#
# **3.** Young's interval for δ = 10 s (an asynchronous save's blocking part) and a job MTBF of 3 h?
# The time lost to checkpoints and repeated work at that interval (R = 0)?
#
# <details><summary>Answer</summary>
#
# τ = √(2 × 10 × 10,800) = 465 s ≈ 8 minutes. Lost: 10/465 + 232/10,800 = 2.2% + 2.2% = 4.3%.
# </details>
#
# **4.** The hang of section 1 with NCCL's default timeout of 10 minutes, on 16,384 GPUs: how many
# GPU-hours does one hang cost before the restart even begins?
#
# <details><summary>Answer</summary>
#
# 16,384 × 10 / 60 = 2,731 GPU-hours. Hence shorter timeouts for steady training (with a longer one
# around checkpoints and start-up), and the flight recorder to find the rank quickly.
# </details>
#
# ## Check against one process
#
# The uninterrupted 2-rank run must equal one process that trains on both ranks' batches at once
# (the mean over 2 ranks is the mean over 16 samples; dropout masks drawn per rank are replayed from
# each rank's generator), and both resumed runs of sections 3 and 4 must land on it exactly. The
# check replays the ranks' dropout by running each rank's half through the model with that rank's
# generator state.

# %%
sys.path.insert(0, str(work))
import resumable
from torch import nn

torch.manual_seed(0)
ref = nn.Sequential(nn.Linear(16, 64), nn.ReLU(), nn.Dropout(0.3), nn.Linear(64, 1))
opt_ref = torch.optim.Adam(ref.parameters(), lr=1e-2)
g = torch.Generator().manual_seed(1)
data = resumable.TensorDataset(torch.randn(64, 16, generator=g), torch.randn(64, 1, generator=g))
rng = {r: torch.get_rng_state() for r in (0, 1)}     # each rank's generator, where build() left it
for step in range(resumable.STEPS):
    epoch, done = divmod(step, 4)
    halves = []
    for r in (0, 1):
        sampler = resumable.DistributedSampler(data, num_replicas=2, rank=r, shuffle=True, seed=0)
        sampler.set_epoch(epoch)
        idx = list(sampler)[done * resumable.BATCH:(done + 1) * resumable.BATCH]
        halves.append((r, data.tensors[0][idx], data.tensors[1][idx]))
    opt_ref.zero_grad()
    for r, x, y in halves:
        torch.set_rng_state(rng[r])
        (nn.functional.mse_loss(ref(x), y) / 2).backward()   # DDP averages the two ranks' gradients
        rng[r] = torch.get_rng_state()
    opt_ref.step()
one = torch.cat([p.detach().flatten() for p in ref.parameters()])
assert torch.allclose(one, uninterrupted, atol=1e-6), (one - uninterrupted).abs().max()
assert torch.equal(resumed["full state"], uninterrupted) and torch.equal(final, uninterrupted)
assert not torch.equal(resumed["model + optimizer only"], uninterrupted)
# rank 0 timed out
assert failed and all(f[0] == 0 and f[1] == 2 and f[2] >= 3.0 for f in failed), failed
assert min(entered, key=entered.get) == "rank1"                                          # rank 1 hung
assert load(in_place / "ckpt.pt") != 2 and isinstance(load(in_place / "ckpt.pt"), str)
"check passed"
