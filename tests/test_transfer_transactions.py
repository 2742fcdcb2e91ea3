"""`%dist pull` and `%dist push` are transactions in the kernel too.

A pull changes the kernel's variable only when the whole value arrived and unpickled, at every
moment an interrupt can land (the delays are swept); a push over the message limit is refused in
one line, before any copy is made; no kit frame keeps the user's value alive after an error or an
interrupt (IPython keeps the last traceback)."""
from __future__ import annotations

import os
import re
import time
from typing import Iterator

import pytest

from kernel_util import Kernel, kernel_available

pytestmark = pytest.mark.skipif(kernel_available() is not None, reason=str(kernel_available()))
WALL_CLOCK_S = 300


@pytest.fixture(scope="module")
def kernel() -> Iterator[Kernel]:
    with Kernel(env=dict(os.environ, KIT_MAX_FRAME_MIB="256")) as k:
        assert k.run("%load_ext kit").status == "ok"
        assert k.run("%%distributed --cpus 2\nimport numpy as np\nbig = np.arange(7 * 2**20, dtype=np.float64)\n"
                     "b2, b3, b4 = big + 1, big + 2, big + 3", timeout_s=180).status == "ok"
        yield k  # 4 values of 56 MiB: each under the 64 MiB a pulled value may have


def _kernel_value(kernel: Kernel, expr: str) -> str:
    r = kernel.run(f"print(repr({expr}))")
    assert r.status == "ok", r.text
    return r.stdout.strip()


def test_an_interrupted_pull_changes_the_variable_wholly_or_not_at_all(kernel):
    kernel.run("big = 'before'")
    t0 = time.monotonic()
    assert "pulled big" in kernel.run("%dist pull big b2 b3 b4 --ranks 1").text
    full_s = time.monotonic() - t0
    assert _kernel_value(kernel, "(type(big).__name__, big.shape, float(big[-1]))") == \
        f"('ndarray', ({7 * 2**20},), {7 * 2**20 - 1}.0)"
    outcomes = set()
    for frac in (0.05, 0.15, 0.25, 0.35, 0.45, 0.55, 0.65, 0.75, 0.9):  # the rank pickling, sending; the kernel unpickling
        kernel.run("big = 'before'")
        pulling = kernel.submit("%dist pull big b2 b3 b4 --ranks 1")
        time.sleep(full_s * frac)
        kernel.interrupt()
        r = kernel.wait(pulling, interrupted_at_a_timed_moment=True)
        now = _kernel_value(kernel, "big if isinstance(big, str) else (type(big).__name__, big.shape)")
        if "pulled big" in r.text:
            # "no reply": the interrupt came after the pull, during ipykernel's wrap-up (kernel_util.Kernel.wait)
            assert r.status in ("ok", "no reply") and now == f"('ndarray', ({7 * 2**20},))", (frac, r.text, now)
            outcomes.add("pulled")
        else:
            assert now == "'before'", (frac, full_s, r.text[-2000:], now)  # never a repr string, never half
            assert "interrupted" in r.text and "big, b2, b3, b4 in the kernel are unchanged" in r.text, r.text[-2000:]
            assert "Traceback" not in r.text and "kit/" not in r.text, r.text[-2000:]
            outcomes.add("unchanged")
    assert "unchanged" in outcomes, (outcomes, full_s)  # the sweep did land inside the pull
    later = kernel.run("%%distributed\nt = torch.ones(1); dist.all_reduce(t); t.item()", timeout_s=60)
    assert later.status == "ok" and "Out: 2.0" in later.text, later.text[-2000:]


def test_a_pulled_value_that_cannot_travel_leaves_the_variable_alone(kernel):
    kernel.run("%%distributed\nimport threading\nlock = threading.Lock()")
    kernel.run("lock = 'before'")
    r = kernel.run("%dist pull lock --ranks 0")
    assert r.status == "error" and "lock in the kernel is unchanged" in r.text and "pickle" in r.text, r.text
    assert "Traceback" not in r.text, r.text
    assert "<unlocked _thread.lock object" in r.text, r.text  # the note says "showing its repr": it shows it
    assert _kernel_value(kernel, "lock") == "'before'"


def test_a_push_says_which_ranks_have_the_values(kernel):
    kernel.run("lr = 0.5")
    assert "pushed lr to every rank" in kernel.run("%dist push lr").text
    assert "pushed lr to rank 1\n" in kernel.run("%dist push lr --ranks 1").text
    assert "pushed lr to ranks 0, 1\n" in kernel.run("%dist push lr --ranks 0,1").text


def _hwm_mib(pid: int) -> float:
    """The kernel's peak resident memory so far, and resets it (Linux: write 5 to clear_refs)."""
    with open(f"/proc/{pid}/status") as f:
        peak = next(int(x.split()[1]) for x in f if x.startswith("VmHWM")) / 1024
    with open(f"/proc/{pid}/clear_refs", "w") as f:
        f.write("5")
    return peak


def test_a_push_over_the_limit_is_one_line_before_any_copy_and_keeps_nothing(kernel):
    kernel.run("import numpy as np, weakref, gc\nhuge = np.ones(300 * 2**20 // 8)\nalive = weakref.ref(huge)\n"
               "gc.collect()")
    _hwm_mib(kernel.pid)
    base = _hwm_mib(kernel.pid)
    r = kernel.run("%dist push huge")
    grew_mib = _hwm_mib(kernel.pid) - base
    assert r.status == "error" and "Traceback" not in r.text, r.text[-3000:]
    lines = [line for line in r.text.strip().splitlines() if line.strip()]
    assert len(lines) == 1 and "300 MiB" in lines[0] and "256 MiB limit" in lines[0], lines
    assert "KIT_MAX_FRAME_MIB" in lines[0] and "no rank has huge" in lines[0], lines
    assert grew_mib < 50, f"the refused push peaked {grew_mib:.0f} MiB over the 300 MiB array"
    kernel.run("del huge\ngc.collect()")
    assert _kernel_value(kernel, "alive() is None") == "True"  # no kit frame in IPython's last traceback holds it


def test_an_interrupted_push_keeps_no_kit_frame_holding_the_value(kernel):
    kernel.run("import numpy as np, weakref, gc\nmid = np.ones(100 * 2**20 // 8)\nalive = weakref.ref(mid)")
    t0 = time.monotonic()
    assert "pushed mid" in kernel.run("%dist push mid").text
    full_s = time.monotonic() - t0
    for frac in (0.1, 0.4, 0.7):
        pushing = kernel.submit("%dist push mid")
        time.sleep(full_s * frac)
        kernel.interrupt()
        r = kernel.wait(pushing, interrupted_at_a_timed_moment=True)
        assert "pushed mid" in r.text or re.search(r"no rank has mid|have mid", r.text), r.text[-2000:]
        assert "Traceback" not in r.text, r.text[-2000:]
    kernel.run("del mid\ngc.collect()")
    assert _kernel_value(kernel, "alive() is None") == "True"
