"""Published training runs, read as the planner's inputs: model, cluster, the published layout, and the
throughput and memory that were measured, each in its source's own convention. Pure Python, no torch.

    from kit.experiments.theory.published import published_runs
    runs = published_runs()          # 48 runs: SC21 Tables 1-2, Korthikanti et al. 2022, torchtitan, MT-NLG
    runs[0].source, runs[0].knobs, runs[0].published, runs[0].assumptions

The data (`data/published_runs.json`, a source for every number) and its conventions
(docs/published-runs.md) are kept as collected; this module only reads them. Where a source leaves a
field out, the value used here is written into the run's `assumptions`, so a reader sees what was filled
in and why; a field the planner may choose (a micro-batch size the source does not print) is left free.
`bench/bench_plan_published.py` compares the planner with these runs.
"""
from __future__ import annotations

import json
import pathlib
from dataclasses import dataclass, replace
from typing import Any

from kit.experiments.theory.cluster import ClusterSpec, cluster_spec
from kit.experiments.theory.models import MODELS, ModelSpec

__all__ = ["PublishedRun", "published_runs", "source_flops_per_step", "DATA"]

DATA = pathlib.Path(__file__).resolve().parent / "data" / "published_runs.json"

# Llama 2 shapes are not in the data file: Touvron et al. 2023 (arXiv:2307.09288) Table 1 and Meta's
# config.json (13B: 40 layers, 5120 wide, 40 heads, MLP 13824; 70B: 80 layers, 8192, 64 heads, 8 KV heads,
# MLP 28672; vocabulary 32000).
_LLAMA2 = {"13": (40, 5120, 40, 40, 13824), "70": (80, 8192, 64, 8, 28672)}
# what each source's throughput figure is (docs/published-runs.md, section 1)
METRICS = {"tflops_eq3": "TFLOP/s per GPU, Narayanan eq.(3): hardware FLOPs (counts the recompute)",
           "mfu_eq7": "MFU, Korthikanti eq.(7) (model FLOPs, no recompute), peak 312",
           "mfu_6n": "MFU, torchtitan: (6N + 12 L h s) per token, peak 312",
           "tokens": "tokens/s per GPU (torchtitan WPS)"}


@dataclass(frozen=True)
class PublishedRun:
    id: str
    run: str
    source: str                  # paper or repository, and where in it
    model: ModelSpec
    cluster: ClusterSpec
    seq_len: int
    global_batch: int            # sequences per step
    knobs: dict[str, Any]        # the published layout as plan() knobs (absent: not published, the planner picks)
    precision: str               # a layout_memory.PLAN_PRECISIONS key
    framework: str               # "megatron", "deepspeed" or "torch": whose rules the run followed
    metric: str                  # a METRICS key: the source's throughput convention
    published: float | None      # the throughput in that convention
    memory_gib: float | None     # the measured peak per GPU (torchtitan: max reserved over GPUs)
    comparable: bool             # False where the planner cannot express the run's arithmetic (Float8)
    assumptions: tuple[str, ...]
    # knobs the source's software had no choice in (plan() knobs): the published layout is ranked among the
    # layouts that software could run, not among those of later features (see _software_limits)
    limits: tuple[tuple[str, Any], ...] = ()


def _gpt(r: dict[str, Any], notes: list[str]) -> ModelSpec:
    """Megatron's GPT as SC21 and Korthikanti et al. count it: MLP 4h, learned positions, tied embeddings,
    biases and dropout (Korthikanti's 34 + 5as/h counts the dropout masks)."""
    m = r["model"]
    vocab = m["vocab"] or 51200
    notes.append("GPT: MLP 4h, heads = KV heads, tied embeddings, learned positions, dropout (Megatron's GPT); "
                 "unfused attention (these runs predate FlashAttention, arXiv:2205.14135)")
    return ModelSpec(m["name"], m["layers"], m["hidden"], m["heads"], m["heads"], m["ffn"] or 4 * m["hidden"], vocab,
                     seq_len=m["seq_len"], gated_mlp=False, tied_embeddings=True, positions=m["seq_len"], bias=True,
                     dropout=True, flash_attention=False, source=r["source"]["ref"])


