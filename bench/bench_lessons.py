"""Every lesson, Run All in a real kernel: wall time and peak memory against Binder's limits.

    python bench/bench_lessons.py [NAME ...]

Peak memory is the largest sum of VmRSS over the kernel and its ranks, sampled every 0.2 s
(RSS counts shared pages once per process, so this over-estimates; Binder's limit is 2 GB).
Targets: at most 90 s and 2 GB per lesson on a 2-core CPU machine.
"""
from __future__ import annotations

import pathlib
import sys
import threading
import time

LESSONS = pathlib.Path(__file__).resolve().parent.parent / "lessons"


def main(names: list[str]) -> int:
    import nbclient
    import nbformat
    import psutil

    paths = [LESSONS / f"{n}.ipynb" for n in names] or sorted(LESSONS.glob("[0-9][0-9]_*.ipynb"))
    failed = 0
    for path in paths:
        peak, stop = [0], threading.Event()

        def sample() -> None:
            while not stop.is_set():
                total = 0
                for p in psutil.Process().children(recursive=True):
                    try:
                        total += p.memory_info().rss
                    except psutil.Error:
                        pass
                peak[0] = max(peak[0], total)
                time.sleep(0.2)

        sampler = threading.Thread(target=sample, daemon=True)
        sampler.start()
        t0 = time.perf_counter()
        nb = nbformat.read(path, as_version=4)
        nbclient.NotebookClient(nb, timeout=300, kernel_name="python3",
                                resources={"metadata": {"path": str(LESSONS)}}).execute()
        elapsed_s = time.perf_counter() - t0
        stop.set()
        sampler.join()
        ok = elapsed_s <= 90 and peak[0] <= 2 * 10**9
        failed += not ok
        print(f"{path.stem:<42} {elapsed_s:6.1f} s (target <= 90)  peak {peak[0] / 2**30:5.2f} GiB "
              f"(target <= 2 GB)  {'PASS' if ok else 'FAIL'}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
