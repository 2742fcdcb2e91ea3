"""Link presets for the virtual interconnect: latency, peak bandwidth and message-size efficiency.

Pure Python (no torch): config.py builds `INTERCONNECTS` from this table. Every number's source
is in docs/hardware.md; the short tag after each preset names it.

The cost of one ring all-reduce of n bytes on p ranks (Thakur, Rabenseifner & Gropp 2005;
NCCL's tuning model has the same shape):

    t(n) = base + 2(p-1) * hop  +  2(p-1)/p * n / bw(n)
    bw(n) = peak * efficiency * c / (c + c_half),   c = n / p   (the chunk one ring step moves)

Why a size-dependent bandwidth: a link reaches its peak only for large transfers (protocol
switches, pipelining of chunks, per-chunk synchronisation), so a 13 MiB bucket on NVLink runs
at about a third of the 450 GB/s datasheet figure. `c_half` is the chunk size at which half of
`peak * efficiency` is reached, fitted to a published measurement where one exists; where none
is cited it is 0 (the only size effect is then the latency term, Hockney's n_1/2 = alpha * bw).
"""
from __future__ import annotations

from dataclasses import dataclass

from kit import _renamed

__all__ = ["LinkPreset", "LINKS", "RING_STEPS", "ring_steps", "ring_factor", "alpha_beta_allreduce_s", "effective_gbps",
           "link_allreduce_s", "link_collective_s"]
__getattr__ = _renamed.renamed_getattr(__name__)  # this release's old names, for one release

# a ring collective's steps, in units of p-1: an all-reduce is a reduce-scatter then an all-gather. The one table
# of the ring: its steps (ring_steps), the bytes a rank sends (ring_factor) and its time (_ring_s) read it.
RING_STEPS = {"all_reduce": 2, "reduce_scatter": 1, "all_gather": 1}
# ZeroRedundancyOptimizer's parameter sync: every rank broadcasts its shard S/p once, so averaged over the
# ranks each sends what an all-gather's rank sends (sharding_theory.wire_prediction)
_SENDS_AS = {"broadcast": "all_gather"}


def ring_steps(op: str, world_size: int) -> int:
    """Steps of a ring collective (`op` in RING_STEPS) on p ranks: RING_STEPS[op] x (p-1); each pays the hop
    latency and moves S/p bytes (Thakur, Rabenseifner & Gropp 2005)."""
    return RING_STEPS[op] * (world_size - 1)


def ring_factor(op: str, world_size: int) -> float:
    """Bytes each rank sends per byte of payload S for a ring/bandwidth-optimal collective: its steps x S/p,
    so all_reduce 2(p-1)/p, reduce_scatter and all_gather (p-1)/p (and broadcast, as ZeRO-1's sync: an all-gather's)."""
    return ring_steps(_SENDS_AS.get(op, op), world_size) / world_size


@dataclass(frozen=True)
class LinkPreset:
    hop_us: float            # latency per ring step (NCCL tuning.cc per-hop constant, Simple protocol)
    gbps: float              # peak per-direction bandwidth, GB/s (1e9 B/s), datasheet / line rate
    base_us: float = 0.0     # fixed latency per collective (NCCL tuning.cc baseLat, Simple)
    efficiency: float = 1.0  # measured large-message busbw / peak
    chunk_half_bytes: float = 0.0  # per-step chunk reaching half of peak*efficiency
    source: str = ""


