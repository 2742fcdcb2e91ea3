# %% [markdown]
# # 12 · Context parallel and expert parallel
#
# Two more ways to split a transformer, each for one part that outgrows a device:
# - **Context parallel** splits the **sequence**: with 128k-token sequences the activations do
#   not fit. For Llama-3 70B (h = 8,192, 80 layers) at s = 131,072, one layer's activations
#   (Korthikanti's 34·s·h bytes with flash attention) are 36.5 GB: one fits in 80 GB, 80 do not,
#   and even with full recomputation the layers' inputs alone, 2·s·h·L bytes, are 172 GB. Each rank keeps s/t of the tokens; attention, the one operation in
#   which every token looks at the others, passes the keys and values around a ring
#   (ring attention: Liu et al., "Ring Attention with Blockwise Transformers", 2023).
# - **Expert parallel** splits a **mixture of experts** (MoE): many MLPs ("experts"), of which a
#   router picks k per token (Shazeer et al. 2017; GShard, Lepikhin et al. 2020; Switch, Fedus et
#   al. 2021). Each rank holds some experts; `all_to_all` sends every token to its experts' ranks
#   and brings the results back.
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
# ## 1. Ring attention by hand
#
# Attention for a query is softmax(q·kᵀ/√d)·v over **all** keys. With the sequence split, rank r
# holds its queries, keys and values only. The ring: each rank computes with the key/value block
# it holds, sends that block to rank r+1, receives one from rank r-1, and repeats t times, so
# every query meets every key once while no rank ever holds them all.
#
# The softmax needs the maximum and the sum over all keys, which arrive block by block. The
# **online softmax** (Milakov and Gimelshein, 2018; the trick inside flash attention) keeps per
# query a running max m, a running sum l and a running output o, and rescales them when a block
# raises the max: o ← o·e^(m_old - m_new) + e^(scores - m_new)·v.
#
# **Predict:** on 2 ranks, how many blocks does each rank send in this forward, and does the
# result equal full attention exactly or only to rounding?

# %%
guess_blocks_sent, guess_exact = None, None

