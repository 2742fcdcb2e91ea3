"""Model descriptions for planning: the shapes that decide memory and FLOPs, with sourced presets.

Pure Python (no torch). `ModelSpec.params()` counts parameters from the shapes (checked against
the published totals in tests/test_plan.py); a torch module's shapes are read by
`kit.experiments.measure.model_shapes.spec_from_module`, outside this folder, so planning never imports torch.

Sources of the presets (also in docs/predicting.md, "Planning a run"):
- GPT-2: Radford et al. 2019, "Language Models are Unsupervised Multitask Learners", Table 2
  (layers, d_model); heads, vocab 50,257 and 1,024 positions from the released configs
  (Hugging Face `gpt2`, `gpt2-medium`, `gpt2-large`, `gpt2-xl` config.json).
- Llama 3: Dubey et al. 2024, "The Llama 3 Herd of Models" (arXiv:2407.21783), Table 3 (layers,
  model dim, FFN dim, heads, 8 KV heads); vocab 128,256 and untied embeddings from Meta's
  config.json (meta-llama/Meta-Llama-3-8B, -70B, Llama-3.1-405B).
- Mixtral 8x7B: Jiang et al. 2024, "Mixtral of Experts" (arXiv:2401.04088), Table 1 (dim 4096,
  32 layers, 32 heads, 8 KV heads, hidden 14,336, vocab 32,000, 8 experts, top-2).
"""
from __future__ import annotations

from dataclasses import dataclass, replace
from functools import lru_cache

from kit.keywords import closest

__all__ = ["ModelSpec", "MODELS", "get_model"]


@dataclass(frozen=True)
class ModelSpec:
    """A decoder-only transformer: enough shape to count parameters, FLOPs and activations."""
    name: str
    layers: int
    hidden: int
    heads: int
    kv_heads: int
    ffn: int                    # MLP inner size (per expert for an MoE)
    vocab: int
    seq_len: int = 2048         # training sequence length (plan(seq_len=...) overrides it)
    gated_mlp: bool = True      # SwiGLU: three matrices (gate, up, down); GPT-2's GeLU MLP: two
    experts: int = 1            # MoE experts per layer (1: dense)
    experts_per_token: int = 1  # top-k routing
    tied_embeddings: bool = False
    positions: int = 0          # learned position embeddings (GPT-2); 0 for RoPE
    bias: bool = False          # linear and norm biases (GPT-2 yes, Llama no)
    dropout: bool = False       # dropout masks are stored activations (Korthikanti et al. 2022 count them)
    head_bias: bool = False     # a bias on the output head (the kit's toy GPT has one; GPT-2 and Llama not)
    flash_attention: bool = True  # fused attention (FlashAttention, torch's SDPA): the s x s scores are never stored
    source: str = ""

    def __post_init__(self) -> None:
        shapes = {"layers": self.layers, "hidden": self.hidden, "heads": self.heads, "kv_heads": self.kv_heads,
                  "ffn": self.ffn, "vocab": self.vocab, "seq_len": self.seq_len, "experts": self.experts}
        bad = [f"{k}={v!r}" for k, v in shapes.items() if isinstance(v, bool) or not isinstance(v, int) or v <= 0]
        if bad:  # NaN and floats included: NaN compares False with everything and would pass a `<= 0` test
            raise ValueError(f"{self.name}: {', '.join(bad)}: every shape must be a whole number of at least 1")
        if self.hidden % self.heads or self.heads % self.kv_heads:
            raise ValueError(f"{self.name}: hidden ({self.hidden}) must divide by heads ({self.heads}) and "
                             f"heads by kv_heads ({self.kv_heads})")
        if not 1 <= self.experts_per_token <= self.experts:
            raise ValueError(f"{self.name}: experts_per_token must be in 1..experts")

    def __hash__(self) -> int:
        # a planner hashes the spec tens of thousands of times (the cached methods below, gemm_efficiency);
        # the generated hash covers all 18 fields. Equal specs share these, so the hash stays consistent with ==
        return hash((self.name, self.layers, self.hidden, self.ffn, self.vocab, self.seq_len))

    @property
    def head_dim(self) -> int:
        return self.hidden // self.heads

    @lru_cache(maxsize=None)  # a planner asks thousands of times; the spec is frozen
    def attention_params(self) -> int:
        """Q and output projections h x h; K and V h x (kv_heads * head_dim) each (GQA)."""
        h, kv = self.hidden, self.kv_heads * self.head_dim
        return 2 * h * h + 2 * h * kv + ((2 * h + 2 * kv) if self.bias else 0)

    @lru_cache(maxsize=None)  # a planner asks thousands of times; the spec is frozen
    def expert_params(self) -> int:
        """One expert's MLP: 3 h f (gated) or 2 h f, plus biases."""
        h, f = self.hidden, self.ffn
        return (3 if self.gated_mlp else 2) * h * f + ((f + h) if self.bias else 0)

    def norm_params(self) -> int:
        return (2 if self.bias else 1) * self.hidden  # LayerNorm has a bias, RMSNorm not

    @lru_cache(maxsize=None)  # a planner asks thousands of times; the spec is frozen
    def layer_params(self) -> tuple[int, int]:
        """(attention + norms + router, MLP or all experts) parameters of one layer."""
        router = self.hidden * self.experts if self.experts > 1 else 0
        dense = self.attention_params() + 2 * self.norm_params() + router
        return dense, self.experts * self.expert_params()

    def embedding_params(self) -> int:
        """Input embedding (+ learned positions); the output head is separate unless tied."""
        return (self.vocab + self.positions) * self.hidden

    def head_params(self) -> int:
        return (0 if self.tied_embeddings else self.vocab * self.hidden) + (self.vocab if self.head_bias else 0)

    @lru_cache(maxsize=None)  # a planner asks thousands of times; the spec is frozen
    def params(self) -> int:
        """Every parameter, counted once (tied embeddings once)."""
        dense, expert = self.layer_params()
        return self.layers * (dense + expert) + self.embedding_params() + self.head_params() + self.norm_params()

    @lru_cache(maxsize=None)  # a planner asks thousands of times; the spec is frozen
    def active_params(self) -> int:
        """Parameters one token's matmuls use: top-k experts, the output head (a matmul even when
        tied), not the embedding lookups. This N is the one in 6N FLOPs per token."""
        dense, _ = self.layer_params()
        per_layer = dense + self.experts_per_token * self.expert_params()
        head = self.vocab * self.hidden + (self.vocab if self.head_bias else 0)
        return self.layers * per_layer + head + self.norm_params()

    def with_seq_len(self, seq_len: int) -> ModelSpec:
        return replace(self, seq_len=seq_len)


