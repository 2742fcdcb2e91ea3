"""Ordinary actions that never cost rank state (rank side): a push the ranks cannot
rebuild, exceptions and values that misbehave, a cell that closes fd 1 or forks, huge messages,
pulls of values that cannot travel; and places where the kit must not change what torch does
(isend identity, `from __future__ import annotations`, store errors, init_process_group checks,
cell labels)."""
from __future__ import annotations

import sys
import threading
import time

import pytest

from conftest import quiet
from kit.errors import CellError

WALL_CLOCK_S = 60  # conftest's autouse wall_clock fixture enforces it
PG_TIMEOUT_S = 5.0


def _alive_and_well(cluster) -> None:
    r = cluster.run("x_alive = rank + 1\nx_alive", on_output=quiet)
    assert r.ok and r.values == {0: 1, 1: 2}, r.failures
    assert cluster.state == "ready"


class NotOnTheRanks:  # this test module is not importable on the ranks
    pass


# -- 1. push ---------------------------------------------------------------------------------
def _kernel_defined(monkeypatch):
    """A function and a class instance as a notebook defines them: in the kernel's __main__."""
    def scale(x):
        return 2 * x

    class Config:
        lr = 0.5

    for obj, name in ((scale, "scale"), (Config, "Config")):
        obj.__module__, obj.__qualname__ = "__main__", name
        monkeypatch.setattr(sys.modules["__main__"], name, obj, raising=False)
    return scale, Config()


def test_push_of_a_kernel_defined_function_without_cloudpickle_is_refused_by_name(cluster, monkeypatch):
    scale, cfg = _kernel_defined(monkeypatch)
    monkeypatch.setitem(sys.modules, "cloudpickle", None)  # `import cloudpickle` raises ImportError
    with pytest.raises(TypeError, match=r"cannot push 'scale'.*scale.*%%distributed cell.*module the ranks can import"):
        cluster.push({"lr": 0.5, "scale": scale})
    with pytest.raises(TypeError, match=r"cannot push 'cfg'.*Config"):
        cluster.push({"cfg": cfg})
    _alive_and_well(cluster)
    assert cluster.run("'lr' in dir()", on_output=quiet).values == {0: False, 1: False}  # nothing was pushed


def test_push_of_kernel_defined_function_and_instance_arrives_by_value_with_cloudpickle(cluster, monkeypatch):
    pytest.importorskip("cloudpickle")
    scale, cfg = _kernel_defined(monkeypatch)
    cluster.push({"scale": scale, "cfg": cfg})
    r = cluster.run("scale(3), cfg.lr", on_output=quiet)
    assert r.values == {0: (6, 0.5), 1: (6, 0.5)}, r.failures
    _alive_and_well(cluster)


def test_a_frame_body_the_rank_cannot_unpickle_is_that_requests_error(cluster):
    # A call's arguments travel pickled in the frame itself (a push's values are checked first): the rank's
    # control thread meets an object it cannot rebuild, and that call fails, not the rank.
    with pytest.raises(CellError) as raised:
        cluster.call("builtins:repr", NotOnTheRanks(), on_output=quiet)
    failures = raised.value.failures
    assert set(failures) == {0, 1}
    f = failures[0]
    assert f.ename == "DecodeError" and "could not be unpickled" in f.evalue and "test_faults_rank_state" in f.evalue
    _alive_and_well(cluster)


def test_push_of_a_class_instance_the_ranks_cannot_import_names_it(cluster):
    # pickled by reference to this test module, which the ranks cannot import
    with pytest.raises(Exception, match=r"'cfg' could not be rebuilt on rank \d.*%%distributed cell"):
        cluster.push({"cfg": NotOnTheRanks()})
    _alive_and_well(cluster)


# -- 2, 8. exceptions ------------------------------------------------------------------------
def test_exception_whose_str_raises_on_one_rank(cluster):
    code = ("class Weird(RuntimeError):\n    def __str__(self):\n        raise ValueError('no str for you')\n"
            "if rank == 1:\n    raise Weird('gloo')\n'ok'")
    r = cluster.run(code, on_output=quiet)
    assert set(r.failures) == {1} and r.failures[1].ename == "Weird" and "str() failed" in r.failures[1].evalue
    assert r.failures[1].line == 5 and not r.replies[1].get("suspect")
    _alive_and_well(cluster)


