"""Cost of recording DTensor's collectives in the ledger (kit/rank/ledger_dtensor.py) on a tensor-parallel step.

    python bench/bench_dtensor_ledger.py [--pairs 8] [--steps 30]

Two gloo ranks on this CPU run a TP training step in the pytorch/examples tensor_parallel_example style
(an MLP, ColwiseParallel then RowwiseParallel on a 1-D mesh, forward, backward, AdamW) with the wrappers
installed ("on") and with torch's own functions put back ("off"), in interleaved blocks (the order
alternates each pair) so both see the same machine noise. Prints the median step time of each and their
ratio, for a toy model (the example's sizes: DTensor's dispatch dominates, the worst case for a
per-call cost) and a larger one, and the machine's load.
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time

import torch.multiprocessing as mp

SIZES = {"toy (10-32-5, batch 20)": (10, 32, 5, 20), "wider (512-2048-512, batch 64)": (512, 2048, 512, 64)}


def _toggle(on: bool) -> None:
    """Put the kit's wrappers (on) or torch's own functions (off) in the patched modules."""
    import torch.distributed._functional_collectives as funcol
    import torch.distributed.tensor._collective_utils as utils

    from kit.rank.ledger_dtensor import DTENSOR_C10D, FUNCTIONAL

    for module, names in ((funcol, FUNCTIONAL + ("wait_tensor",)), (utils, DTENSOR_C10D)):
        for name in names:
            fn = getattr(module, name)
            wrapper = getattr(fn, "_kit_wrapper", fn)
            plain = getattr(wrapper, "__wrapped__", wrapper)
            plain._kit_wrapper = wrapper  # type: ignore[attr-defined]
            setattr(module, name, wrapper if on else plain)


def _rank(rank: int, store_path: str, pairs: int, steps: int, out: dict) -> None:
    os.environ["OMP_NUM_THREADS"] = "1"
    import torch
    import torch.distributed as dist

    torch.set_num_threads(1)
    from kit.rank.ledger import Ledger, observers
    from kit.rank.ledger_dtensor import install_dtensor

    ledger = Ledger(rank)
    install_dtensor(ledger)  # before DTensor's import, as in a rank
    dist.init_process_group("gloo", store=dist.FileStore(store_path, 2), rank=rank, world_size=2)
    from torch import nn
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module

    mesh = init_device_mesh("cpu", (2,), mesh_dim_names=("tp",))
    result = {}
    # one functional all_reduce and its wait on a group of this rank alone (no wire: the call's own cost)
    import torch.distributed._functional_collectives as funcol

    alone = [dist.new_group([r]) for r in range(2)][rank]
    t = torch.ones(16)

    def calls(on: bool, n: int = 400) -> float:
        _toggle(on)
        t0 = time.perf_counter()
        for _ in range(n):
            funcol.all_reduce(t, "sum", alone).wait()
        return (time.perf_counter() - t0) / n * 1e6

    calls(True), calls(False)
    us: dict[bool, list[float]] = {True: [], False: []}
    for i in range(pairs * 2):
        for on in ((True, False) if i % 2 else (False, True)):
            us[on].append(calls(on))
    result["call"] = us
    for label, (d_in, hidden, d_out, batch) in SIZES.items():
        torch.manual_seed(0)
        model = parallelize_module(nn.Sequential(nn.Linear(d_in, hidden), nn.ReLU(), nn.Linear(hidden, d_out)),
                                   mesh, {"0": ColwiseParallel(), "2": RowwiseParallel()})
        opt = torch.optim.AdamW(model.parameters(), lr=1e-3, foreach=True)
        inp = torch.rand(batch, d_in)

        def block(on: bool) -> float:
            _toggle(on)
            dist.barrier()
            t0 = time.perf_counter()
            for _ in range(steps):
                model(inp).sum().backward()
                opt.step()
                opt.zero_grad()
            return (time.perf_counter() - t0) / steps * 1e3

        block(True), block(False)  # warm-up: DTensor's sharding propagation caches
        seen: list[str] = []
        observers.append(lambda entry: seen.append(entry.op))  # the ledger's observers get every ended entry
        block(True)
        observers.clear()
        result[label + " per step"] = len(seen) / steps
        ms: dict[bool, list[float]] = {True: [], False: []}
        for i in range(pairs):
            for on in ((True, False) if i % 2 else (False, True)):
                ms[on].append(block(on))
        result[label] = ms
        entries = [e for e in ledger.entries if e.op == "all_reduce"]
        result[label + " recorded"] = entries[-1].sig if entries else "nothing recorded"
    if rank == 0:
        out.update(result)
    dist.destroy_process_group()


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--pairs", type=int, default=8)
    parser.add_argument("--steps", type=int, default=30)
    args = parser.parse_args()
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    load_before = os.getloadavg()
    with tempfile.TemporaryDirectory() as tmp, mp.Manager() as manager:
        out = manager.dict()
        mp.spawn(_rank, args=(os.path.join(tmp, "store"), args.pairs, args.steps, out), nprocs=2)
        result = dict(out)
    print(f"load average before {' '.join(f'{x:.2f}' for x in load_before)}, after "
          f"{' '.join(f'{x:.2f}' for x in os.getloadavg())} ({os.cpu_count()} CPUs); {args.pairs} interleaved "
          f"pairs of {args.steps} steps, rank 0's step time")
    us = result["call"]
    on_us, off_us = statistics.median(us[True]), statistics.median(us[False])
    print(f"one funcol.all_reduce + wait on a one-rank group: {off_us:.1f} us plain, {on_us:.1f} us recorded: "
          f"+{on_us - off_us:.1f} us a collective (medians of {len(us[True])} interleaved blocks of 400 calls)")
    for label in SIZES:
        ms = result[label]
        off, on = statistics.median(ms[False]), statistics.median(ms[True])
        print(f"{label}: step ms off {off:7.3f}  on {on:7.3f}  ratio on/off = {on / off:.3f}   "
              f"off {[round(x, 2) for x in ms[False]]}  on {[round(x, 2) for x in ms[True]]}")
        per_step = result[label + " per step"]
        share = f", so about {(on_us - off_us) * per_step / 1e3 / off * 100:.2f} % of the step (computed from the " \
                f"per-call cost)" if per_step else ""
        print(f"  the ledger's last entry: {result[label + ' recorded']}; {per_step} recorded collectives a step{share}")


if __name__ == "__main__":
    main()
