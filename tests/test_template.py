"""Ranks forked from the warm rank template (kit/engine/template.py, kit/rank/template.py): they behave
like fresh ranks, the template never initialised CUDA and ran one thread at every fork, everything dies
with the kernel however it dies, and unsafe templates or `--no-template` give fresh interpreters."""
from __future__ import annotations

import argparse
import json
import os
import signal
import socket
import subprocess
import sys

import pytest

from conftest import _alive, assert_pids_gone, quiet, requires_cuda
from test_faults_kernel import THREAD_KERNEL
from kit.config import LaunchConfig
from kit.engine import launcher, run_dirs
from kit.engine import template as templates
from kit.notebook.flags import config_from_flags
from kit.messages import FORK
from kit.protocol import TO_TEMPLATE, seal

WALL_CLOCK_S = 120


def _started(c) -> set[str]:
    """How the ranks were started, as Cluster.status() says: "forked", "fresh" or "attached"."""
    return {info["started"] for info in c.status()["ranks"].values()}


def _template_pids() -> set[int]:
    return {t.pid for t in templates.live_templates()}


def test_forked_ranks_keep_state_run_collectives_and_restart(make_cluster):
    c = make_cluster(world_size=2)
    for info in c.status()["ranks"].values():
        assert info["started"] == "forked"
        # measured by the template just before each fork
        assert info["template_saw"] == {"threads": 1, "cuda_initialized": False}
    facts = c.run("import os\nt = torch.ones(2) * (rank + 1)\ndist.all_reduce(t)\n"
                  "env = open('/proc/self/environ', 'rb').read().split(b'\\0')\n"
                  "(t.tolist(), os.getppid(), os.getsid(0) == os.getpid(), os.environ['RANK'], "
                  "f'KIT_SESSION={os.environ[\"KIT_SESSION\"]}'.encode() in env, torch.get_num_threads())").values
    session = os.path.basename(c.status()["run_dir"])
    for rank, (t, parent, leads_session, env_rank, marked, threads) in facts.items():
        assert t == [3.0, 3.0] and env_rank == str(rank) and leads_session and marked
        assert parent in _template_pids()
        assert threads == c.config.threads
    assert c.run("t.sum().item()").values == {0: 6.0, 1: 6.0}  # state between cells
    for pid in c.pids.values():  # ps shows what it is
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            assert f.read().split(b"\0")[1:3] == [b"-m", b"kit.rank.worker"]
    for pid in c.pids.values():  # what a later kernel's reaper checks: owner, start time, own group, session marker
        assert run_dirs._is_stale_worker(pid, run_dirs._start_time(pid), session)
    old = list(c.pids.values())
    c.restart()
    assert_pids_gone(old, within_s=3)
    assert c.run("'t' in dir()").values == {0: False, 1: False}
    assert _started(c) == {"forked"}


def test_the_template_is_one_quiet_thread_without_cuda(make_cluster):
    c = make_cluster(world_size=1)
    (template,) = [t for t in templates.live_templates() if not t.gone][:1]
    assert template.info["threads"] == 1 and template.info["cuda_initialized"] is False
    assert template.info["unsafe"] is None
    assert len(os.listdir(f"/proc/{template.pid}/task")) == 1  # still one thread after forking
    # The rank maps the library pages the template's imports touched, as a fresh rank's own import does, so
    # its RSS does not grow by them later inside a user's memory measurement.
    mapped = c.run("from kit.rank.fork_child import resident_file_pages\n"
                   "sum(n for _, n in resident_file_pages()) / 2**20").values[0]
    assert template.info["resident_file_mib"] > 20 and mapped >= 0.9 * template.info["resident_file_mib"]


def test_a_forked_rank_that_cannot_join_is_named_with_its_stderr_and_leaves_nothing():
    from kit.engine.cluster import Cluster
    from kit.errors import WorkerStartError

    with pytest.raises(WorkerStartError) as info:  # gloo cannot use an interface that does not exist
        Cluster(LaunchConfig(world_size=2, env=(("GLOO_SOCKET_IFNAME", "kit-no-such-if"),), start_timeout_s=30)).start()
    text = str(info.value)
    assert "failed to start" in text and "kit-no-such-if" in text and "Nothing was left running" in text
    assert not any(t.busy() for t in templates.live_templates())  # its ranks were reported gone


def test_a_rank_killed_with_the_template_is_reported_and_restart_recovers(make_cluster):
    c = make_cluster(world_size=2)
    (parent,) = set(c.run("import os; os.getppid()").values.values())
    os.kill(parent, signal.SIGKILL)  # the template: its ranks get their parent-death signal
    assert_pids_gone(list(c.pids.values()), within_s=5)
    r = c.run("1", on_output=quiet) if c.state == "ready" else None
    assert c.state == "broken" or (r is not None and not r.ok)
    c.restart()  # a new template
    assert c.run("rank").values == {0: 0, 1: 1}
    assert parent not in _template_pids()


def test_close_idle_frees_an_idle_template_and_keeps_one_with_live_ranks(make_cluster):
    """`%dist shutdown` hands the ranks' memory to something else (lessons 10 and 14 start torchrun after it):
    a template whose ranks are gone is closed (its process exits), one that still forks live ranks is not."""
    c = make_cluster(world_size=1)
    (parent,) = set(c.run("import os; os.getppid()").values.values())
    templates.close_idle(within_s=0.5)  # an earlier test's template, its ranks gone, may close here too
    assert _alive(parent) and parent in _template_pids()  # its rank lives: kept
    c.shutdown()
    assert templates.close_idle() >= 1
    assert_pids_gone([parent], within_s=5)
    assert parent not in _template_pids()
    c.restart()  # a cold start makes a new template
    assert c.run("rank").values == {0: 0}


