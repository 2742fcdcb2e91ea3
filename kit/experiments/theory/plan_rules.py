"""What `plan` accepts: its arguments' types and ranges, the knobs a user fixed, and why a layout cannot run.

Pure Python (no torch). Every refusal names the value and says what to write instead; plan.py calls
`check_arguments` first, so a wrong type never reaches the arithmetic as a bare TypeError.
"""
from __future__ import annotations

import math
import numbers
from dataclasses import replace
from typing import Any, NamedTuple

from kit.errors import ConfigError
from kit.experiments.theory.cluster import ClusterSpec, refuse_too_large_cluster
from kit.experiments.theory.layout_memory import FRAMEWORKS, ParallelConfig
from kit.experiments.theory.models import MODELS, ModelSpec

__all__ = ["PlanError", "Refusal", "check_arguments", "check_fixed", "refusal", "interleaving_refusal", "divisors",
           "NEAR_KEYWORDS"]

# the counts a user may fix in plan() (parallel degrees, sequences per micro-batch, virtual stages): whole numbers >= 1
FIXABLE_COUNTS = ("tp", "pp", "dp", "cp", "ep", "micro_batch", "virtual_stages")


class PlanError(ConfigError):
    """An impossible request, with the reason (a ConfigError, so a ValueError too)."""


class Refusal(NamedTuple):
    """Why a layout cannot run: `kind` names the rule it breaks (Plan.refused counts layouts per kind),
    `reason` says it with this layout's values and what to change."""
    kind: str
    reason: str


# keywords a user brings from elsewhere that plan() (and predict()) spells differently or derives: what to write
# instead (kit.keywords.names_unknown_keywords(near=...) says it)
NEAR_KEYWORDS = {
    "utilization": "utilisation=0.5 (British spelling)",
    "micro_batches": "micro_batch=2: micro_batches (the count per step) follows from global_batch / (dp x micro_batch), "
                     "so fix micro_batch (sequences per micro-batch) or global_batch",
    "world_size": "nodes=2, gpus_per_node=8: the cluster is nodes x gpus_per_node GPUs",
    "gpus": "nodes=2, gpus_per_node=8: the cluster is nodes x gpus_per_node GPUs",
    "num_gpus": "nodes=2, gpus_per_node=8: the cluster is nodes x gpus_per_node GPUs",
    "seq": "seq_len=4096", "seqlen": "seq_len=4096", "sequence_length": "seq_len=4096",
    "batch_size": "global_batch=512 (sequences per optimizer step, over every GPU)",
    "gpu": "accelerator='h100'",
}


def divisors(n: int) -> list[int]:
    return [d for d in range(1, n + 1) if n % d == 0]


def _is_int(v: Any) -> bool:
    return isinstance(v, numbers.Integral) and not isinstance(v, bool)


def _kind(v: Any) -> str:
    name = type(v).__name__
    return "None" if v is None else f"{'an' if name[0] in 'aeiou' else 'a'} {name}"


def _whole(name: str, v: Any, none_means: str | None, example: int, lowest: int | None = None) -> None:
    """`v` must be an int, at least `lowest` if given (None allowed when `none_means` says what None does)."""
    alt = f", or {name}=None {none_means}" if none_means else ""
    if _is_int(v):
        if lowest is not None and v < lowest:
            raise PlanError(f"{name}={v} must be at least {lowest}{alt}")
        return
    if v is None and none_means:
        return
    if isinstance(v, float) and v.is_integer():
        raise TypeError(f"{name}={v!r} is a float; write {name}={int(v)} (a whole number){alt}")
    if isinstance(v, str) and v.strip().isdigit():
        raise TypeError(f"{name}={v!r} is a str; write {name}={int(v)} without quotes{alt}")
    raise TypeError(f"{name}={v!r} is {_kind(v)}; give a whole number such as {name}={example}{alt}")


