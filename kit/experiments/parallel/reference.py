"""The SGD reference: one process training a small GPT, which every hand-written parallelism (tp, sp,
cp, ep, the meshes) is checked against; not `strategy="single"` (strategies/single.py, Adam), the run
loop's one-process baseline.

A small GPT built from the kit's model (kit/experiments/models.gpt: `Embed`, `Block`, `Head`), seeded so every rank
builds the same weights; token batches from a seeded generator (every rank draws the same); a
plain training loop (SGD: Adam divides each update by the gradient's own size, so a gradient
wrong by a constant factor, e.g. a missing all-reduce, would leave Adam's weights almost equal;
SGD's weights differ by lr x the gradient error); and the comparison (max |a - b| over every
parameter, by the full model's names).
"""
from __future__ import annotations

from typing import Any, Callable, Iterable, TypedDict

import torch
from torch import nn

from kit import _renamed
from kit.experiments.choices import GPT_SEQ
from kit.experiments.models import VOCAB, gpt

__all__ = ["small_gpt", "token_batches", "train", "max_abs_diff", "lm_loss", "SGD_LR", "CheckResult", "check_result",
           "trained_diffs"]

SGD_LR = 0.1  # the reference's optimizer (train: SGD)
__getattr__ = _renamed.renamed_getattr(__name__)  # this release's old names, for one release


def small_gpt(hidden: int = 64, heads: int = 4, layers: int = 2, seed: int = 0,
              device: str | torch.device = "cpu") -> nn.Sequential:
    """Embed, `layers` pre-norm transformer blocks (causal attention + 4h MLP), LayerNorm + head.
    Built on the CPU from the seed, then moved: the same weights on every device."""
    torch.manual_seed(seed)
    return nn.Sequential(*gpt(hidden, layers, heads)).to(device)


def token_batches(steps: int, batch: int, seq: int = GPT_SEQ, seed: int = 1,
                  device: str | torch.device = "cpu") -> list[tuple[torch.Tensor, torch.Tensor]]:
    """`steps` (input, next-token target) batches of shape (batch, seq), the same on every rank
    (drawn on the CPU, then moved to `device`)."""
    g = torch.Generator().manual_seed(seed)
    toks = [torch.randint(0, VOCAB, (batch, seq + 1), generator=g).to(device) for _ in range(steps)]
    return [(t[:, :-1].contiguous(), t[:, 1:].contiguous()) for t in toks]


def lm_loss(logits: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    return nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]).float(), y.reshape(-1))


def train(model: nn.Module, batches: Iterable[tuple[torch.Tensor, torch.Tensor]],
          step_fn: Callable[[nn.Module, torch.Tensor, torch.Tensor], torch.Tensor] | None = None,
          params: list[torch.Tensor] | None = None, after_backward: Callable[[], None] | None = None,
          foreach: bool | None = None) -> list[float]:
    """SGD steps (lr `SGD_LR`) on the batches; `step_fn(model, x, y)` returns the loss (default: the LM
    loss); `after_backward()` runs before each optimizer step (gradient synchronisation).
    `foreach=False`: one update per parameter, for a model mixing DTensor and plain parameters (torch's
    default on CUDA, one `_foreach_add_` over all of them, refuses the mix)."""
    opt = torch.optim.SGD(params if params is not None else list(model.parameters()), lr=SGD_LR, foreach=foreach)
    losses = []
    for x, y in batches:
        loss = step_fn(model, x, y) if step_fn else lm_loss(model(x), y)
        loss.backward()
        if after_backward:
            after_backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        losses.append(float(loss.detach()))
    return losses


def max_abs_diff(full: dict[str, torch.Tensor], ref: nn.Module) -> float:
    """Largest |a - b| over every parameter of `ref`; a missing name is an error (nothing dropped)."""
    worst = 0.0
    for name, p in ref.named_parameters():
        if name not in full:
            raise KeyError(f"parameter {name} is missing from the parallel model's gathered state")
        worst = max(worst, float((full[name].detach() - p.detach()).abs().max()))
    return worst


class CheckResult(TypedDict, total=False):
    """What every `check_*` returns (a dict: it crosses processes and prints in a cell; for one release
    it also answers the previous release's `weights_max_abs_diff` and `loss_max_abs_diff`, with a
    FutureWarning, kit/_renamed.py), with the check's own keys beside these:

    - `max_abs_diff`: the largest |difference| from one process over everything compared;
    - `diffs`: each compared quantity's max |difference|: {"weights", "loss"} after training, or
      {"out", "grad_q", "grad_k", "grad_v"} for one attention;
    - `weights_moved`: how far training moved the one-process weights (None: nothing trained), so a
      check that compares weights can be seen not to pass vacuously;
    - `bytes`: {"measured": the collectives counted (wire.py), "predicted": theory/comm_bytes.py's}.
    """

    max_abs_diff: float
    diffs: dict[str, float]
    weights_moved: float | None
    bytes: dict[str, Any]


def check_result(diffs: dict[str, float], measured: dict[str, Any], predicted: dict[str, Any],
                 weights_moved: float | None = None, **own: Any) -> dict[str, Any]:
    """A `CheckResult`: the common keys, then the check's own."""
    return _renamed.RenamedKeys("check_*()", {"max_abs_diff": max(diffs.values()), "diffs": dict(diffs),
                                              "weights_moved": weights_moved,
                                              "bytes": {"measured": measured, "predicted": predicted}, **own})


def trained_diffs(full: dict[str, torch.Tensor], ref: nn.Module, losses: list[float],
                  ref_losses: list[float]) -> dict[str, float]:
    """After training both: the weights' and the losses' max |difference| from one process."""
    return {"weights": max_abs_diff(full, ref), "loss": max(abs(a - b) for a, b in zip(losses, ref_losses))}