def test_a_20_mb_exception_message_is_capped_head_and_tail(cluster):
    r = cluster.run("raise ValueError('head' + 'x' * 20_000_000 + 'tail')", on_output=quiet)
    f = r.failures[0]
    assert len(f.evalue) < 30_000 and f.evalue.startswith("head") and f.evalue.endswith("tail")
    assert "characters of this exception message cut" in f.evalue
    assert len(f.traceback) < 150_000 and "characters of this traceback cut" in f.traceback
    _alive_and_well(cluster)


# -- 3. values that cannot be pickled in unexpected ways --------------------------------------
def test_magicmock_and_html_repr_returning_an_unpicklable_object(cluster):
    r = cluster.run("from unittest import mock\nmock.MagicMock(name='m')", on_output=quiet)
    assert r.ok and r.values[0].startswith("<MagicMock name='m'"), r.failures
    r = cluster.run("import threading\nclass H:\n    def _repr_html_(self):\n        return threading.Lock()\n"
                    "    def __repr__(self):\n        return 'H()'\nH()", on_output=quiet)
    assert r.ok and r.values == {0: "H()", 1: "H()"} and "html" not in r.replies[0]["value"]
    _alive_and_well(cluster)


def test_a_reply_that_cannot_be_pickled_is_stripped_to_text():
    import pickle

    from kit.rank.reply import bare, stripped

    reply = {"id": 3, "ok": True, "value": {"repr": "v", "pickle": None, "note": None, "html": threading.Lock()},
             "error": None, "figures": [], "suspect": False, "pg_gone": False}
    out = stripped(reply, "TypeError: cannot pickle")
    assert out["id"] == 3 and out["value"]["repr"] == "v" and "could not be sent" in out["value"]["note"]
    assert "html" not in out["value"] and pickle.loads(pickle.dumps(out)) == out
    failed = dict(reply, ok=False, error={"ename": threading.Lock(), "evalue": "x"})
    assert bare(failed, "why")["error"]["ename"] == "ReplyError" and pickle.dumps(bare(failed, "why"))


# -- 4. fd 1 closed or redirected ------------------------------------------------------------
@pytest.mark.parametrize("how", ["os.close(1)", "os.dup2(os.open(os.devnull, os.O_WRONLY), 1)"])
def test_closing_or_redirecting_fd_1_does_not_hang_later_cells(make_cluster, how):
    c = make_cluster()
    shown: list[tuple[int, str, str]] = []
    r = c.run(f"import os\n{how}\n'done'", on_output=lambda *a: shown.append(a), timeout_s=20)
    assert r.ok and r.values == {0: "done", 1: "done"} and not r.interrupted
    notes = r.replies[0].get("notes") or []
    assert notes and "fd 1 (stdout)" in notes[0] and "lost" in notes[0] and "os.dup2(" in notes[0]
    assert any("fd 1 (stdout)" in t for (_, s, t) in shown if s == "stderr")
    r = c.run("import sys\nprint('into the void', file=sys.stderr)\n'next'", on_output=quiet, timeout_s=20)
    assert r.ok and r.values[1] == "next" and not r.replies[1].get("notes")  # said once
    saved = notes[0].split("os.dup2(")[1].split(",")[0]
    r = c.run(f"os.dup2({saved}, 1)\nprint('back')", on_output=quiet, timeout_s=20)
    assert r.ok and r.stdout(0) == "back"


def test_where_does_not_say_idle_while_a_request_runs(cluster, tmp_path):
    # A 'call' request that lasts until the test lets it go (a stdlib function: a call names one).
    release = tmp_path / "release"
    wait = ["sh", "-c", f"while [ ! -e '{release}' ]; do sleep 0.05; done"]
    t = threading.Thread(target=cluster.call, args=("subprocess:call", wait), kwargs={"on_output": quiet})
    t.start()
    try:
        # Before a rank receives the request, "idle" is true; once it runs the request, where must say so.
        deadline = time.monotonic() + 60
        report = cluster.where()
        while not all(text.startswith("running a 'call' request") for text in report.values()):
            if time.monotonic() > deadline or not t.is_alive():
                break
            time.sleep(0.05)
            report = cluster.where()
    finally:
        release.touch()
        t.join()
    assert all(text.startswith("running a 'call' request") for text in report.values()), report