def check_arguments(model: Any, nodes: Any, gpus_per_node: Any, accelerator: Any, seq_len: Any,
                    global_batch: Any, precision: Any, utilisation: Any, cluster: Any, include_unfit: Any,
                    knobs: dict[str, Any], framework: Any = "torch") -> None:
    """Refuse a wrong type or range in plan()'s arguments at once, saying what to write instead."""
    if not isinstance(model, (str, ModelSpec)):
        raise TypeError(f"model={model!r} is {_kind(model)}; give a preset name ({', '.join(MODELS)}) "
                        "or a ModelSpec")
    if cluster is not None and not isinstance(cluster, ClusterSpec):
        raise TypeError(f"cluster={cluster!r} is {_kind(cluster)}; give a ClusterSpec "
                        "(kit.experiments.cluster_spec) or leave it None and use nodes=, "
                        "gpus_per_node=, accelerator=")
    _whole("nodes", nodes, None, 2, lowest=1)
    _whole("gpus_per_node", gpus_per_node, None, 8, lowest=1)
    refuse_too_large_cluster(nodes, gpus_per_node, PlanError)  # the bound predict() and the plan panel have
    if not isinstance(accelerator, str):
        raise TypeError(f"accelerator={accelerator!r} is {_kind(accelerator)}; name a preset, e.g. "
                        "accelerator='h100'")
    _whole("seq_len", seq_len, "for the model's own", 4096)
    _whole("global_batch", global_batch, "for 4M tokens per step", 512)
    for name, v, default in (("seq_len", seq_len, "the model's own"), ("global_batch", global_batch, "4M tokens")):
        if v is not None and v < 1:
            raise PlanError(f"{name}={v} must be at least 1, or {name}=None for {default}")
    for name in FIXABLE_COUNTS:
        _whole(name, knobs[name], "to try every value", 2, lowest=1)
    _whole("zero", knobs["zero"], "to try 0, 1, 2 and 3", 1)
    if knobs["zero"] is not None and knobs["zero"] not in (0, 1, 2, 3):
        raise PlanError(f"zero={knobs['zero']} must be 0, 1, 2 or 3 (the ZeRO stage), or zero=None to try each")
    for name, value in (("precision", precision), ("recompute", knobs["recompute"])):
        if not isinstance(value, str) and not (name == "recompute" and value is None):
            raise TypeError(f"{name}={value!r} is {_kind(value)}; give its name as a str, e.g. "
                            + ("precision='bf16'" if name == "precision" else
                               "recompute='selective', or recompute=None to pick the least that fits"))
    if framework not in FRAMEWORKS:
        raise PlanError(f"framework={framework!r}: one of {', '.join(map(repr, FRAMEWORKS))} (whose rules a layout "
                        "follows; 'deepspeed' refuses ZeRO-2/3 with pipeline parallelism)")
    if not isinstance(knobs.get("tp_overlap", False), bool):
        raise TypeError(f"tp_overlap={knobs['tp_overlap']!r} is {_kind(knobs['tp_overlap'])}; write True or False")
    if not isinstance(include_unfit, bool):
        raise TypeError(f"include_unfit={include_unfit!r} is {_kind(include_unfit)}; write True or False")
    if utilisation is None:
        return
    if not isinstance(utilisation, numbers.Real) or isinstance(utilisation, bool):
        raise TypeError(f"utilisation={utilisation!r} is {_kind(utilisation)}; give a number between 0 "
                        "and 1, e.g. utilisation=0.5 (the share of the peak FLOP/s a GPU sustains), or None "
                        "for the planner's efficiency by matmul width")
    if not 0 < utilisation <= 1:
        raise PlanError(f"utilisation={utilisation!r} is a share of the peak FLOP/s, between 0 and 1 (e.g. 0.52)")


def refusal(m: ModelSpec, c: ClusterSpec, pc: ParallelConfig, seq_len: int, global_batch: int,
            framework: str = "torch") -> Refusal | None:
    """Why this layout cannot run (the rule's kind, the reason in words); None when it can."""
    if m.heads % pc.tp or m.kv_heads % pc.tp:
        return Refusal("tp_heads", f"tp={pc.tp} does not divide the {m.heads} attention heads and {m.kv_heads} KV heads")
    if pc.pp > m.layers:
        return Refusal("pp_layers", f"pp={pc.pp} is more pipeline stages than the {m.layers} layers")
    if pc.gpus > c.world:
        return Refusal("gpus_over_cluster", f"tp x pp x dp x cp = {pc.gpus} GPUs is larger than the cluster's {c.world}")
    if pc.gpus != c.world:
        return Refusal("gpus_under_cluster", f"tp x pp x dp x cp = {pc.gpus} does not use the cluster's {c.world} GPUs")
    if seq_len % pc.cp:
        return Refusal("cp_sequence", f"cp={pc.cp} does not divide the sequence length {seq_len}")
    if pc.ep > 1 and (m.experts % pc.ep or pc.dp % pc.ep):
        return Refusal("ep_experts", f"ep={pc.ep} must divide the {m.experts} experts and dp={pc.dp}")
    if pc.recompute == "op" and framework != "torch":
        return Refusal("op_recompute_framework",
                       "recompute='op' (torchtitan's per-op selective checkpointing) needs framework='torch'")
    if pc.zero >= 2 and framework == "megatron":
        return Refusal("megatron_zero", "ZeRO-2/3 under Megatron-LM's rules (it shards the optimizer only: its "
                       "distributed optimizer, ZeRO-1); framework='torch' (FSDP2) or 'deepspeed' shard gradients "
                       "and parameters")
    if pc.zero >= 2 and pc.pp > 1 and framework == "deepspeed":
        return Refusal("deepspeed_zero_pp", "ZeRO-2/3 with pipeline parallelism under DeepSpeed's rules (its "
                       "PipelineEngine refuses it; FSDP2 with a pipeline, torchtitan's way, is framework='torch')")
    if global_batch % (pc.dp * pc.micro_batch):
        return Refusal("batch_split",
                       f"the global batch of {global_batch} sequences does not split into dp x micro_batch")
    return interleaving_refusal(m, pc.pp, pc.micro_batches, pc.virtual_stages)