def _llama(r: dict[str, Any], seq: int, notes: list[str]) -> ModelSpec:
    name = r["model"]["name"]
    if "Llama 2" in name:
        layers, hidden, heads, kv, ffn = _LLAMA2["13" if "13B" in name else "70"]
        notes.append(f"{name}: shape from Touvron et al. 2023 Table 1 / Meta's config.json, vocabulary 32000")
        return ModelSpec(name, layers, hidden, heads, kv, ffn, 32000, seq_len=seq, source="arXiv:2307.09288")
    base = MODELS["llama3-70b" if "70B" in name else "llama3-8b"]
    notes.append(f"{name}: vocabulary 128256 (Meta's config.json; not in the source)")
    return replace(base, name=name, seq_len=seq)


def _cluster(r: dict[str, Any], notes: list[str]) -> ClusterSpec:
    hw = r["hardware"]
    per_node = hw["gpus_per_node"] or 8
    if not hw["gpus_per_node"]:
        notes.append("8 GPUs per node (not stated)")
    if "H100" in hw["gpu"]:
        c = cluster_spec(hw["gpu_count"] // per_node, per_node, "h100")
        # torchtitan's H100s: 96 GB HBM2e, 500 W, 400 Gb/s RDMA per GPU (= the h100 preset's NIC per GPU)
        notes.append("H100 (Grand Teton, 96 GB, 500 W): the SXM peak 989 TFLOP/s and HBM 2.4 TB/s, as torchtitan's "
                     "own MFU uses the SXM peak; a power-limited part may run slower")
        acc = replace(c.accelerator, name="H100 96GB (500 W)", memory_gib=96.0, hbm_gbps=2400.0)
        return replace(c, accelerator=acc)
    return cluster_spec(hw["gpu_count"] // per_node, per_node, "a100")


def _recompute(text: str, source: str, notes: list[str]) -> str | None:
    t = (text or "").lower()
    if "not stated" in t:
        # MT-NLG: the TFLOP/s it prints are reproduced by Narayanan's eq.(3), which counts the recompute's
        # forward (docs/published-runs.md), so the run recomputed
        notes.append("full recompute: not stated, but the printed TFLOP/s follow eq.(3), which counts it")
        return "full"
    if t.startswith("none"):
        return "none"
    if "selective" in t:
        # torchtitan's selective checkpointing: per op (its default, "op"), or every other layer ("layer"),
        # which recomputes about as much (a forward of half the layers); Megatron's: Korthikanti's
        if "torchtitan" in source or "fsdp" in source:
            notes.append("torchtitan's selective checkpointing as its per-op policy (recompute='op')")
            return "op"
        return "selective"
    return "full"


def _software_limits(rid: str, framework: str, notes: list[str]) -> tuple[tuple[str, Any], ...]:
    """What the run's software could not do, as fixed knobs. Context parallelism reached Megatron-LM in
    October 2023 (its --context-parallel-size; ring attention: Liu et al., arXiv:2310.01889, the same month),
    after SC21 (2021), MT-NLG (2021) and Korthikanti et al. (2022): cp = 1 for those. Megatron-LM's
    distributed optimizer (ZeRO-1) arrived in 2022 (docs/distrib_optimizer.md, added 2022-05-16), after
    SC21, whose Megatron-LM runs replicate the optimizer: zero = 0 there."""
    limits: list[tuple[str, Any]] = []
    if rid.startswith(("sc21", "korthikanti", "mtnlg")):
        limits.append(("cp", 1))
        notes.append("ranked among layouts without context parallelism (not in its software: Megatron-LM, 2023)")
    if rid.startswith("sc21") and framework == "megatron":
        limits.append(("zero", 0))
        notes.append("ranked among layouts without a sharded optimizer (Megatron-LM's distributed optimizer: 2022)")
    return tuple(limits)


def _read(r: dict[str, Any]) -> PublishedRun:
    notes: list[str] = []
    p, b, res = r["parallel"], r["batch"], r["results"]
    rid = r["id"]
    seq = r["model"]["seq_len"] or 8192
    if not r["model"]["seq_len"]:
        notes.append("sequence 8192 (torchtitan's llama3_8b.toml; not in the table)")
    model = _gpt(r, notes) if rid.startswith(("sc21", "korthikanti", "mtnlg")) else _llama(r, seq, notes)
    cluster = _cluster(r, notes)
    tp, pp = p["tp"], p["pp"]
    if tp is None and (p.get("model_parallel_size") or 1) > 1:
        # SC21 Table 2 prints only t x p: 96 for 174.6B (8 x 12), 280 for 529.6B (8 x 35, as in Table 1)
        tp, pp = 8, p["model_parallel_size"] // 8
        notes.append(f"tp={tp} pp={pp} from the printed model-parallel size {p['model_parallel_size']} (t=8 in a node)")
    zero_text = str(p["zero_or_fsdp"] or "").lower()
    zero = 3 if ("zero-3" in zero_text or "fsdp" in zero_text) else 1 if "stage 1" in zero_text else 0
    knobs: dict[str, Any] = {"tp": tp or 1, "pp": pp or 1, "dp": p["dp"], "cp": p["cp"] or 1, "zero": zero}
    if b["micro_batch"]:
        knobs["micro_batch"] = b["micro_batch"]
    if p["vpp"]:
        knobs["virtual_stages"] = p["vpp"]
    rc = _recompute(r["recompute"], zero_text, notes)
    if rc:
        knobs["recompute"] = rc
    batch = b["global_batch_seqs"] or p["dp"] * (b["micro_batch"] or 1)
    if not b["global_batch_seqs"]:
        notes.append(f"global batch {batch} sequences = dp x micro-batch (not stated)")
    framework = "deepspeed" if "deepspeed" in zero_text else "torch" if "fsdp" in zero_text else "megatron"
    precision = "bf16-fp32params" if framework == "torch" else "bf16-bf16grads" if framework == "deepspeed" else "bf16"
    if res["tflops_per_gpu"] is not None:
        metric, value = "tflops_eq3", float(res["tflops_per_gpu"])
    elif rid.startswith("korthikanti"):
        metric, value = "mfu_eq7", float(res["mfu"])
    elif res["mfu"] is not None:
        metric, value = "mfu_6n", float(res["mfu"])
    else:
        metric, value = "tokens", float(res["tokens_per_s_per_gpu"])
    src = r["source"]
    limits = _software_limits(rid, framework, notes)
    return PublishedRun(rid, r["run"], f"{src['ref']}, {src['location']}", model, cluster, seq, int(batch), knobs,
                        precision, framework, metric, value, res["memory_per_gpu_gib"],
                        "float8" not in str(r["precision"]).lower(), tuple(notes), limits)


def published_runs() -> list[PublishedRun]:
    """Every run in data/published_runs.json, in the file's order."""
    return [_read(r) for r in json.loads(DATA.read_text())["records"]]


def source_flops_per_step(run: PublishedRun) -> float:
    """FLOPs (or tokens, for a tokens/s metric) one step counts in the source's own convention, summed over
    the GPUs: the published figure x GPUs x peak (or x GPUs) x step time equals this."""
    m, s, B = run.model, run.seq_len, run.global_batch
    h, L, V = m.hidden, m.layers, m.vocab
    if run.metric == "tflops_eq3":      # Narayanan et al. 2021 eq.(3)
        return 96 * B * s * L * h * h * (1 + s / (6 * h) + V / (16 * L * h))
    if run.metric == "mfu_eq7":         # Korthikanti et al. 2022 eq.(7)
        return 72 * B * L * s * h * h * (1 + s / (6 * h) + V / (12 * h * L))
    if run.metric == "mfu_6n":          # torchtitan: 6N + 12 L h s per token, N every parameter
        return (6 * m.params() + 12 * L * m.heads * m.head_dim * s) * B * s
    return float(B * s)                 # tokens
