"""The rank template when it fails under the kit: killed under its ranks, lost while a start
forks from it, its channel lost while a cluster still uses its ranks, a large environment to fork with."""
from __future__ import annotations

import os
import signal
import socket

import pytest

from conftest import _alive, assert_pids_gone, quiet, wait_until
from kit.engine import template as templates
from kit.engine.template import ForkedProc, Template

WALL_CLOCK_S = 180


def _parent_of(c) -> int:
    (parent,) = set(c.run("import os; os.getppid()", on_output=quiet).values.values())
    return parent


def test_a_template_killed_under_the_ranks_is_named_as_the_root_cause(make_cluster):
    """Each rank's failure names the killed template as the root cause, not "killed by SIGKILL ... Most often
    the machine ran out of memory"."""
    c = make_cluster(world_size=2)
    parent = _parent_of(c)
    killed: list[int] = []

    def kill_the_template_once_the_cell_runs(rank: int, stream: str, text: str) -> None:
        if "running" in text and not killed:
            killed.append(parent)
            os.kill(parent, signal.SIGKILL)  # as `kill -9 <template pid>` from a terminal

    r = c.run("import time\nprint('running', flush=True)\ntime.sleep(120)", on_output=kill_the_template_once_the_cell_runs)
    assert killed and not r.ok and set(r.failures) == {0, 1}
    for f in r.failures.values():
        assert f.evalue.startswith(f"the rank template (pid {parent}) the ranks were forked from was killed by SIGKILL"), f.evalue
        assert "out of memory" not in f.evalue.lower() and "%dist restart" in f.evalue
    assert c.state == "broken" and "rank template" in (c.broken_reason or "")
    c.restart()  # a new template
    assert c.run("rank", on_output=quiet).values == {0: 0, 1: 1}


def _kill_template_after(n_forks: int, monkeypatch: pytest.MonkeyPatch, rank_dead: bool = False) -> list[int]:
    """Template.fork that SIGKILLs the template (and waits until it is dead) after its n-th fork;
    `rank_dead`: also until the rank it just forked died with it, before the kernel sends that rank its key."""
    real, killed, forks = Template.fork, [], []

    def fork(self: Template, *args, **kwargs):
        got = real(self, *args, **kwargs)
        if isinstance(got, ForkedProc):
            forks.append(got)
            if len(forks) == n_forks:
                os.kill(self.pid, signal.SIGKILL)
                self.proc.wait()
                killed.append(self.pid)
                if rank_dead:
                    wait_until(lambda: not _alive(got.pid), what="the forked rank to die with its template")
        return got

    monkeypatch.setattr(Template, "fork", fork)
    return killed


@pytest.mark.parametrize("world_size,n_forks,rank_dead", [(8, 4, False), (4, 4, False), (4, 4, True)],
                         ids=["while-forking", "while-joining", "before-the-key"])
def test_a_start_that_loses_the_template_falls_back_to_fresh_interpreters(make_cluster, monkeypatch, capsys,
                                                                          world_size, n_forks, rank_dead):
    """A template killed during a start (while forking, while its ranks join, or with a rank dead before the
    kernel wrote its key) kills the ranks forked from it: the start says so and starts every rank again as a
    fresh interpreter, and the cluster runs a collective. A start never fails with "rank 0 failed to start:
    the process was killed by SIGKILL" or a bare BrokenPipeError."""
    make_cluster(world_size=1).shutdown()  # a warm template, so the start forks from it
    killed = _kill_template_after(n_forks, monkeypatch, rank_dead)
    c = make_cluster(world_size=world_size, start_timeout_s=120)
    assert killed
    assert all(info["started"] == "fresh" for info in c.status()["ranks"].values())
    err = capsys.readouterr().err
    assert "starting ranks as fresh interpreters" in err and f"the rank template (pid {killed[0]})" in err
    assert "killed by SIGKILL" in err
    got = c.run("t = torch.ones(1)\ndist.all_reduce(t)\nt.item()", on_output=quiet).values
    assert got == {r: float(world_size) for r in range(world_size)}


def test_a_gone_template_never_touches_the_ranks_a_live_cluster_uses(make_cluster):
    """A template whose channel is gone is not closed while ranks it forked run (its watchdog would SIGKILL
    every process carrying its marker, those ranks among them): the next start takes a new template, the live
    cluster keeps running, and the gone template is closed like any idle one once its ranks have ended."""
    c = make_cluster(world_size=2)
    parent = _parent_of(c)
    (template,) = [t for t in templates.live_templates() if t.pid == parent]
    template.sock.shutdown(socket.SHUT_RD)  # the kernel's end of the channel fails; the template process lives
    wait_until(lambda: template.gone, what="the kernel to see the channel end")
    d = make_cluster(world_size=1)  # same environment: it needs a template, and this one is gone
    assert _parent_of(d) != parent
    assert c.run("rank", on_output=quiet).values == {0: 0, 1: 1}  # the live cluster's ranks were not touched
    assert _alive(parent)
    pids = list(c.pids.values())
    c.shutdown()  # its ranks stop although the template cannot report their exits
    assert_pids_gone(pids)
    templates.close_idle()  # now that its ranks are gone it is closed like any idle template
    assert_pids_gone([parent])


def test_a_large_environment_is_forked_from_the_template(make_cluster, capsys):
    """An environment larger than one packet (about 208 KB) still forks from the template, never "cannot be
    reached (Message too long)" and fresh interpreters. 3 x 120 KB: each under Linux's 128 KiB limit on one
    exec string."""
    env = tuple((f"BIG_TEST_VAR_{i}", str(i) * 120_000) for i in range(3))
    c = make_cluster(world_size=2, env=env)
    assert all(info["started"] == "forked" for info in c.status()["ranks"].values())
    assert "fresh interpreters" not in capsys.readouterr().err
    got = c.run("import os\nsum(len(os.environ[f'BIG_TEST_VAR_{i}']) for i in range(3))", on_output=quiet).values
    assert got == {0: 360_000, 1: 360_000}
