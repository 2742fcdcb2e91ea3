"""Cost of the ledger's wrapper around each torch.distributed collective (kit/rank/ledger.py).

    python bench/bench_ledger.py

Every collective a cell calls goes through the wrapper (a ledger entry for `%dist where` and the hang
doctor; with checks on and 2+ ranks also the pre-flight, not timed here). This prints, in one process
with a 1-rank gloo group: the wrapper's own cost around a no-op with all_reduce's signature, and a
1 KiB all_reduce through the wrapper against torch's own function, interleaved rounds, minimum of each.
On an H200 host the wrapper added 10-16 us to an NCCL all_reduce's 15-22 us (docs/gpu.md).
"""
from __future__ import annotations

import functools
import os
import tempfile
import timeit


OWN = "torch's all_reduce"


def main(calls: int = 20000, rounds: int = 7) -> None:
    import torch
    import torch.distributed as dist
    from kit.rank.ledger import Ledger
    with tempfile.TemporaryDirectory() as tmp:
        dist.init_process_group("gloo", store=dist.FileStore(os.path.join(tmp, "store"), 1), rank=0, world_size=1)
        own = dist.all_reduce

        @functools.wraps(own)
        def noop(tensor, op=None, group=None, async_op=False):  # all_reduce's signature, nothing sent
            return None
        ledger = Ledger(0)
        ledger.begin_request(1, check=False, cell="<cell-1>")
        send = lambda *a: None  # noqa: E731 (no kernel: checks are off)
        wrapped_noop, wrapped = ledger.wrap("all_reduce", noop, send), ledger.wrap("all_reduce", own, send)
        x = torch.ones(256)
        best = {k: float("inf") for k in ("no-op", "wrapped no-op", OWN, "wrapped all_reduce")}
        for _ in range(rounds):  # interleaved, so a slow moment of the machine hits every variant
            for key, fn, n in (("no-op", noop, calls), ("wrapped no-op", wrapped_noop, calls),
                               (OWN, own, calls // 10), ("wrapped all_reduce", wrapped, calls // 10)):
                best[key] = min(best[key], timeit.timeit(lambda: fn(x), number=n) / n * 1e6)
        dist.destroy_process_group()
    print(f"ledger wrapper around a no-op: {best['wrapped no-op'] - best['no-op']:.2f} us a call")
    print(f"1 KiB all_reduce, 1 gloo rank: torch's own {best[OWN]:.1f} us, "
          f"through the wrapper {best['wrapped all_reduce']:.1f} us "
          f"(ratio {best['wrapped all_reduce'] / best[OWN]:.2f})")


if __name__ == "__main__":
    main()
