"""Mistakes in tensor-parallel, pipeline and expert-parallel code are named as fast as `dist.*`
ones. A rank that finished while another waits in DTensor's redistribution, in a P2POp request's wait or
in a functional collective is reported within seconds (torchrun fails in under 5 s: the finished rank
exits and its connections close), not after the process-group timeout."""
from __future__ import annotations

import time

import pytest

from conftest import quiet

WALL_CLOCK_S = 200
PG_TIMEOUT_S = 60.0  # a wait that lasts it fails the test's bound below

P2POP = """\
buf = torch.zeros(2)
if rank == 0:  # pipeline stage 0 waits for activations that stage 1 never sends
    reqs = dist.batch_isend_irecv([dist.P2POp(dist.irecv, buf, 1)])
    for req in reqs:
        req.wait()
"""
DTENSOR = """\
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor import distribute_tensor, Shard, Replicate
mesh = init_device_mesh("cpu", (world_size,))
d = distribute_tensor(torch.arange(4.0), mesh, [Shard(0)])
if rank == 0:  # only one rank gathers the sharded weight
    full = d.redistribute(mesh, [Replicate()]).to_local()
"""
FUNCOL = """\
import torch.distributed._functional_collectives as funcol
if rank == 0:
    t = funcol.all_reduce(torch.ones(2), "sum", dist.group.WORLD)
    t = funcol.wait_tensor(t)
"""


@pytest.mark.parametrize("code", [P2POP, DTENSOR, FUNCOL], ids=["p2pop", "dtensor", "functional"])
def test_a_rank_waiting_in_tp_pp_code_after_another_finished_is_named_in_seconds(cluster, code):
    said: list[str] = []
    t0 = time.monotonic()
    r = cluster.run(code, on_output=lambda rank, stream, text: said.append(text))
    elapsed_s = time.monotonic() - t0
    text = "\n".join(said)
    assert not r.ok and elapsed_s < 25, (elapsed_s, text[-2000:])
    assert "rank(s) 1 finished the cell" in text and "rank 0 waits" in text, text[-2000:]
    assert "60 s" in text  # the timeout it would otherwise have waited out
    later = cluster.run("t = torch.ones(1); dist.all_reduce(t); t.item()", on_output=quiet)
    assert later.ok and later.values == {0: 2.0, 1: 2.0}, later.failures


def test_a_silent_rank_after_others_finished_gets_a_deadlock_hint_on_the_first_interrupt():
    """The first interrupt's report, from the ranks' `where` answers: rank 0 does not answer (C code holds
    the GIL, as in a GIL deadlock inside torch) while rank 1 finished the cell. It already says it may be
    a deadlock and what ends it. (Built from the answers: a real rank holding the GIL in C answered
    between two bytecodes often enough under load to make a live test of this flaky.)"""
    from kit.engine.stuck import stuck_report

    silent = {0: {"text": "no answer within 1 s (C code may be holding the GIL)"}}
    text = "\n".join(stuck_report(silent, 60.0, interrupted=True, finished=[1]))
    assert "rank(s) 0 do not answer while rank(s) 1 finished the cell" in text, text
    assert "deadlock" in text and "%dist restart" in text, text
    alone = "\n".join(stuck_report(silent, 60.0, interrupted=True, finished=[]))
    assert "deadlock" not in alone, alone  # nobody finished: a long C call, not a claim of deadlock


