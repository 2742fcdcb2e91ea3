"""Where does gradient compression start to pay? Sweep the virtual link's bandwidth.

Kernel side, no torch. Compression costs compute (casts, PowerSGD's matmuls) and saves bytes;
on a fast link the saved bytes take no time and compression only costs, on a slow link the
saved bytes dominate. The break-even bandwidth is where the two step times cross:

    measured:  median step time over repeats per (compression, bandwidth); the crossing is
               interpolated (in log bandwidth) between the fastest link where compression still
               wins and the next faster one
    predicted: saved wire bytes per step / extra compute per step   (compression
               pays when (1 - 1/ratio) T_comm > T_compress; Vogels et al. 2019, Sec. 5)
"""
from __future__ import annotations

import math
from statistics import median
from typing import Any, Iterable

from kit.experiments.theory.links import ring_factor
from kit.experiments.theory.sharding_theory import break_even_gbps

__all__ = ["break_even", "compression_break_even_sweep"]


def _key(rec: dict[str, Any]) -> tuple[str, float]:
    c = rec["config"]
    return c.get("compression", "none"), float(c["link_gbps"])


def break_even(records: Iterable[dict[str, Any]]) -> dict[str, Any]:
    """Per compression: step times against the uncompressed run at each link bandwidth, the
    measured crossover (None if the curves do not cross in the range) and the predicted one."""
    groups: dict[tuple[str, float], list[dict[str, Any]]] = {}
    for r in records:
        groups.setdefault(_key(r), []).append(r)
    by = {k: v[0] for k, v in groups.items()}
    step = {k: median(r["summary"]["step_ms"] for r in v) for k, v in groups.items()}
    gbps = sorted({g for _, g in by})
    out: dict[str, Any] = {}
    for comp in sorted({c for c, _ in by} - {"none"}):
        rows = []
        for g in gbps:
            a, b = by.get(("none", g)), by.get((comp, g))
            if a and b:
                rows.append({"link_gbps": g, "none_step_ms": step[("none", g)],
                             "compressed_step_ms": step[(comp, g)], "repeats": len(groups[(comp, g)])})
        crossing = None
        wins = [i for i, r in enumerate(rows) if r["none_step_ms"] > r["compressed_step_ms"]]
        if wins and wins[-1] < len(rows) - 1:  # wins up to some link, loses on the next faster one
            lo, hi = rows[wins[-1]], rows[wins[-1] + 1]
            d_lo = lo["none_step_ms"] - lo["compressed_step_ms"]  # > 0: compression wins
            d_hi = hi["none_step_ms"] - hi["compressed_step_ms"]
            f = d_lo / (d_lo - d_hi)
            x0, x1 = math.log(lo["link_gbps"]), math.log(hi["link_gbps"])
            crossing = math.exp(x0 + f * (x1 - x0))
        predicted = None
        if rows:
            fast = rows[-1]
            ref, rec = by[("none", fast["link_gbps"])], by[(comp, fast["link_gbps"])]
            n = int(ref["config"]["world_size"])
            saved = (ref["summary"]["bytes_per_step"] - rec["summary"]["bytes_per_step"]) \
                * ring_factor("all_reduce", n)
            # Extra compute: the step-time difference on the fastest link, where the bytes cost ~0.
            predicted = break_even_gbps(saved, fast["compressed_step_ms"] - fast["none_step_ms"])
            # (None when compression was not slower even there: no measurable compute cost)
        wins_everywhere = bool(rows) and all(r["compressed_step_ms"] < r["none_step_ms"] for r in rows)
        out[comp] = {"rows": rows, "break_even_gbps_measured": crossing,
                     "break_even_gbps_predicted": predicted, "wins_at_every_link": wins_everywhere,
                     "note": "measured: crossing of the step-time curves (log-interpolated); "
                             "predicted: saved wire bytes / extra step time on the fastest link"}
    return out


def compression_break_even_sweep(base: Any, link_gbps: Iterable[float] = (0.05, 0.2, 1.0, 5.0, 25.0),
                                 compressions: Iterable[str] = ("none", "fp16", "powersgd"),
                                 link_alpha_us: float = 20.0, repeats: int = 1, cluster: Any = None,
                                 results_path: str | None = None) -> dict[str, Any]:
    """Run base (a DDP ExperimentConfig) at every (compression, bandwidth), `repeats` rounds
    interleaved (noise falls on all alike); return records and `break_even(records)`."""
    from kit.experiments.api import run
    recs = []
    for _ in range(repeats):
        for g in link_gbps:
            for comp in compressions:
                cfg = base.replace(strategy="ddp", compression=comp, interconnect="custom",
                                   link_alpha_us=link_alpha_us, link_gbps=float(g))
                recs.append(run(cfg, cluster=cluster, results_path=results_path))
    return {"records": recs, "break_even": break_even(recs)}