_GPT2 = ("Radford et al. 2019 (GPT-2) Table 2; Hugging Face gpt2 config.json (heads, vocab 50257, "
         "1024 positions, tied embeddings)")
_LLAMA3 = "Dubey et al. 2024, arXiv:2407.21783 Table 3; Meta config.json (vocab 128256, untied)"


def _gpt2(name: str, layers: int, hidden: int, heads: int) -> ModelSpec:
    return ModelSpec(name, layers, hidden, heads, heads, 4 * hidden, 50257, seq_len=1024, gated_mlp=False,
                     tied_embeddings=True, positions=1024, bias=True, dropout=True, source=_GPT2)


def _llama3(name: str, layers: int, hidden: int, heads: int, ffn: int) -> ModelSpec:
    return ModelSpec(name, layers, hidden, heads, 8, ffn, 128256, seq_len=8192, source=_LLAMA3)


MODELS: dict[str, ModelSpec] = {
    "gpt2": _gpt2("gpt2", 12, 768, 12),
    "gpt2-medium": _gpt2("gpt2-medium", 24, 1024, 16),
    "gpt2-large": _gpt2("gpt2-large", 36, 1280, 20),
    "gpt2-xl": _gpt2("gpt2-xl", 48, 1600, 25),
    "llama3-8b": _llama3("llama3-8b", 32, 4096, 32, 14336),
    "llama3-70b": _llama3("llama3-70b", 80, 8192, 64, 28672),
    "llama3-405b": _llama3("llama3-405b", 126, 16384, 128, 53248),
    "mixtral-8x7b": ModelSpec("mixtral-8x7b", 32, 4096, 32, 8, 14336, 32000, seq_len=4096, experts=8,
                              experts_per_token=2, source="Jiang et al. 2024, arXiv:2401.04088 Table 1"),
}


def get_model(model: str | ModelSpec) -> ModelSpec:
    """A preset by name, or the spec itself; a clear error lists the presets."""
    if isinstance(model, ModelSpec):
        return model
    key = str(model).lower()
    if key not in MODELS:
        # a prefix ('mixtral'), else a near spelling ('llama3_70b'); strict enough that 'gpt3' is not sent to gpt2
        close = [m for m in MODELS if m.startswith(key)] or [
            m for m in [closest(key.replace("_", "-"), MODELS, cutoff=0.8)] if m]
        raise ValueError(f"unknown model {model!r}" + (f" (did you mean {close[0]!r}?)" if close else "")
                         + f": presets are {', '.join(MODELS)}; or pass a ModelSpec "
                         "(kit.experiments.measure.model_shapes.spec_from_module reads one from a torch module)")
    return MODELS[key]