def interleaving_refusal(m: ModelSpec, pp: int, micro_batches: int, v: int) -> Refusal | None:
    """Megatron-LM's conditions for v virtual stages (chunks) per GPU (interleaved 1F1B); None when met.
    Layers that do not split evenly are allowed (Megatron-LM's uneven first and last stages, torchtitan's
    layers per stage): the fullest GPU's chunks set the pace (layout_memory.stage_layers)."""
    if v == 1:
        return None
    if pp == 1:
        return Refusal("interleave_without_pp", f"virtual_stages={v} needs pipeline parallelism (pp > 1)")
    if pp * v > m.layers:
        return Refusal("interleave_chunks", f"pp x virtual_stages = {pp * v} chunks are more than the {m.layers} layers")
    if micro_batches % pp:
        return Refusal("interleave_micro_batches", f"interleaved 1F1B needs the micro-batches per step "
                       f"({micro_batches}) to be a multiple of pp={pp} (as Megatron-LM requires)")
    return None


def check_fixed(m: ModelSpec, c: ClusterSpec, seq: int, batch: int, knobs: dict[str, int | str | None],
                precision: str, framework: str = "torch") -> None:
    """Refuse an impossible fixed knob at once, with the reason."""
    full = {k: v for k, v in knobs.items() if v is not None and k != "recompute"}
    interleaved = "interleaved_1f1b" if (knobs.get("virtual_stages") or 1) > 1 else "1f1b"
    probe = ParallelConfig(**{**{"tp": 1, "pp": 1, "dp": 1, "cp": 1, "ep": 1, "zero": 0, "micro_batch": 1},
                              **full}, recompute=str(knobs["recompute"] or "selective"), precision=precision,
                           schedule=interleaved)
    try:
        probe.check()
    except ValueError as e:
        raise PlanError(str(e)) from None
    if m.heads % probe.tp or m.kv_heads % probe.tp:
        fits = divisors(math.gcd(m.heads, m.kv_heads))
        raise PlanError(f"{_reason(m, c, probe, seq, batch, framework)}; pick tp from {fits} (or leave tp=None to try them all)")
    if probe.pp > m.layers:
        raise PlanError(_reason(m, c, probe, seq, batch, framework))
    fixed = {k: int(knobs[k]) for k in ("tp", "pp", "dp", "cp") if knobs[k] is not None}  # type: ignore[arg-type]
    product = math.prod(fixed.values())
    named = " x ".join(f"{k}={v}" for k, v in fixed.items()) + (f" = {product}" if len(fixed) > 1 else "")
    if probe.gpus > c.world:  # tp and pp passed above, so refusal names this
        more = -(-product // c.gpus_per_node)
        raise PlanError(f"{_reason(m, c, probe, seq, batch, framework)}: fix degrees whose product divides "
                        f"{c.world} (leave dp=None and dp fills the rest), or plan on more GPUs (nodes={more} or "
                        f"more, so that nodes x gpus_per_node is a multiple of {product})")
    if c.world % product:
        raise PlanError(f"{named} does not divide the cluster's {c.world} GPUs: the fixed degrees' product must "
                        f"divide {c.world} (the degrees left None fill the rest); "
                        + (f"pick {next(iter(fixed))} from {divisors(c.world)}" if len(fixed) == 1 else
                           f"pick degrees whose product is one of {divisors(c.world)}") + ", or leave it None")
    if len(fixed) == 4 and product < c.world:
        raise PlanError(f"{named} uses {product} of the cluster's {c.world} GPUs (the degrees must multiply to "
                        f"all of them): leave dp=None and dp fills the cluster (dp={probe.dp * c.world // product} "
                        f"here), or plan on {product} GPUs (nodes= and gpus_per_node= multiplying to {product})")
    if seq % probe.cp:
        raise PlanError(f"cp={probe.cp} does not divide the sequence length {seq}")
    if probe.ep > 1 and (m.experts == 1 or m.experts % probe.ep):
        raise PlanError(f"ep={probe.ep} needs an MoE model whose {m.experts} experts it divides")
    # the micro-batches are not fixed yet: pp of them pass the multiple-of-pp condition
    why_not = interleaving_refusal(m, probe.pp, probe.pp, probe.virtual_stages) if knobs["pp"] else None
    if why_not:
        ok = [v for v in (2, 4, 8) if probe.pp > 1 and probe.pp * v <= m.layers]
        raise PlanError(why_not.reason + (f"; pick virtual_stages from {ok}" if ok else "") + ", or virtual_stages=None")
    whole = replace(probe, dp=c.world // probe.gpus * probe.dp)   # the fixed degrees, dp filling the cluster
    if (probe.zero >= 2 and framework == "megatron") or (probe.recompute == "op" and framework != "torch"):
        raise PlanError(_reason(m, c, whole, seq, batch, framework))
    if probe.zero >= 2 and knobs["pp"] and probe.pp > 1 and framework == "deepspeed":
        raise PlanError(_reason(m, c, whole, seq, batch, framework))


def _reason(m: ModelSpec, c: ClusterSpec, pc: ParallelConfig, seq: int, batch: int, framework: str) -> str:
    """The reason `refusal` gives for a layout check_fixed already knows it refuses."""
    why_not = refusal(m, c, pc, seq, batch, framework)
    return why_not.reason if why_not else ""