# Each rank forks a child that leaves the rank's session (a plain fork: it carries the template's environment
# block, rewritten with the cluster's session marker), names it and its own parent (the template), then holds
# the GIL in C. test_faults_kernel's kernel prints the rank pids and the four named pids, then is SIGKILLed.
CELL = ("import os, ctypes, time\npid = os.fork()\nif pid == 0:\n    os.setsid()\n    time.sleep(600)\n    os._exit(0)\n"
        "print('CHILD', pid, flush=True)\nprint('CHILD', os.getppid(), flush=True)\nctypes.PyDLL(None).sleep(600)")


@pytest.mark.parametrize("started_from", ["main", "thread"])
def test_a_sigkilled_kernel_leaves_no_template_rank_or_child(started_from):
    kernel = subprocess.Popen([sys.executable, "-c", THREAD_KERNEL, CELL, started_from], stdout=subprocess.PIPE,
                              text=True)
    pids: list[int] = []
    try:
        pids = json.loads(kernel.stdout.readline())
        ranks, named = pids[:2], pids[2:]
        template = {p for p in named if named.count(p) == 2}  # both ranks named the same parent
        assert len(template) == 1 and not template & set(ranks) and all(_alive(p) for p in pids)
        os.kill(kernel.pid, signal.SIGKILL)
        kernel.wait(timeout=5)
        assert_pids_gone(pids, within_s=5)  # 2 ranks, their 2 children, the template
    finally:
        kernel.kill()
        for p in set(pids):
            try:
                os.kill(p, signal.SIGKILL)
            except ProcessLookupError:
                pass


def test_a_normal_kernel_exit_stops_the_template(tmp_path):
    code = ("import json\nfrom kit.engine.cluster import Cluster\nfrom kit.engine import template\n"
            "c = Cluster(world_size=1).start()\n"
            "print(json.dumps(list(c.pids.values()) + [t.pid for t in template.live_templates()]))\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    pids = json.loads(out.stdout.strip().splitlines()[-1])
    assert len(pids) == 2
    assert_pids_gone(pids, within_s=3)


def test_an_unsafe_template_falls_back_to_fresh_interpreters_and_says_why(make_cluster, tmp_path, capsys):
    # A library that starts a thread at import (here a sitecustomize) makes forking unsafe.
    (tmp_path / "sitecustomize.py").write_text("import threading, time\n"
                                               "threading.Thread(target=time.sleep, args=(600,), daemon=True).start()\n")
    path = os.pathsep.join([str(tmp_path), os.environ.get("PYTHONPATH", "")])
    c = make_cluster(world_size=2, env=(("PYTHONPATH", path),))
    err = capsys.readouterr().err
    assert "starting ranks as fresh interpreters" in err and "the rank template runs 2 threads" in err
    assert "--no-template" in err
    assert _started(c) == {"fresh"}
    t = c.run("t = torch.ones(1) * rank; dist.all_reduce(t); t.item()").values
    assert t == {0: 1.0, 1: 1.0}
    c.shutdown()
    make_cluster(world_size=1, env=(("PYTHONPATH", path),))
    assert "starting ranks as fresh" not in capsys.readouterr().err  # said once per kernel


def test_no_template_starts_fresh_interpreters_without_a_note(make_cluster, capsys):
    c = make_cluster(world_size=2, template=False)
    assert _started(c) == {"fresh"}
    assert c.run("rank").values == {0: 0, 1: 1}
    assert "fresh interpreters" not in capsys.readouterr().err


def test_the_no_template_flag_and_its_config_field():
    args = argparse.Namespace(gpus=None, cpus=2, strict=False, pg_timeout=None, threads=None, no_template=True)
    config = config_from_flags(args, None)
    assert config is not None and config.template is False
    args.no_template = False
    assert config_from_flags(args, None).template is True  # type: ignore[union-attr]
    with pytest.raises(Exception, match="template"):
        LaunchConfig(template="no")  # type: ignore[arg-type]


@requires_cuda
def test_forked_ranks_use_cuda_and_nccl(make_cluster):
    import torch

    n = min(2, torch.cuda.device_count())
    c = make_cluster(world_size=n, device="gpu", strict=True)
    ranks = c.status()["ranks"].values()
    assert all(info["started"] == "forked" and not info["template_saw"]["cuda_initialized"] for info in ranks)
    got = c.run("t = torch.ones(4, device=device) * (rank + 1)\ndist.all_reduce(t)\n"
                "(t.sum().item(), dist.get_backend(), torch.cuda.current_device())").values
    total = 4.0 * sum(range(1, n + 1))
    assert got == {r: (total, "nccl", r) for r in range(n)}


def test_the_template_forks_only_for_signed_requests_and_never_shows_its_key():
    t = templates.Template(launcher.inherited_env(LaunchConfig()))
    try:
        assert t.wait_ready(120) is None
        for path in (f"/proc/{t.pid}/cmdline", f"/proc/{t.pid}/environ"):
            with open(path, "rb") as f:
                assert t.key not in f.read()
        r, w = os.pipe()
        request = os.memfd_create("forged")
        try:  # a request signed with another key: the template exits at once, without forking
            os.write(request, seal(b"x" * 32, TO_TEMPLATE, 0, json.dumps({"op": FORK, "id": 1}).encode()))
            socket.send_fds(t.sock, [b"fork"], [r, w, r, w, request])
        finally:
            for fd in (r, w, request):
                os.close(fd)
        assert t.proc.wait(timeout=10) == 71
        assert not t._procs
    finally:
        t.close()