# Numbers and derivations: docs/hardware.md (one section per preset).
LINKS: dict[str, LinkPreset] = {
    # H100 SXM NVLink4: 18 links x 25 GB/s = 450 GB/s per direction (NVIDIA H100 datasheet);
    # 8xH100 all-reduce busbw ~370 GB/s at ~10 GB and ~150 GB/s at 58 MB (scaling-book gpus.md):
    # efficiency 370/450, c_half fitted to the 58 MB point (docs/hardware.md shows the fit).
    "nvlink": LinkPreset(hop_us=3.4, gbps=450.0, base_us=8.4, efficiency=370 / 450,
                         chunk_half_bytes=9.2e6, source="NVIDIA H100 datasheet; NCCL tuning.cc; scaling-book"),
    # PCIe 4.0 x16: 16 GT/s x 16 lanes x 128b/130b = 31.5 GB/s per direction (PCI-SIG 4.0 spec).
    "pcie": LinkPreset(hop_us=5.7, gbps=31.5, base_us=8.4, source="PCI-SIG PCIe 4.0; NCCL tuning.cc"),
    # InfiniBand NDR 400 Gb/s = 50 GB/s; calculon's IB preset uses 0.9 efficiency.
    "infiniband": LinkPreset(hop_us=14.0, gbps=50.0, base_us=8.4, efficiency=0.9,
                             source="IBTA NDR line rate; NCCL tuning.cc; calculon a100_80g.json"),
    # Ethernet line rates; NCCL's network hop is a lower bound for TCP sockets.
    "100gbe": LinkPreset(hop_us=14.0, gbps=12.5, base_us=8.4, source="IEEE 802.3 100GBASE; NCCL tuning.cc"),
    "10gbe": LinkPreset(hop_us=14.0, gbps=1.25, base_us=8.4, source="IEEE 802.3 10GBASE; NCCL tuning.cc"),
}


def effective_gbps(nbytes: float, world_size: int, gbps: float, efficiency: float = 1.0,
                   chunk_half_bytes: float = 0.0) -> float:
    """Bandwidth (GB/s) a ring step achieves for an n-byte all-reduce: peak x efficiency x c/(c+c_half)."""
    chunk = nbytes / max(world_size, 1)
    size_eff = chunk / (chunk + chunk_half_bytes) if chunk_half_bytes > 0 else 1.0
    return gbps * efficiency * size_eff


def alpha_beta_allreduce_s(nbytes: float, world_size: int, alpha_us: float, gbps: float, base_us: float = 0.0,
                           efficiency: float = 1.0, chunk_half_bytes: float = 0.0) -> float:
    """Seconds for one ring all-reduce in the alpha-beta model, from its constants:
    base + 2(p-1) alpha + 2(p-1)/p n / bw(n).

    The ring's reduce-scatter and all-gather each take p-1 steps, and every step pays the hop
    latency: 2(p-1) alpha, not alpha once. `link_allreduce_s` is this with a preset's constants.
    """
    return _ring_s("all_reduce", nbytes, world_size, alpha_us, gbps, base_us, efficiency, chunk_half_bytes)


def link_collective_s(op: str, link: str | LinkPreset, nbytes: float, world_size: int,
                      gbps: float | None = None) -> float:
    """Seconds for one ring collective (`op` in RING_STEPS) of an n-byte array on a link preset (a name in
    LINKS, or a LinkPreset). `gbps` replaces the preset's peak (the planner: a GPU's share of its node's NICs)."""
    pre = LINKS[link] if isinstance(link, str) else link
    return _ring_s(op, nbytes, world_size, pre.hop_us, gbps or pre.gbps, pre.base_us, pre.efficiency,
                   pre.chunk_half_bytes)


def link_allreduce_s(link: str | LinkPreset, nbytes: float, world_size: int, gbps: float | None = None) -> float:
    """Seconds for one ring all-reduce on a link preset: what the emulated link adds per bucket, so a
    lesson's prediction and the emulation use one formula (`link_collective_s` for the others)."""
    return link_collective_s("all_reduce", link, nbytes, world_size, gbps)


def _ring_s(op: str, nbytes: float, world_size: int, alpha_us: float, gbps: float, base_us: float,
            efficiency: float, chunk_half_bytes: float) -> float:
    """The ring formula, once: `ring_steps` steps, each paying the hop latency and moving n/p bytes."""
    p = world_size
    steps = ring_steps(op, p)
    if steps == 0:
        return 0.0
    bw = effective_gbps(nbytes, p, gbps, efficiency, chunk_half_bytes) * 1e9
    return (base_us + steps * alpha_us) * 1e-6 + nbytes * steps / p / bw
