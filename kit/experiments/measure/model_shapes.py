"""Read a ModelSpec (the planner's model description) from a torch module's shapes, duck-typed.

Lives in measure/ (it reads a model, as the other instruments do), not in theory/, which must
never import torch. It does not import torch itself either: it only reads attributes a torch module
already has (named_modules, in_features, ...), so the caller's import of torch is the only one.

Two ways, tried in order:
1. a Hugging Face-style `module.config` (Llama/Mistral/Mixtral names, or GPT-2's n_layer, n_embd ...);
2. the modules themselves: the token embedding (num_embeddings x embedding_dim), blocks that carry a
   head count (`heads`, `num_heads`, `n_head`), the MLP's down projection (in ffn, out hidden), a
   second projection of the same width (gated MLP), dropout modules, and a head sharing the embedding.
"""
from __future__ import annotations

from typing import Any

from kit.experiments.theory.models import ModelSpec

__all__ = ["spec_from_module"]

_HEAD_ATTRS = ("heads", "num_heads", "n_head", "num_attention_heads")


def _from_config(cfg: Any, name: str, seq_len: int | None) -> ModelSpec | None:
    get = lambda *keys: next((getattr(cfg, k) for k in keys if getattr(cfg, k, None) is not None), None)  # noqa: E731
    layers, hidden = get("num_hidden_layers", "n_layer"), get("hidden_size", "n_embd")
    heads, vocab = get("num_attention_heads", "n_head"), get("vocab_size")
    if not (layers and hidden and heads and vocab):
        return None
    gpt2 = getattr(cfg, "n_embd", None) is not None
    experts = get("num_local_experts", "num_experts") or 1
    return ModelSpec(name, int(layers), int(hidden), int(heads), int(get("num_key_value_heads") or heads),
                     int(get("intermediate_size", "n_inner") or 4 * hidden), int(vocab),
                     seq_len=int(seq_len or get("max_position_embeddings", "n_positions") or 2048),
                     gated_mlp=not gpt2, experts=int(experts),
                     experts_per_token=int(get("num_experts_per_tok") or 1),
                     tied_embeddings=bool(get("tie_word_embeddings") if not gpt2 else True),
                     positions=int(get("n_positions") or 0) if gpt2 else 0, bias=gpt2, dropout=gpt2,
                     source="read from the module's config")


def _from_modules(module: Any, name: str, seq_len: int | None) -> ModelSpec:
    mods = list(module.named_modules())
    embeds = [m for _, m in mods if hasattr(m, "num_embeddings") and hasattr(m, "embedding_dim")]
    blocks = [m for _, m in mods if any(isinstance(getattr(m, a, None), int) for a in _HEAD_ATTRS)]
    if not embeds or not blocks:
        raise ValueError("cannot read a transformer from this module: it needs a token embedding (an "
                         "nn.Embedding) and blocks with a head count attribute (heads / num_heads / n_head); "
                         "describe it with kit.experiments.theory.models.ModelSpec instead")
    tok = max(embeds, key=lambda e: e.num_embeddings)
    hidden, vocab = int(tok.embedding_dim), int(tok.num_embeddings)
    block = blocks[0]
    heads = next(int(getattr(block, a)) for a in _HEAD_ATTRS if isinstance(getattr(block, a, None), int))
    kv = next((int(getattr(block, a)) for a in ("kv_heads", "num_key_value_heads", "n_kv_heads")
               if isinstance(getattr(block, a, None), int)), heads)
    linears = [m for _, m in block.named_modules() if hasattr(m, "in_features") and hasattr(m, "out_features")]
    downs = [m for m in linears if m.out_features == hidden and m.in_features != hidden]
    ffn = int(downs[0].in_features) if downs else 4 * hidden
    gated = sum(1 for m in linears if m.out_features == ffn and m.in_features == hidden) >= 2
    weight = getattr(tok, "weight", None)
    heads_out = [m for _, m in mods if getattr(m, "out_features", None) == vocab]
    tied = any(getattr(m, "weight", None) is weight for m in heads_out)
    positions = sum(int(p.shape[0]) for n, p in module.named_parameters()
                    if "pos" in n.lower() and len(p.shape) == 2 and int(p.shape[1]) == hidden)
    return ModelSpec(name, len(blocks), hidden, heads, kv, ffn, vocab, seq_len=int(seq_len or positions or 2048),
                     gated_mlp=gated, tied_embeddings=tied, positions=positions,
                     bias=any(getattr(m, "bias", None) is not None for m in linears),
                     dropout=any("Dropout" in type(m).__name__ for _, m in mods),
                     head_bias=any(getattr(m, "bias", None) is not None for m in heads_out),
                     source="read from the module's shapes")


def spec_from_module(module: Any, name: str | None = None, seq_len: int | None = None) -> ModelSpec:
    """A ModelSpec for a torch transformer (no torch import here: the module is read duck-typed)."""
    label = name or type(module).__name__
    cfg = getattr(module, "config", None)
    spec = _from_config(cfg, label, seq_len) if cfg is not None else None
    return spec or _from_modules(module, label, seq_len)