def test_a_function_the_kernel_called_still_finishing_after_the_interrupt_is_not_said_to_catch_it():
    """Interrupting kit.experiments.run (a 'call' request): a rank whose clean-up outlasts the 0.5 s grace was
    said to run "a cell [that] catches the interrupt ... Only `%dist restart` ends such a cell" (2 of about 20
    interrupts of a DDP run at load 5-7), and the run ended a second later by itself."""
    from kit.engine.stuck import stuck_report

    def answer(text: str) -> dict:
        return {"text": text, "sigint": "kit", "sigints": 1}
    call = answer("running a 'call' request (no Python line of the cell is on the stack: C code, or the kit "
                  "before/after it)")
    text = "\n".join(stuck_report({0: call, 1: call}, 60.0, interrupted=True))
    assert "catches the interrupt" not in text and "%dist restart" not in text, text
    assert "rank(s) 0, 1 received the interrupt and still run the function the kernel called" in text, text
    cell = answer("running <cell In [4]> line 3: x += 1")
    assert "rank(s) 1 run Python but did not stop: the cell catches the interrupt" in "\n".join(
        stuck_report({0: call, 1: cell}, 60.0, interrupted=True))  # a cell's own line: as before


def test_ranks_blocked_in_collectives_that_cannot_match_are_named_on_interrupt():
    """With --no-check (no pre-flight) rank 0 in all_reduce and rank 1 in broadcast both block; the interrupt's
    report said each rank's place and that gloo waits out the timeout, never that the two cannot match."""
    from kit.engine.stuck import stuck_report

    def at(sig: str, line: int, seq: int = 1, for_s: float = 3.1) -> dict[str, str]:
        return {"text": f"blocked inside {sig} at line {line} (collective #{seq} of In [5]), for {for_s:.1f} s"}

    apart = {0: at("all_reduce(float32[4])", 2), 1: at("broadcast(float32[4], src=0)", 4)}
    text = "\n".join(stuck_report(apart, 60.0, interrupted=True))
    assert ("the ranks wait in collectives that can never match: rank 0 in all_reduce(float32[4]) (collective #1); "
            "rank 1 in broadcast(float32[4], src=0) (collective #1)") in text, text
    assert "60 s" in text and "--no-check" in text, text
    ahead = {0: at("all_reduce(float32[4])", 3, seq=2), 1: at("all_reduce(float32[4])", 3, seq=1)}
    assert "can never match" in "\n".join(stuck_report(ahead, 60.0, interrupted=True))  # one rank skipped one
    same = {0: at("all_reduce(float32[4])", 2), 1: at("all_reduce(float32[4])", 2)}
    assert "can never match" not in "\n".join(stuck_report(same, 60.0, interrupted=True))  # a slow peer, say
    passing = {0: at("all_reduce(float32[4])", 3, seq=6, for_s=0.0), 1: at("all_reduce(float32[4])", 3, seq=5,
                                                                             for_s=0.0)}
    assert "can never match" not in "\n".join(stuck_report(passing, 60.0, interrupted=True))  # a healthy loop


APART = "t = torch.ones(4)\nkept = rank + 100\nif rank == 0:\n    dist.all_reduce(t)\nelse:\n    dist.broadcast(t, src=0)"


def test_ranks_blocked_in_collectives_that_cannot_match_are_named_in_seconds_without_an_interrupt(make_cluster):
    """--no-check: before, nothing was said until the process-group timeout ended the cell (the new-user
    trial's 60 s); now, once both ranks sit idle in gloo, the kit names the two collectives, then waits
    out the timeout as before (gloo cannot be interrupted) and the group is re-created."""
    pg_timeout_s = 20.0  # said at about 4 s; 15 s leaves two more looks (5 s apart) for a loaded machine
    cluster = make_cluster(pg_timeout_s=pg_timeout_s)
    said: list[tuple[float, str]] = []
    t0 = time.monotonic()
    r = cluster.run(APART, check=False,
                    on_output=lambda rank, stream, text: said.append((time.monotonic() - t0, text)) if rank < 0 else None)
    elapsed_s = time.monotonic() - t0
    apart = [(t, text) for t, text in said if "can never match" in text]
    assert apart, said
    assert apart[0][1].startswith("the ranks wait in collectives that can never match: rank 0 in all_reduce(float32[4]) "
                                  "(collective #1); rank 1 in broadcast(float32[4], src=0) (collective #1)"), apart
    assert apart[0][0] < pg_timeout_s - 5 < elapsed_s, (apart[0][0], elapsed_s)  # said while both still wait
    assert any("interrupt three times, then `%dist restart`" in text for _, text in said), said
    assert set(r.failures) == {0, 1} and cluster.state == "ready"
    later = cluster.run("t = torch.ones(1); dist.all_reduce(t); (t.item(), kept)", on_output=quiet)
    assert later.values == {0: (2.0, 100), 1: (2.0, 101)}, later.failures


