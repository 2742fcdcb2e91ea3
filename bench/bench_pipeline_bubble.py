"""The pipeline bubble against its formula, without and with interleaving, and what the gap is made of.

    python bench/bench_pipeline_bubble.py [--width 1024] [--rows 256] [--layers 16] [--steps 3]
                                          [--micro 1,2,4,8,16] [--virtual 1,2] [--emulate-ms 80]
                                          [--json out.json]

Two gloo ranks, one thread each (2 ranks on 2 cores), on `pipeline_bubble`'s balanced workload:
every stage `layers / v` square Linear layers, every micro-batch `rows` rows, so each chunk op
costs the same compute whatever m and v are. The order is the pipeline strategy's own: 1F1B (v=1)
and Megatron-LM's interleaved 1F1B (v chunks per rank; m must be a multiple of p).

Prints first what one chunk op and one message cost on their own (`p2p_overhead`): the op alone
and with both ranks computing at once (if the second core is busy with other work, the two
differ), the isend call, and a recv of a message sent 20 ms earlier (gloo sends the bytes only
once the receiver posts its recv: a transfer per message that no schedule hides). Then, per m
and v: the formula (p-1)/(v m+p-1), `measured` (1 - busy / (p x span): every moment not
computing) and `waiting` (time in recv and at the ends: the schedule's bubble plus transfers),
the median of `steps` steps and each step, `descheduled` (the share of the ranks' time they were
runnable but not running, from the kernel's schedstat: other processes had the cores), the
"message tax" (an isend after and a recv before each
forward and each backward, at the probe's costs, over the run's forward + backward chunk op: in a
balanced 1F1B every hand-off is on the critical path, so this is the share of the step that
messages add and no schedule removes), the quietest step's (shortest span: descheduling only
adds time), and the load average and CPU pressure before and after. Then the same table with the
compute EMULATED (each stage sleeps `--emulate-ms` per micro-batch forward, twice that backward;
the same messages over gloo): a sleeping rank needs no CPU, so that table shows the schedule and
its messages without the other processes' share of the cores, and is labelled emulated. Timings are
one run on a shared machine: read the load beside them.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
from typing import Any

from kit.experiments.harness.local import run_each, run_local


def _load() -> str:
    one, five, _ = os.getloadavg()
    try:
        with open("/proc/pressure/cpu") as f:
            psi = f.readline().split()[1].split("=")[1]  # "some avg10": % of time something waited for a CPU
    except OSError:
        psi = "n/a"
    return f"load average {one:.2f} (5 min {five:.2f}) on {os.cpu_count()} cores, CPU pressure avg10 {psi}%"


def _table(out: list[str], ms: list[int], vs: list[int], a: Any, probe: dict, emulate_ms: float | None) -> list[dict]:
    """Run every (m, v) on one local group; append the lines; return the raw results."""
    items = [(m, v, a.steps, a.rows, a.width, a.layers, 1, emulate_ms) for v in vs for m in ms if v == 1 or m % 2 == 0]
    res = run_each("kit.experiments.parallel.pipeline_bubble:pipeline_bubble", 2, items, threads_per_rank=1)[0]
    got = {(r["micro_batches"], r["virtual"]): r for r in res}
    out.append("p=2 ranks; bubble % (median of steps): formula, measured = 1 - busy/(p span), waiting in recv; "
               "per chunk op fwd/bwd ms")
    for v in vs:
        for m in ms:
            r = got.get((m, v))
            if r is None:
                out.append(f"  m={m:2d} v={v}: not run (interleaved 1F1B needs m a multiple of p=2, as in Megatron-LM)")
                continue
            d = 100 * (r["measured"] - r["formula"])
            out.append(f"  m={m:2d} v={v}: formula {100 * r['formula']:5.1f}  measured {100 * r['measured']:5.1f} "
                       f"({d:+5.1f} points{'' if abs(d) <= 10 else ', over 10'})  waiting {100 * r['waiting']:5.1f}  "
                       f"quietest step {100 * r['quietest']:5.1f}  descheduled {100 * r['descheduled']:4.1f}  "
                       f"steps {', '.join(f'{100 * b:.0f}' for b in r['measured_per_step'])}  "
                       f"op {r['fwd_op_ms']:.1f}/{r['bwd_op_ms']:.1f} ms  message tax "
                       f"{100 * 2 * (probe['isend_call_ms'] + probe['recv_ready_ms']) / (r['fwd_op_ms'] + r['bwd_op_ms']):.1f}%")
    if 1 in vs:
        for v in (x for x in vs if x > 1):
            for m in ms:
                if (m, 1) in got and (m, v) in got:
                    one, inter = got[m, 1], got[m, v]
                    out.append(f"  m={m:2d}: v=1 / v={v} bubble: formula {one['formula'] / inter['formula']:.2f}x, "
                               f"measured {one['measured'] / inter['measured']:.2f}x, "
                               f"waiting {one['waiting'] / inter['waiting']:.2f}x")
    return res


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--width", type=int, default=1024)
    ap.add_argument("--rows", type=int, default=256)
    ap.add_argument("--layers", type=int, default=16, help="layers per rank (split into v chunks)")
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--micro", default="1,2,4,8,16")
    ap.add_argument("--virtual", default="1,2")
    ap.add_argument("--emulate-ms", type=float, default=80.0,
                    help="then the same table with compute emulated by sleeping this many ms per stage forward "
                         "(twice backward): no CPU contention, real messages; 0 to skip")
    ap.add_argument("--json", help="also write the lines and the raw results to this file")
    a = ap.parse_args()
    ms = [int(t) for t in a.micro.split(",")]
    vs = [int(t) for t in a.virtual.split(",")]
    out = [_load() + " (before)"]
    probe = run_local("kit.experiments.parallel.pipeline_bubble:p2p_overhead", 2, a.rows, a.width,
                      a.layers // max(vs), threads_per_rank=1)[0]
    out.append(f"one chunk op ({a.layers // max(vs)} layers {a.rows}x{a.width}, fwd+bwd): {probe['op_alone_ms']:.1f} ms "
               f"alone, {probe['op_both_ms']:.1f} ms with both ranks computing (ratio "
               f"{probe['op_both_ms'] / probe['op_alone_ms']:.2f}); a {probe['message_kib']:.0f} KiB message: isend call "
               f"{probe['isend_call_ms']:.2f} ms, recv of a message already sent {probe['recv_ready_ms']:.2f} ms")
    res = _table(out, ms, vs, a, probe, None)
    if a.emulate_ms:
        out.append(f"EMULATED compute: each stage sleeps {a.emulate_ms:g} ms per micro-batch forward "
                   f"({a.emulate_ms:g}/v per chunk op), twice backward; real gloo messages of the same size")
        res += _table(out, ms, vs, a, probe, a.emulate_ms)
    out.append(_load() + " (after)")
    print("\n".join(out))
    if a.json:
        with open(a.json, "w") as f:
            json.dump({"lines": out, "probe": probe, "results": res}, f, indent=1)


if __name__ == "__main__":
    sys.exit(main())
