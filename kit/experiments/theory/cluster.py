"""A cluster for planning: nodes of GPUs, one fast link inside a node, network egress between nodes.

Pure Python (no torch). The accelerator and link numbers are the kit's presets
(kit/experiments/theory/accelerators.py, links.py; sources in docs/hardware.md); this module only says
how they are put together. Two levels, as How to Scale Your Model (jax-ml/scaling-book, gpus.md)
models a GPU cluster:
- inside a node every GPU reaches every other over NVLink (per-direction GB/s per GPU);
- across nodes a node sends through its NICs: egress = nics_per_node x NIC rate, shared by its
  GPUs. A DGX H100 has 8 ConnectX-7 400 Gb/s NICs (one per GPU): 8 x 50 GB/s = 400 GB/s per node,
  and a non-blocking fat tree keeps that rate between any two nodes (NVIDIA DGX SuperPOD H100
  reference architecture; scaling-book gpus.md uses the same 400 GB/s).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from kit.experiments.theory.accelerators import ACCELERATORS, Accelerator
from kit.experiments.theory.links import LINKS, LinkPreset
from kit.errors import ConfigError
from kit import _renamed

__all__ = ["ClusterSpec", "cluster_spec", "NODE_PRESETS", "MAX_NODES", "MAX_GPUS_PER_NODE", "MAX_RANKS",
           "refuse_too_many_ranks", "refuse_too_large_cluster"]
__getattr__ = _renamed.renamed_getattr(__name__)  # this release's old names, for one release

# NVLink 3 (A100 SXM): 12 links x 25 GB/s = 300 GB/s per direction (NVIDIA A100 datasheet, "600 GB/s"
# bidirectional); NCCL's NVLink hop and base latencies as for the kit's `nvlink` preset. Efficiency 0.6 with
# no message-size roll-off: Calculon's a100_80g.json (Isaev et al., SC23), calibrated on Korthikanti et
# al.'s A100 step times, where the H100 preset's c_half made tensor parallelism's all-reduces 2-3x too slow.
_NVLINK3 = LinkPreset(hop_us=LINKS["nvlink"].hop_us, gbps=300.0, base_us=LINKS["nvlink"].base_us,
                      efficiency=0.6, source="NVIDIA A100 datasheet; NCCL tuning.cc; calculon a100_80g.json")
# InfiniBand HDR 200 Gb/s = 25 GB/s per NIC (IBTA line rate), 8 per DGX A100 node.
_HDR = LinkPreset(hop_us=LINKS["infiniband"].hop_us, gbps=25.0, base_us=LINKS["infiniband"].base_us,
                  efficiency=LINKS["infiniband"].efficiency, source="IBTA HDR line rate; NCCL tuning.cc")

# accelerator -> (intra-node link, per-NIC link, NICs per node, source)
NODE_PRESETS: dict[str, tuple[LinkPreset, LinkPreset, int, str]] = {
    "h100": (LINKS["nvlink"], LINKS["infiniband"], 8, "NVIDIA DGX H100 user guide: 8x ConnectX-7 400 Gb/s"),
    "a100": (_NVLINK3, _HDR, 8, "NVIDIA DGX A100 user guide: 8x ConnectX-6 200 Gb/s"),
}


PRESET_GPUS_PER_NODE = 8  # the GPUs of the nodes NODE_PRESETS describe (DGX H100, DGX A100)

# The largest cluster the kit's tools plan, draw or predict: plan()'s and a ClusterSpec's GPUs, the plan panel's
# boxes and predict()'s rank counts. 4,096 nodes x 16 GPUs = 65,536 GPUs, four times the largest published
# training run (Llama 3 405B on 16K H100s, "The Llama 3 Herd of Models" section 3.3); the largest in
# published_runs() has 3,360.
MAX_NODES, MAX_GPUS_PER_NODE = 4096, 16
MAX_RANKS = MAX_NODES * MAX_GPUS_PER_NODE


def refuse_too_many_ranks(ranks: list[Any], name: str = "ranks") -> None:
    """A rank count no cluster has (ranks=[3_000_000]) would be predicted as if it meant something."""
    big = [r for r in ranks if isinstance(r, (int, float)) and not isinstance(r, bool) and r > MAX_RANKS]
    if big:
        raise ValueError(f"{name}={ranks}: {big[0]:,} ranks is more than any cluster the kit predicts: rank counts "
                         f"go from 1 to {MAX_RANKS:,} ({MAX_NODES:,} nodes x {MAX_GPUS_PER_NODE} GPUs, the plan "
                         "panel's range; the largest published run used 16,384 GPUs). Ask for counts up to "
                         f"{MAX_RANKS:,}, e.g. {name}=[1, 8, 64, 1024, 16384]")


def refuse_too_large_cluster(nodes: int, gpus_per_node: int, error: type[Exception] = ConfigError) -> None:
    """A cluster of more than MAX_RANKS GPUs (plan(m, nodes=10**9)), refused in one line with the bound and
    what to give instead (`error`: plan() raises its PlanError, a ConfigError too)."""
    gpus = nodes * gpus_per_node
    if gpus > MAX_RANKS:
        instead = (f"give fewer nodes (at most {MAX_RANKS // gpus_per_node:,} of {gpus_per_node} GPUs)"
                   if gpus_per_node <= MAX_RANKS else
                   f"give fewer GPUs per node ({PRESET_GPUS_PER_NODE} on the presets' nodes)")
        raise error(f"nodes={nodes} x gpus_per_node={gpus_per_node} = {gpus:,} GPUs is more than the {MAX_RANKS:,} the "
                    f"kit plans and predicts ({MAX_NODES:,} nodes x {MAX_GPUS_PER_NODE} GPUs, the plan panel's range; "
                    f"the largest published run used 16,384 GPUs): {instead}")


@dataclass(frozen=True)
class ClusterSpec:
    nodes: int
    gpus_per_node: int
    accelerator: Accelerator
    intra: LinkPreset           # GPU-to-GPU inside a node, per GPU per direction
    nic: LinkPreset             # one network interface
    nics_per_node: int
    source: str = ""

    def __post_init__(self) -> None:
        if self.nodes < 1 or self.gpus_per_node < 1 or self.nics_per_node < 1:
            raise ValueError(f"nodes={self.nodes}, gpus_per_node={self.gpus_per_node} and nics_per_node="
                             f"{self.nics_per_node} must each be at least 1")
        refuse_too_large_cluster(self.nodes, self.gpus_per_node)

    @property
    def world(self) -> int:
        return self.nodes * self.gpus_per_node

    @property
    def egress_gbps_per_gpu(self) -> float:
        """Each GPU's share of its node's network egress (GB/s, per direction, before efficiency)."""
        return self.nics_per_node * self.nic.gbps / self.gpus_per_node

    def describe(self) -> str:
        return (f"{self.nodes} x {self.gpus_per_node} {self.accelerator.name} ({self.world} GPU"
                f"{'' if self.world == 1 else 's'}); "
                f"{self.intra.gbps:.0f} GB/s per GPU inside a node, {self.nics_per_node} x {self.nic.gbps:.0f} GB/s "
                f"= {self.nics_per_node * self.nic.gbps:.0f} GB/s egress per node")


def cluster_spec(nodes: int = 1, gpus_per_node: int = 8, accelerator: str = "h100",
                 nics_per_node: int | None = None) -> ClusterSpec:
    """A cluster from an accelerator preset name. The presets' nodes have one NIC per GPU (8 and 8); a node
    of another GPU count keeps that ratio (6 GPUs: 6 NICs; the text said "8 x 50 GB/s" for 6), and
    `nics_per_node` overrides it."""
    key = accelerator.lower()
    if key not in NODE_PRESETS or key not in ACCELERATORS:
        known = sorted(set(NODE_PRESETS) & set(ACCELERATORS))
        raise ValueError(f"no cluster preset for accelerator {accelerator!r}: known {', '.join(known)}. For "
                         "another GPU, plan on a ClusterSpec with its figures: dataclasses.replace(cluster_spec(nodes, "
                         "8, 'h100'), accelerator=Accelerator(name, peak_tflops, hbm_gbps, memory_gib)) from "
                         "kit.experiments.theory.cluster and .accelerators, then plan(model, cluster=that)")
    intra, nic, nics, src = NODE_PRESETS[key]
    same_ratio = max(1, round(gpus_per_node * nics / PRESET_GPUS_PER_NODE))
    return ClusterSpec(nodes, gpus_per_node, ACCELERATORS[key], intra, nic, nics_per_node or same_ratio, src)
