"""The kit's models, as a learner reads them: an MLP, a small CNN and a small GPT (nanoGPT's block).

Every model is an `nn.Sequential` of blocks, so model and pipeline parallel can cut it into
contiguous stages and a parallelism can replace one block's layers. The sizes of each model are
`kit.experiments.choices.WORKLOAD_SIZES` (width, depth per `model_size`), their one copy; the data
the workloads train them on is `measure/workloads.py`'s. The hand-written parallelisms
(`parallel/`) split these same blocks, and their one-process reference (`parallel/reference.small_gpt`)
is built from them.
"""
from __future__ import annotations

import torch
from torch import nn
from torch.utils.checkpoint import checkpoint

from kit import _renamed
from kit.experiments.choices import GPT_SEQ, WORKLOAD_SIZES, gpt_heads

__all__ = ["Checkpointed", "Embed", "Block", "Head", "mlp", "cnn", "gpt", "build_model", "VOCAB", "MLP_IN",
           "CLASSES", "IMG"]

MLP_IN, CLASSES, IMG, VOCAB = 256, 10, 32, 256  # MLP input features, classes, CNN image side, GPT vocabulary
__getattr__ = _renamed.renamed_getattr(__name__)  # this release's old names, for one release


class Checkpointed(nn.Module):
    """Recompute the block's activations in backward instead of saving them (trade compute for memory)."""

    def __init__(self, block: nn.Module):
        super().__init__()
        self.block = block

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return checkpoint(self.block, x, use_reentrant=False)


class Embed(nn.Module):
    def __init__(self, d: int):
        super().__init__()
        self.tok = nn.Embedding(VOCAB, d)
        self.pos = nn.Parameter(torch.zeros(GPT_SEQ, d))  # one position per token of a sample

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        return self.tok(idx) + self.pos[: idx.shape[1]]


class Block(nn.Module):
    """Pre-norm transformer block (nanoGPT's shape): causal self-attention then an MLP."""

    def __init__(self, d: int, heads: int):
        super().__init__()
        self.ln1, self.ln2 = nn.LayerNorm(d), nn.LayerNorm(d)
        self.qkv, self.proj = nn.Linear(d, 3 * d), nn.Linear(d, d)
        self.mlp = nn.Sequential(nn.Linear(d, 4 * d), nn.GELU(), nn.Linear(4 * d, d))
        self.heads = heads

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # The shapes come from qkv's output, not x: a tensor-parallel rank runs this same forward on its
        # slices (parallel/tensor.py TPBlock), where qkv holds a share of the heads and, under sequence
        # parallelism, gathers the whole sequence from x's slice of it.
        qkv = self.qkv(self.ln1(x))
        b, t = qkv.shape[:2]
        q, k, v = qkv.view(b, t, 3, self.heads, -1).unbind(2)
        y = nn.functional.scaled_dot_product_attention(
            q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), is_causal=True)
        x = x + self.proj(y.transpose(1, 2).reshape(b, t, -1))
        return x + self.mlp(self.ln2(x))


class Head(nn.Module):
    def __init__(self, d: int):
        super().__init__()
        self.ln, self.out = nn.LayerNorm(d), nn.Linear(d, VOCAB)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.out(self.ln(x))


def mlp(width: int, depth: int) -> list[nn.Module]:
    """`depth` Linear + ReLU blocks of `width`, then the classifier."""
    dims = [MLP_IN] + [width] * depth
    blocks: list[nn.Module] = [nn.Sequential(nn.Linear(a, b), nn.ReLU()) for a, b in zip(dims, dims[1:])]
    return blocks + [nn.Linear(width, CLASSES)]


def cnn(width: int, depth: int) -> list[nn.Module]:
    """`depth` conv + ReLU + max-pool blocks (channels doubling from `width`), then the classifier."""
    blocks: list[nn.Module] = []
    c_in = 3
    for i in range(depth):
        c_out = width * 2**i
        blocks.append(nn.Sequential(nn.Conv2d(c_in, c_out, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2)))
        c_in = c_out
    side = IMG // 2**depth
    blocks.append(nn.Sequential(nn.Flatten(), nn.Linear(c_in * side * side, CLASSES)))
    return blocks


def gpt(width: int, depth: int, heads: int | None = None) -> list[nn.Module]:
    """Embed, `depth` pre-norm transformer blocks, LayerNorm + head; a head is 32 wide unless `heads` says."""
    return [Embed(width)] + [Block(width, heads or gpt_heads(width)) for _ in range(depth)] + [Head(width)]


def build_model(name: str, model_size: str = "small", seed: int = 0, checkpointing: bool = False) -> nn.Sequential:
    """The workload's model at that size, seeded (every rank builds the same weights); with `checkpointing`,
    the inner blocks recompute their activations in backward (the first and last feed and consume data)."""
    torch.manual_seed(seed)
    width, depth = WORKLOAD_SIZES[name][model_size]
    blocks = {"mlp": mlp, "cnn": cnn, "gpt": gpt}[name](width, depth)
    if checkpointing:
        blocks = [blocks[0]] + [Checkpointed(b) for b in blocks[1:-1]] + [blocks[-1]]
    return nn.Sequential(*blocks)