class _Idle:
    """Stands in for Running in WaitChecks: CPU seconds per rank as the test sets them, `where` counted."""

    def __init__(self, backend: str = "gloo") -> None:
        from types import SimpleNamespace

        self.config = SimpleNamespace(pg_timeout_s=60.0, world_size=2)
        self.cpu, self.asked, self.backend = {0: 1.0, 1: 1.0}, 0, backend

    def cpu_s(self, ranks):
        return {r: self.cpu[r] for r in ranks}

    def where_reports(self, ranks, timeout_s):
        self.asked += 1
        return {r: {"text": "running <cell In [3]> line 2: time.sleep(600)"} for r in ranks}


def test_the_ranks_are_asked_where_they_wait_only_when_all_sit_idle_and_seldom():
    """What the check costs a cell that runs long: nothing asked of a rank that computes; for ranks that
    sleep, one `where` per IDLE_ASK_AGAIN_S."""
    from kit.engine.output import CellResult
    from kit.engine.watch_checks import IDLE_ASK_AGAIN_S, IDLE_WINDOW_S, WaitChecks

    running, notes = _Idle(), []
    checks = WaitChecks(running, CellResult(1, (0, 1)), notes.append, 0.0, None)  # type: ignore[arg-type]
    now = 0.0
    for _ in range(20):  # rank 1 computes: a core's worth of CPU between looks
        now += IDLE_WINDOW_S
        running.cpu[1] += IDLE_WINDOW_S
        checks.check(now, [0, 1], set(), 0.0)
    assert running.asked == 0
    for _ in range(20):  # both sleep, 40 s: asked at most once per IDLE_ASK_AGAIN_S, and nothing to say
        now += IDLE_WINDOW_S
        checks.check(now, [0, 1], set(), 0.0)
    assert 1 <= running.asked <= 20 * IDLE_WINDOW_S / IDLE_ASK_AGAIN_S + 1 and not notes


def test_nccl_ranks_are_never_asked_where_they_wait_while_they_sit_idle():
    """The note after the `where` describes gloo (the timeout raised, the group re-created, variables kept);
    an NCCL rank that times out is torn down by NCCL's watchdog, so NCCL ranks get no such note."""
    from kit.engine.output import CellResult
    from kit.engine.watch_checks import IDLE_WINDOW_S, WaitChecks

    running, notes = _Idle(backend="nccl"), []
    checks = WaitChecks(running, CellResult(1, (0, 1)), notes.append, 0.0, None)  # type: ignore[arg-type]
    for k in range(1, 20):
        checks.check(k * IDLE_WINDOW_S, [0, 1], set(), 0.0)
    assert running.asked == 0 and not notes


def test_every_subgroup_and_mesh_dimension_gets_the_kits_pg_timeout(cluster):
    """torch gives a group made without a timeout its module default (30 min for gloo), not the default
    group's: the kit sets that default to --pg-timeout, as `%dist export` writes it for torchrun."""
    code = ("from torch.distributed.device_mesh import init_device_mesh\n"
            "mesh = init_device_mesh('cpu', (2, 1), mesh_dim_names=('dp', 'tp'))\n"
            "groups = [dist.new_group(), dist.new_group([0]), mesh.get_group('dp'), mesh.get_group('tp')]\n"
            "[g._get_backend(torch.device('cpu')).options._timeout.total_seconds() for g in groups "
            "if g != dist.GroupMember.NON_GROUP_MEMBER]")
    r = cluster.run(code, on_output=quiet)
    assert r.ok, r.failures
    assert r.values == {0: [PG_TIMEOUT_S] * 4, 1: [PG_TIMEOUT_S] * 3}, r.values


