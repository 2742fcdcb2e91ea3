"""Every rank draws its own random numbers, as a fresh interpreter under torchrun does.

A fork copies the template's generators; a fresh interpreter seeds torch's CPU generator and Python's
`random` from the OS at start-up (CUDA's generators are created after the fork, when a rank first uses
CUDA). Forked ranks, `--no-template` ranks and torchrun ranks must agree: the draws differ between ranks
and between one start and the next (`%dist restart`)."""
from __future__ import annotations

import pytest

from conftest import assert_pids_gone, quiet, requires_cuda
from kit.config import LaunchConfig
from kit.engine.cluster import Cluster

WALL_CLOCK_S = 240

DRAWS = """\
import random
from torch.utils.data import DataLoader
(torch.initial_seed(), torch.rand(3).tolist(),
 [int(i) for batch in DataLoader(list(range(16)), batch_size=16, shuffle=True) for i in batch],
 torch.nn.functional.dropout(torch.ones(16), 0.5).tolist(), torch.nn.Dropout(0.5)(torch.ones(16)).tolist(),
 random.random())
"""


def _draws(c: Cluster) -> list[tuple]:
    r = c.run(DRAWS, on_output=quiet)
    assert r.ok, r
    return [tuple(map(repr, r.values[rank])) for rank in sorted(r.values)]


def _all_differ(runs: list[list[tuple]]) -> None:
    """Each kind of draw (seed, rand, loader order, dropout masks, random) differs on every rank of every start."""
    draws = [d for run in runs for d in run]
    for kind in range(len(draws[0])):
        seen = [d[kind] for d in draws]
        assert len(set(seen)) == len(seen), f"draw {kind} repeats across ranks or starts: {seen}"


@pytest.mark.parametrize("how", ["forked", "no-template", "torchrun"])
def test_every_rank_and_every_start_draws_its_own_numbers(how, tmp_path):
    kw: dict = {"world_size": 3 if how != "torchrun" else 2, "pg_timeout_s": 5.0, "start_timeout_s": 90}
    if how == "no-template":
        kw["template"] = False
    if how == "torchrun":
        kw.update(launcher="torchrun", key_file=str(tmp_path / "kit.key"))
    c = Cluster(LaunchConfig(**kw)).start()
    pids = list(c.pids.values())
    try:
        if how != "torchrun":
            want = "forked" if how == "forked" else "fresh"
            assert all(info["started"] == want for info in c.status()["ranks"].values())
        first = _draws(c)
        c.restart()
        pids += list(c.pids.values())
        _all_differ([first, _draws(c)])
    finally:
        pids += (c.status()["attach"] or {}).get("agents", [])  # torchrun's, when it started the ranks
        c.shutdown()
    assert_pids_gone(pids, within_s=10)


@requires_cuda
def test_cuda_draws_of_forked_ranks_behave_as_fresh_ones():
    """CUDA's generators are created after the fork, in the rank: forked and fresh ranks agree on whether
    one start's `torch.rand(device='cuda')` repeats the last one's (torch seeds them from the OS: they differ)."""
    import torch

    n = min(2, torch.cuda.device_count())
    cell = "(torch.cuda.initial_seed(), torch.rand(3, device=device).tolist())"
    seen = {}
    for template in (True, False):
        c = Cluster(LaunchConfig(world_size=n, device="gpu", strict=True, template=template, pg_timeout_s=5.0)).start()
        pids = list(c.pids.values())
        try:
            first = c.run(cell, on_output=quiet).values
            c.restart()
            pids += list(c.pids.values())
            second = c.run(cell, on_output=quiet).values
        finally:
            c.shutdown()
        assert_pids_gone(pids, within_s=10)
        draws = [repr(v) for run in (first, second) for v in run.values()]
        seen[template] = len(set(draws)) == len(draws)
    assert seen == {True: True, False: True}


def test_a_stopped_template_does_not_hang_the_start(make_cluster, capsys, monkeypatch):
    """A template stopped with SIGSTOP (a debugger, a job-control mistake) answers no fork request: the
    start goes on with fresh interpreters after FORK_TIMEOUT_S, saying why (before: it hung past
    start_timeout_s with no message)."""
    import os
    import signal

    from kit.engine import template as templates
    from kit.engine import template_process

    make_cluster(world_size=1)
    # A stopped template never answers, so any fork timeout takes the same path: 2 s instead of the 10 s
    # a starved template gets (the test waited it out whole).
    monkeypatch.setattr(template_process, "FORK_TIMEOUT_S", 2.0)
    stopped = [t.pid for t in templates.live_templates() if not t.gone]
    for pid in stopped:
        os.kill(pid, signal.SIGSTOP)
    try:
        c = make_cluster(world_size=1, start_timeout_s=60)
        assert all(info["started"] == "fresh" for info in c.status()["ranks"].values())
        assert c.run("1 + 1", on_output=quiet).values == {0: 2}
    finally:
        for pid in stopped:
            os.kill(pid, signal.SIGCONT)
    assert "did not answer a fork request" in capsys.readouterr().err