# -- 7. fork without _exit -------------------------------------------------------------------
def test_a_forked_child_returning_into_the_kit_is_ended_and_the_rank_lives(cluster):
    shown: list[tuple[int, str, str]] = []
    code = ("import os\npid = os.fork()\nif pid == 0:\n    try:\n        display('from the child')\n"
            "    except OSError as e:\n        print('the child may not send:', e, flush=True)\n"
            "    hooks_ok = kit_progress(1, 2, force=True)\n"  # the lab bench's progress: silently nothing
            "else:\n    os.waitpid(pid, 0)\n"
            "'parent' if pid else 'child'")
    cluster.run("from kit.rank.hooks import progress as kit_progress", on_output=quiet)
    r = cluster.run(code, on_output=lambda *a: shown.append(a))
    assert r.ok and r.values == {0: "parent", 1: "parent"}, r.failures
    assert any("the child may not send: this process" in t for (rank, s, t) in shown if s == "stdout"), shown
    said = [t for (rank, s, t) in shown if s == "stderr"]
    assert any("forked by rank 0's cell returned into the kit" in t and "os._exit()" in t for t in said), said
    _alive_and_well(cluster)


# -- 9. pull ---------------------------------------------------------------------------------
def test_pull_of_values_that_cannot_travel_gives_reprs_with_notes(cluster):
    cluster.run("import threading\nclass Cell:\n    def __repr__(self):\n        return 'Cell()'\n"
                "lock = threading.Lock()\ninst = Cell()\nbig = torch.zeros(20_000_000)\nsmall = [rank]",
                on_output=quiet)
    said: list[str] = []
    got = cluster.pull(["lock", "inst", "big", "small"], on_output=lambda r, s, t: said.append(t))
    assert got[1]["small"] == [1] and got[0]["inst"] == "Cell()" and got[0]["lock"].startswith("<unlocked")
    assert got[0]["big"].startswith("tensor(")
    assert any("big" in t and "64 MiB" in t for t in said) and any("inst" in t and "rebuilt" in t for t in said)
    cluster.run("del big", on_output=quiet)


# -- 13. torch's identity checks -------------------------------------------------------------
def test_p2pop_and_batch_isend_irecv_work(cluster):
    code = ("from torch.distributed import distributed_c10d as c10d\n"
            "assert dist.isend is c10d.isend and dist.irecv is c10d.irecv\n"
            "assert dist.all_reduce.__wrapped__ is c10d.all_reduce and dist.all_reduce.__qualname__ == 'all_reduce'\n"
            "send = torch.full((3,), float(rank))\nrecv = torch.empty(3)\npeer = 1 - rank\n"
            "ops = [dist.P2POp(dist.isend, send, peer), dist.P2POp(dist.irecv, recv, peer)]\n"
            "for w in dist.batch_isend_irecv(ops):\n    w.wait()\nrecv.tolist()")
    r = cluster.run(code, on_output=quiet)
    assert r.ok and r.values == {0: [1.0, 1.0, 1.0], 1: [0.0, 0.0, 0.0]}, r.failures


def test_torch_compile_rewrites_the_wrapped_collectives_as_under_torchrun(cluster):
    code = ("import torch._dynamo\ndef step(t):\n    dist.all_reduce(t)\n    return t * 2\n"
            "torch._dynamo.explain(step)(torch.ones(2)).graph_break_count")
    r = cluster.run(code, on_output=quiet)
    assert r.ok and r.values == {0: 0, 1: 0}, r.failures


# -- 14. annotations -------------------------------------------------------------------------
def test_cells_do_not_inherit_the_kits_future_annotations(cluster):
    r = cluster.run("def f(x: NotDefinedAnywhere):\n    pass", on_output=quiet)
    assert r.failures and r.failures[0].ename == "NameError"
    r = cluster.run("def g(x: int) -> float:\n    pass\ng.__annotations__['x'] is int", on_output=quiet)
    assert r.values == {0: True, 1: True}


# -- 15. store errors are not collective failures --------------------------------------------
def test_a_failing_tcpstore_does_not_reset_the_group(cluster):
    code = ("import socket, datetime\ns = socket.socket()\ns.bind(('127.0.0.1', 0))\ns.listen()\n"
            "port = s.getsockname()[1]\n"
            "try:\n    dist.TCPStore('127.0.0.1', port, 2, True, timeout=datetime.timedelta(seconds=2))\n"
            "finally:\n    s.close()")
    r = cluster.run(code, on_output=quiet)
    assert set(r.failures) == {0, 1} and "EADDRINUSE" in r.failures[0].evalue + r.failures[0].traceback
    assert not any(rep.get("suspect") for rep in r.replies.values())
    assert not any("re-created" in n for n in r.notes), r.notes


def test_a_collective_called_with_bad_arguments_does_not_reset_the_group(cluster):
    r = cluster.run("dist.all_reduce([1.0, 2.0])", on_output=quiet, check=False)
    assert set(r.failures) == {0, 1} and r.failures[0].ename == "TypeError"
    assert not any(rep.get("suspect") for rep in r.replies.values()) and not r.notes, r.notes