A2A = """\
inp = torch.arange(4.0) + 10 * rank
in_splits = [1, 3] if rank == 0 else [2, 2]   # rank 0 sends 3 rows to rank 1
out_splits = [1, 2] if rank == 0 else [{expect}, 2]   # rank 1 says how many it takes from rank 0
out = torch.empty(sum(out_splits))
dist.all_to_all_single(out, inp, out_splits, in_splits)
out.tolist()
"""


def test_all_to_all_splits_are_checked_across_ranks_before_anything_is_sent(cluster):
    """An expert-parallel dispatch whose receivers expect other counts than the senders send: the pre-flight
    has every rank's splits and names the pair, before any uninitialised memory can come back silently."""
    good = cluster.run(A2A.format(expect=3), on_output=quiet)
    assert good.ok and good.values == {0: [0.0, 10.0, 11.0], 1: [1.0, 2.0, 3.0, 12.0, 13.0]}, good.failures
    bad = cluster.run(A2A.format(expect=2), on_output=quiet)
    assert not bad.ok
    text = str(bad.failures[0].evalue) + str(bad.failures[1].evalue)
    assert "rank 0 sends 3 element(s) to rank 1, but rank 1 expects 2 from rank 0" in text, text
    assert cluster.run("t = torch.ones(1); dist.all_reduce(t); t.item()", on_output=quiet).values == {0: 2.0, 1: 2.0}


class _Chain:
    """Stands in for Running: three gloo ranks, every busy one blocked in a send/recv; closings recorded."""

    def __init__(self) -> None:
        from types import SimpleNamespace

        self.config, self.backend = SimpleNamespace(pg_timeout_s=60.0, world_size=3), "gloo"
        self.closed: list[list[int]] = []

    def where_reports(self, ranks, timeout_s):
        return {r: {"text": f"blocked inside {'recv' if r == 0 else 'send'}(float32[4]) at line 3"} for r in ranks}

    def release_group(self, ranks):
        self.closed.append(list(ranks))
        return {}


def test_a_rank_waiting_on_a_rank_the_release_freed_is_released_too():
    """Lesson 08's parameter server, interrupted: rank 1 stopped, rank 0 waited on rank 1 and rank 2 on rank 0.
    Closing rank 1's connections freed rank 0 only, and rank 2 waited out the 60 s timeout after the kit had
    said the wait ends now. Now rank 0, once freed and ended, has its connections closed too."""
    from kit.engine.output import CellResult
    from kit.engine.watch_checks import STOPPED_GRACE_S, WaitChecks
    from kit.errors import RankFailure

    running, notes, result = _Chain(), [], CellResult(1, (0, 1, 2))
    checks = WaitChecks(running, result, notes.append, 0.0, None)  # type: ignore[arg-type]
    checks.interrupted()
    t = checks.interrupted_s + STOPPED_GRACE_S + 0.5
    result.failures[1] = RankFailure(1, "KeyboardInterrupt", "")
    checks.check(t, [0, 2], {1}, t)
    assert running.closed == [[1]] and "rank(s) 1 stopped at the interrupt" in notes[-1], notes
    result.failures[0] = RankFailure(0, "RuntimeError", "Connection closed by peer")  # freed: its cell ended
    checks.check(t + 1.5, [2], {0, 1}, t + 1.5)
    assert running.closed == [[1], [0]], running.closed
    assert notes[-1].startswith("rank(s) 0 ended once freed; rank 2 is blocked inside send"), notes[-1]
    failure = RankFailure(2, "RuntimeError", "Connection closed by peer")
    checks.explain(2, failure)
    assert "rank(s) 0, 1, stopped by the interrupt" in failure.evalue, failure.evalue