# %%
%%distributed
import math
b, heads, s, d, t = 2, 2, 64, 16, world_size
g = torch.Generator().manual_seed(0)
# the whole sequence, for the check
q, k, v = (torch.randn(b, heads, s, d, generator=g) for _ in range(3))
mine = slice(rank * s // t, (rank + 1) * s // t)
q_r, k_blk, v_blk = q[..., mine, :], k[..., mine, :].clone(), v[..., mine, :].clone()

m = torch.full(q_r.shape[:-1], float("-inf"))
l = torch.zeros(q_r.shape[:-1])
o = torch.zeros_like(q_r)
sent = 0
for step in range(t):
    scores = q_r @ k_blk.transpose(-1, -2) / math.sqrt(d)
    m_new = torch.maximum(m, scores.amax(-1))
    p = torch.exp(scores - m_new.unsqueeze(-1))
    fix = torch.exp(m - m_new)
    l = l * fix + p.sum(-1)
    o = o * fix.unsqueeze(-1) + p @ v_blk
    m = m_new
    if step < t - 1:                                  # pass the blocks on: send to r+1, receive from r-1
        k_in, v_in = torch.empty_like(k_blk), torch.empty_like(v_blk)
        reqs = [dist.isend(k_blk, (rank + 1) % t), dist.isend(v_blk, (rank + 1) % t),
                dist.irecv(k_in, (rank - 1) % t), dist.irecv(v_in, (rank - 1) % t)]
        for req in reqs:
            req.wait()
        k_blk, v_blk, sent = k_in, v_in, sent + 2
ring = o / l.unsqueeze(-1)
full = torch.nn.functional.scaled_dot_product_attention(q, k, v)[..., mine, :]
print(f"rank {rank}: sent {sent} blocks of {k_blk.numel() * 4:,} bytes; ring vs full attention: max "
      f"diff {(ring - full).abs().max():.1e}")

# %%
print(f"your guesses: {guess_blocks_sent} blocks, exact: {guess_exact}")

# %% [markdown]
# t - 1 = 1 hop of K and V: 2 blocks of b·heads·(s/t)·d floats. The result equals full attention
# to rounding (about 10⁻⁷), not bit for bit: the sums are added in another order.
#
# The kit's `ring_attention` is the same forward plus a hand-written backward (K and V go round
# the ring again, and each block's gradient travels home with it), with every hop posted before
# the block in hand is computed, so the transfer overlaps the compute. Read it beside this lesson in
# `kit/experiments/parallel/context.py` (`ring_attention`; the online softmax is `_ring_forward`). One
# line checks it against full attention, gradients included:

# %%
%%distributed
from kit.experiments import check_ring_attention
cp_full = check_ring_attention(causal=False)
if rank == 0:
    print("max |ring - full|:", {k_: f"{v_:.1e}" for k_, v_ in cp_full["diffs"].items()})
    print("hops (calls, bytes) measured:", {k_: (v_["calls"], int(v_["payload_bytes"]))
                                            for k_, v_ in cp_full["bytes"]["measured"].items()})
    pred = cp_full["bytes"]["predicted"]["cp/send"]
    print(f"predicted: {pred['calls']} sends, {pred['payload_bytes']:,} bytes "
          f"({cp_full['bytes']['predicted']['formula']})")

# %% [markdown]
# ### Ulysses: all-to-all instead of a ring
#
# DeepSpeed-Ulysses (Jacobs et al. 2023) splits the same sequence differently at attention. Each
# rank holds s/t tokens of **every** head; one `all_to_all` per tensor regroups q, k and v so that
# each rank holds **every** token of heads/t heads; attention then runs locally, whole, for those
# heads; one more `all_to_all` sends each output token home. Per rank it sends 4 all-to-alls of
# (t-1)/t of its b·heads·(s/t)·d floats, against ring attention's 2(t-1) blocks of that size.
#
# **Predict:** on our t = 2 ranks, which sends more bytes per rank in forward, the ring or Ulysses?
# And at t = 8?

# %%
guess_more_bytes_t2, guess_more_bytes_t8 = None, None

# %%
%%distributed
def all_to_all(x):
    """Chunk i of dim 0 goes to rank i; chunk i of the result came from rank i."""
    x = x.contiguous()                           # all_to_all_single reads and writes memory in order
    out = torch.empty_like(x)
    dist.all_to_all_single(out, x)
    return out

ulysses_sent = 0
def heads_for_tokens(x):
    """(b, heads, s/t, d), this rank's tokens -> (b, heads/t, s, d), this rank's heads, every token."""
    global ulysses_sent
    # head group j goes to rank j
    chunks = x.reshape(b, t, heads // t, s // t, d).transpose(0, 1)
    ulysses_sent += chunks.numel() * 4 * (t - 1) // t                            # all but our own chunk
    # got[i]: rank i's tokens
    got = all_to_all(chunks)
    return got.permute(1, 2, 0, 3, 4).reshape(b, heads // t, s, d)

def tokens_for_heads(x):
    """The inverse: (b, heads/t, s, d) -> (b, heads, s/t, d)."""
    global ulysses_sent
    # token block j goes to rank j
    chunks = x.reshape(b, heads // t, t, s // t, d).permute(2, 0, 1, 3, 4)
    ulysses_sent += chunks.numel() * 4 * (t - 1) // t
    got = all_to_all(chunks)                                                     # got[i]: head group i
    return got.transpose(0, 1).reshape(b, heads, s // t, d)

q_h, k_h, v_h = (heads_for_tokens(z[..., mine, :]) for z in (q, k, v))
ulysses = tokens_for_heads(torch.nn.functional.scaled_dot_product_attention(q_h, k_h, v_h))
ring_sent = 2 * (t - 1) * k_blk.numel() * 4
print(f"rank {rank}: Ulysses vs full attention: max diff {(ulysses - full).abs().max():.1e}; bytes "
      f"sent: Ulysses {ulysses_sent:,} (4 all-to-alls), ring {ring_sent:,} ({2 * (t - 1)} blocks)")

# %%
# b·heads·(s/t)·d, in units of b·heads·s·d
block = lambda t_: 1 / t_
print(f"your guesses: t = 2 {guess_more_bytes_t2}, t = 8 {guess_more_bytes_t8}")
for t_ in (2, 4, 8, 16):
    print(f"t = {t_:2d}: per rank, in units of b·heads·s·d floats: ring {2 * (t_ - 1) * block(t_):.3f}, "
          f"Ulysses {4 * (t_ - 1) / t_ * block(t_):.3f}")

# %% [markdown]
# At t = 2 they send the same bytes; from t = 3 on Ulysses sends less, and its share falls as 1/t
# while the ring's stays near 2·b·heads·s·d. When each wins:
# - **Ulysses** needs t ≤ heads (each rank takes whole heads; with grouped-query attention, t ≤ the
#   key-value heads unless they are copied), and an all-to-all in which every rank talks to every
#   other: cheap on NVLink inside a node, expensive across nodes. Its attention runs whole, with any
#   kernel (flash attention, masks) unchanged.
# - **Ring attention** works for any t and talks only to neighbours, and each hop overlaps a block's
#   compute, so it scales across nodes; its online softmax changes the attention kernel, and causal
#   masks need the zig-zag split of the next section.
# - The two combine: Ulysses inside a node, the ring across nodes ("USP", Fang and Zhao 2024,
#   arXiv:2405.07719).
#
# %% [markdown]
# ## 2. Causal attention: the imbalance and the zig-zag split
#
# A language model's attention is **causal**: token i looks only at tokens 0…i. With the
# sequence cut into 2 contiguous halves, rank 0's queries (the first half) need only their own
# block, half of it; rank 1's need all of rank 0's block and half of their own.
#
# **Predict:** for s = 64, how many query-key pairs (score entries) does each rank compute, per
# sequence and head? Then the **zig-zag** split (Megatron-LM's context parallel, torch's
# `context_parallel` load balancer): cut the sequence in 2t chunks and give rank r chunks r and
# 2t-1-r. How many then?

# %%
guess_entries_contiguous, guess_entries_zigzag = None, None   # [rank 0, rank 1] each

# %%
%%distributed
# each check times its forward after an untimed one (the median of 5): the first call's allocations and
# first-use costs would otherwise land on whichever split runs first
contiguous = check_ring_attention(causal=True)
zigzag = check_ring_attention(causal=True, zigzag=True)
if rank == 0:
    for name, r in (("contiguous", contiguous), ("zig-zag", zigzag)):
        print(f"{name:>10}: score entries per rank {r['score_entries_per_rank']}, attention ms per rank "
              f"({r['compute_ms_of']}) {[round(x, 2) for x in r['compute_ms_per_rank']]}, max diff "
              f"{r['max_abs_diff']:.1e}")

# %%
%dist pull contiguous zigzag --ranks 0
print(f"your guesses: contiguous {guess_entries_contiguous}, zig-zag {guess_entries_zigzag}")
pairs = lambda n: n * (n + 1) // 2                      # a causal block on the diagonal: n(n+1)/2
print(f"predicted: contiguous [{pairs(32)}, {32 * 32 + pairs(32)}], "
      f"zig-zag [{pairs(16) + 48 * 16 + pairs(16)}, {16 * 16 + pairs(16) + 32 * 16 + pairs(16)}]")
from kit.plots import ring_balance
ring_balance([contiguous, zigzag])          # also takes the records of strategy="cp" runs

# %% [markdown]
# Contiguous: 528 against 1,552 pairs, so rank 0 finishes its work and waits for rank 1 at
# every hop. Zig-zag: 1,040 each, the same total. (Chunk 0 is the cheapest, chunk 3 the dearest;
# rank 0 holds both.) The right panel is the forward's attention milliseconds on a shared CPU, per
# rank the median of 5 forwards after an untimed one (so that neither split pays the first call's
# costs): read them as indications, not as a verdict. At this toy size a block's
# time is mostly fixed overhead, and the zig-zag split computes up to four smaller blocks per hop
# where the contiguous one computes one, so the milliseconds need not follow the pairs; the
# counted work on the left is what grows with the sequence (as s²).
#
# ## 3. Mixture of experts: routing and `all_to_all`, by hand
#
# An MoE layer has E expert MLPs and a router, a `Linear(h, E)`. Each token goes to the k experts
# with the highest router probability, and the layer's output is the experts' outputs weighted by
# those probabilities (the kit's `MoE` renormalises the k of them to sum to 1, as GShard does for its
# top 2). With expert parallelism rank r holds experts r·E/n to (r+1)·E/n - 1 and
# its own tokens. `all_to_all` is the collective for it: rank i sends a different piece to each
# rank j (the tokens routed to j's experts), and receives one from each.
#
# Here by hand, the simplest case: E = 2 experts (one per rank), k = 1.
#
# **Predict:** if the router sent tokens uniformly, how many of rank 0's 16 tokens would cross to
# rank 1?

# %%
guess_crossing = None

# %%
%%distributed
from torch import nn
h, T, E = 8, 16, 2
torch.manual_seed(0)
router = nn.Linear(h, E, bias=False)
experts = [nn.Linear(h, h) for _ in range(E)]          # every rank builds both; rank r uses expert r
x = torch.randn(world_size * T, h, generator=torch.Generator().manual_seed(1))
x_r = x.chunk(world_size)[rank]                         # my tokens

prob, choice = torch.softmax(router(x_r), -1).max(-1)   # top-1 routing
order = torch.argsort(choice, stable=True)              # my tokens grouped by destination rank
send = torch.bincount(choice, minlength=E)              # how many go to each rank
recv = torch.empty_like(send)
dist.all_to_all_single(recv, send)                      # first the counts...
rows = torch.empty(int(recv.sum()), h)
# ...then the tokens
dist.all_to_all_single(rows, x_r[order].contiguous(), recv.tolist(), send.tolist())
done = experts[rank](rows)                              # my expert on every token routed to it
back = torch.empty(T, h)
dist.all_to_all_single(back, done.detach().contiguous(), send.tolist(), recv.tolist())   # results home
y_r = torch.zeros(T, h).index_copy(0, order, back) * prob.unsqueeze(-1)

p_all, c_all = torch.softmax(router(x), -1).max(-1)    # one process: every token to its expert, here
y_one = torch.stack([experts[int(c)](xi) for xi, c in zip(x, c_all)]) * p_all.unsqueeze(-1)
print(f"rank {rank}: sends {send.tolist()} tokens to ranks [0, 1], receives {recv.tolist()}; "
      f"max diff to one process {(y_r - y_one.chunk(world_size)[rank]).abs().max():.1e}")

# %%
print(f"your guess: {guess_crossing} tokens cross")

# %% [markdown]
# Uniform routing would send (n-1)/n of the tokens off the rank: 8 of 16. This router is not
# uniform: an untrained router's probabilities depend on the tokens only through a random
# matrix, and some experts win more tokens than others. The collective moves every token to its
# expert's rank and back, 2 all-to-alls forward (dispatch, combine) and 2 backward.
#
# ## 4. Load balance, capacity and dropped tokens
#
# An expert that receives too many tokens is a straggler: its rank computes while the others
# wait, and its buffers must be sized for the worst case. GShard and Switch cap each expert at a
# **capacity** C = ⌈capacity factor × T × k / E⌉ tokens per batch (T tokens, first come first
# served); the tokens beyond it are **dropped** by that expert (their output is 0 from it, and a
# residual connection carries them on). Training adds a load-balancing loss to even the router
# out (Switch's auxiliary loss): measured at the end of this section.
#
# The kit's `check_ep` (`kit/experiments/parallel/expert.py`, beside `route`, `MoE` and
# `ExpertParallelMoE`) trains the kit's MoE layer (E = 4 experts, k = 2, h = 32, 16 tokens per
# rank) 3 steps expert-parallel on 2 ranks and in one process, with three capacity factors.
#
# **Predict:** C per rank's batch for capacity factors 1.0 and 0.5; with 16 tokens × k = 2 = 32
# assignments per rank, 64 in all, at least how many are dropped with factor 0.5?

# %%
guess_capacity_1, guess_capacity_05, guess_min_dropped = None, None, None

# %%
%%distributed
from kit.experiments import check_ep
moe = {cf: check_ep(capacity_factor=cf) for cf in (None, 1.0, 0.5)}
if rank == 0:
    for cf, r in moe.items():
        counted = {k_: (v_["calls"], int(v_["payload_bytes"]))
                   for k_, v_ in r["bytes"]["measured"].items()}
        pred = r["bytes"]["predicted"]["ep/all_to_all"]
        print(f"capacity factor {'none' if cf is None else cf}: C = {r['capacity'] or 'unlimited'} per "
              f"rank's batch")
        print(f"  per expert, both ranks, last step: routed {r['load']['routed']}, "
              f"kept {r['load']['kept']}, dropped {sum(r['load']['dropped'])}")
        print(f"  last step (calls, bytes) {counted}")
        print(f"  tokens' bytes predicted from its routing {pred['payload_bytes']:,}; "
              f"weights vs one process {r['diffs']['weights']:.1e}")

# %%
%dist pull moe --ranks 0
print(f"your guesses: C = {guess_capacity_1} and {guess_capacity_05}, at least {guess_min_dropped} "
      f"dropped")
from kit.plots import expert_load
expert_load([moe[None], moe[1.0], moe[0.5]])    # also takes the records of strategy="ep" runs

# %% [markdown]
# C = ⌈1.0 × 16 × 2 / 4⌉ = 8 and ⌈0.5 × 8⌉ = 4 per rank's batch; with 4 experts × 4 × 2 ranks =
# 32 slots for 64 assignments, at least 32 are dropped at factor 0.5 (exactly 32 when every expert
# is over its capacity on both ranks). Even factor 1.0, with as many slots as assignments, drops
# some: the router is not balanced, and one expert's overflow cannot use another's free slots.
#
# The plot adds both ranks: a bar's solid part is what its expert kept, the hatched part what it
# dropped, its top what the router sent it; the dashed lines are the capacities, C × 2 ranks =
# 16 and 8. An expert can drop tokens while its kept part stays under its line: the capacity
# holds per rank, so one rank's overflow cannot use the other rank's free slots either.
# The bytes follow the routing: a dropped token is not sent, so the
# all-to-all carries fewer rows, and the kit's prediction from the routing counts matches what
# was sent.
#
# ### The load-balancing loss
#
# Nothing in the task loss asks the router to spread the tokens; a router that sends everything to
# the experts that learned first is a stable place to end. Switch Transformer (Fedus et al. 2021)
# adds an **auxiliary loss** α · E · Σᵢ fᵢ · Pᵢ: fᵢ is the share of the assignments that went to
# expert i, Pᵢ the router's mean probability for it (Switch routes each token to one expert; with
# k = 2, as here, the kit counts both choices in fᵢ, where GShard counts the first only). A router
# whose probabilities are all 1/E scores 1, whatever it sends where, and the loss grows as
# the assignments and the probabilities pile onto the same experts (the collapsed router
# below scores about 1.7); the gradient flows through Pᵢ (fᵢ is a count). Switch used α = 0.01.
#
# The next cell trains the kit's MoE layer (E = 4, k = 2, no capacity limit while training) in this
# notebook's process for 150 steps on inputs that share a common offset, three times: α = 0, 0.01
# and 0.1; then routes 256 fresh tokens with capacity factor 1.0 and counts the drops. It is
# deterministic (seeded, no timing): every run prints the same numbers.
#
# **Predict:** without the auxiliary loss, how many of the 512 assignments are dropped?

# %%
guess_dropped_no_aux = None

# %%
import torch
from torch import nn
from kit.experiments import MoE, route


def balance_loss(x, router, k):
    """Switch's auxiliary loss without alpha: E * sum_i f_i * P_i (1 when every probability is 1/E)."""
    probs = torch.softmax(router(x), dim=-1)
    experts = probs.shape[1]
    f = torch.bincount(probs.topk(k, dim=-1).indices.reshape(-1),
                       minlength=experts).float() / (x.shape[0] * k)
    return experts * (f * probs.mean(0)).sum()


def train_router(alpha, steps=150):
    moe = MoE(hidden=32, experts=4, k=2, capacity_factor=None, seed=0)
    torch.manual_seed(2)
    teacher = nn.Linear(32, 32)                       # the task: match a fixed linear map
    g = torch.Generator().manual_seed(1)
    offset = torch.randn(32, generator=g)              # every input leans the same way
    opt = torch.optim.Adam(moe.parameters(), lr=3e-3)
    for _ in range(steps):
        x = torch.randn(64, 32, generator=g) + offset
        task = nn.functional.mse_loss(moe(x), teacher(x).detach())
        opt.zero_grad()
        (task + alpha * balance_loss(x, moe.router, 2)).backward()
        opt.step()
    x = torch.randn(256, 32, generator=g) + offset
    with torch.no_grad():
        load = route(x, moe.router, 2, 1.0).load(4)
        return load, balance_loss(x, moe.router, 2).item(), task.item()


print(f"your guess: {guess_dropped_no_aux}")
balanced = {}
threads = torch.get_num_threads()
# tiny ops: on a busy machine a second thread waits for its core far longer than it helps
torch.set_num_threads(1)
for alpha in (0.0, 0.01, 0.1):
    load, aux, task = train_router(alpha)
    balanced[alpha] = sum(load["dropped"])
    print(f"alpha {alpha:<4}: routed per expert {load['routed']}, dropped at capacity 1.0 "
          f"{balanced[alpha]:3d} of 512; E*sum(f*P) {aux:.3f} (1: all P = 1/E); "
          f"last task loss {task:.4f}")
torch.set_num_threads(threads)

# %% [markdown]
# Without the auxiliary loss this router collapsed: two experts take every assignment (with k = 2,
# every token's two choices), the other two learn nothing, and at capacity factor 1.0 half of the
# assignments are dropped. α = 0.01 spreads the load and α = 0.1 nearly evens it, at a small cost in
# the task loss: the two pull against each other, which is why α is kept small. Later designs
# balance differently: ST-MoE adds a router z-loss (keeps the logits small and stable);
# DeepSeek-V3 drops the auxiliary loss for a per-expert bias added to the routing scores and nudged
# after every step ("auxiliary-loss-free" balancing); MegaBlocks (Gale et al. 2022) removes the
# capacity instead, so no token is ever dropped ("dropless"), and pays with uneven work per expert.
#
# ## What differs on real GPUs
#
# - Ring attention's hops go over NVLink or InfiniBand and overlap the block computations; the
#   zig-zag split balances the work as counted here.
# - MoE all-to-alls cross every rank of the expert group, and their cost grows with k and with
#   imbalance. Two regimes: expert parallelism inside a node (or a few), on NVLink; or across many
#   nodes with the routing limited so that each token reaches few of them: DeepSeek-V3 ran 64-way
#   expert parallelism across 8 nodes, each token sent to at most 4 nodes (node-limited routing,
#   DeepSeek-AI 2024, sections 2.1.2 and 3.2).
#
# ## Exercises
#
# **1.** Ring attention on t = 4 ranks, b = 1, s = 32,768, h = 4,096 (K and V of h each), bf16.
# How many bytes does each rank send in the forward of one attention?
#
# <details><summary>Answer</summary>
#
# Each hop sends a K block and a V block of b·(s/t)·h·2 = 8,192 × 4,096 × 2 = 64 MiB each;
# t - 1 = 3 hops: 6 × 64 MiB = 384 MiB.
# </details>
#
# **2.** Causal attention, s = 64, t = 2 and zig-zag: which chunks (of 16 tokens) does each rank
# hold, and why is the work equal?
#
# <details><summary>Answer</summary>
#
# Rank 0: chunks 0 and 3; rank 1: chunks 1 and 2. Chunk c's queries see c full chunks and half
# of their own: 0 + 3 = 1 + 2 full chunks per rank (16 × 16 pairs each), plus 2 diagonal blocks
# of 16 × 17 / 2 = 136 each: 3 × 256 + 2 × 136 = 1,040 pairs per sequence and head on both.
# </details>
#
# **3.** E = 64 experts, k = 8, 4,096 tokens per rank, capacity factor 1.25. What is C?
#
# <details><summary>Answer</summary>
#
# ⌈1.25 × 4,096 × 8 / 64⌉ = ⌈640⌉ = 640 token assignments per expert.
# </details>
#
# ## Check against one process
#
# Ring attention (contiguous and zig-zag, with and without the causal mask): output and the
# gradients of q, k and v equal to full attention in one process; the hops counted as predicted.
# Ulysses' output equals full attention, and its all-to-alls sent the bytes of the formula.
# The MoE layer: 3 steps of training expert-parallel land on the weights of one process, at every
# capacity factor.

# %%
%%distributed
for r in (cp_full, contiguous, zigzag):
    assert r["max_abs_diff"] < 1e-5, r["diffs"]
    got, want = r["bytes"]["measured"]["cp/send"], r["bytes"]["predicted"]["cp/send"]
    assert got["calls"] == want["calls"] and got["payload_bytes"] == want["payload_bytes"], (got, want)
# Ulysses
assert (ulysses - full).abs().max() < 1e-5 and ulysses_sent == 4 * (t - 1) * q_r.numel() * 4 // t
for cf, r in moe.items():
    assert r["diffs"]["weights"] < 1e-5 and r["weights_moved"] > 100 * r["diffs"]["weights"], cf
    got, want = r["bytes"]["measured"]["ep/all_to_all"], r["bytes"]["predicted"]["ep/all_to_all"]
    assert got["payload_bytes"] == want["payload_bytes"], (cf, got, want)
"check passed"
