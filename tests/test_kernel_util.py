"""The kernel tests' own harness: a cell that never ends fails its test with what it printed and the
stacks of the kernel and its ranks, taken while it still hangs, so one hang in CI explains itself."""
from __future__ import annotations

import shutil

import pytest

from kernel_util import Kernel, kernel_available

pytestmark = pytest.mark.skipif(kernel_available() is not None, reason=str(kernel_available()))


@pytest.mark.skipif(shutil.which("py-spy") is None, reason="needs py-spy (the test extras)")
def test_a_cell_that_never_ends_fails_with_its_output_and_the_stacks_under_the_kernel():
    with Kernel() as k:
        pid = k.pid
        cell = k.submit("import time\nprint('started the wait')\ndef wait_here():\n    time.sleep(600)\nwait_here()")
        with pytest.raises(TimeoutError) as got:
            k.wait(cell, timeout_s=8)
        report = str(got.value)
        k.interrupt()
        assert k.wait(cell, timeout_s=30).status == "error"
    assert "started the wait" in report, report
    assert f"--- pid {pid} ---" in report and "wait_here" in report, report