def test_looks_like_pg_failure_ignores_store_errors_and_broken_str():
    import torch.distributed as dist

    from kit.rank.setup import looks_like_pg_failure

    class Weird(RuntimeError):
        def __str__(self):
            raise ValueError("no")

    assert not looks_like_pg_failure(dist.DistNetworkError("gloo: EADDRINUSE"))
    assert not looks_like_pg_failure(dist.DistStoreError("Timed out waiting for key"))
    assert not looks_like_pg_failure(Weird())
    assert looks_like_pg_failure(dist.DistBackendError("boom"))
    assert looks_like_pg_failure(RuntimeError("[gloo] Connection closed by peer [127.0.0.1]:1234"))


# -- 16. init_process_group arguments torch would reject ---------------------------------------
@pytest.mark.parametrize("args, ename", [
    ("'gloo', device_id=torch.device('cpu')", "ValueError"),
    ("'no_such_backend'", "AssertionError"),
    ("'gloo', timeout=30", "TypeError"),
    ("'gloo', no_such_argument=1", "TypeError"),
    ("5", "ValueError"),
])
def test_init_process_group_rejects_what_torch_rejects(cluster, args, ename):
    r = cluster.run(f"dist.init_process_group({args})", on_output=quiet)
    assert set(r.failures) == {0, 1} and r.failures[0].ename == ename, (r.failures, r.ok)


def test_init_process_group_with_good_arguments_is_still_skipped(cluster):
    r = cluster.run("import datetime\ndist.init_process_group('gloo', timeout=datetime.timedelta(seconds=9))\n"
                    "dist.get_world_size()", on_output=quiet)
    assert r.ok and r.values == {0: 2, 1: 2} and "skipped" in r.stderr(0)


# -- 17. labels ------------------------------------------------------------------------------
def test_errors_and_ledger_name_the_cell_where_the_code_lives(cluster):
    cluster.run("def fails():\n    raise ValueError('bad')\n\ndef syncs():\n    dist.barrier()",
                on_output=quiet, label="In [3]")
    r = cluster.run("x = 1\nfails()", on_output=quiet, label="In [4]")
    f = r.failures[0]
    assert "raised ValueError at line 2 of In [3]: bad" in f.summary() and '"<cell In [3]>", line 2' in f.traceback
    assert "In [4]" in f.traceback
    cluster.run("\n\nsyncs()", on_output=quiet, label="In [5]")
    recent = cluster.where()[0]
    assert "In [3] line 5: #1 barrier()" in recent, recent
    r = cluster.run("1/0", on_output=quiet)  # no label: the kit's own counter
    assert "at line 1 of cell " in r.failures[0].summary()
    with pytest.raises(Exception, match="label="):
        cluster.run("1", label="bad\nlabel")


def test_the_magic_labels_cells_with_jupyters_in_numbers():
    ipython = pytest.importorskip("IPython")
    from IPython.testing.globalipapp import start_ipython

    from conftest import assert_pids_gone
    from kit.errors import CellError
    from kit.notebook.magics import get_cluster

    shell = start_ipython() or ipython.get_ipython()
    shell.run_line_magic("load_ext", "kit")
    try:
        defined = shell.execution_count
        shell.run_cell("%%distributed --cpus 2\ndef fails():\n    raise ValueError('bad')", store_history=True)
        res = shell.run_cell("%%distributed\nfails()", store_history=True)
        err = res.error_in_exec
        assert isinstance(err, CellError) and f"at line 2 of In [{defined}]: bad" in str(err), err
        assert f'"<cell In [{defined + 1}]>", line 1' in err.root.traceback
    finally:
        cluster = get_cluster()
        pids = list(cluster.pids.values()) if cluster else []
        shell.run_line_magic("unload_ext", "kit")
        assert_pids_gone(pids)


def test_a_native_crash_in_a_labelled_cell_names_its_line_and_cell(make_cluster):
    c = make_cluster()
    c.run("import ctypes\ndef crash():\n    ctypes.string_at(0)", on_output=quiet, label="In [8]")
    r = c.run("if rank == 1:\n    crash()", on_output=quiet, label="In [9]", check=False)
    dead = r.failures[1]
    assert dead.died and 'File "<cell In [8]>", line 3' in dead.traceback
    assert "rank 1 died at line 3 of In [8]: " in dead.summary(), dead.summary()
