"""Bad input everywhere: every LaunchConfig/Cluster argument and magic flag is refused before anything is
spawned, with a message naming the value, the allowed range and the fix."""
from __future__ import annotations


import psutil
import pytest
from IPython.core.error import UsageError

from kit.engine.cluster import Cluster
from kit.config import LaunchConfig
from kit.errors import ConfigError
from conftest import quiet


WALL_CLOCK_S = 20  # conftest's autouse wall_clock fixture enforces it


def _children() -> set[int]:
    return {p.pid for p in psutil.Process().children(recursive=True)}


@pytest.mark.parametrize("kwargs, message", [
    ({"world_size": "2"}, "world_size must be an integer, got '2'"),
    ({"world_size": True}, "world_size must be an integer"),
    ({"world_size": 0}, "world_size=0 is out of range; use 1 to 64"),
    ({"world_size": 65}, "world_size=65 is out of range; use 1 to 64"),
    ({"device": "tpu"}, "device='tpu' is not 'gpu' or 'cpu'"),
    ({"strict": True}, "--strict goes with --gpus"),
    ({"strict": "no", "device": "gpu"}, "strict='no' must be True or False"),
    ({"pg_timeout_s": 0}, "pg_timeout_s=0 must be a number of seconds between 0.5 and 86400"),
    ({"pg_timeout_s": float("nan")}, "pg_timeout_s=nan must be"),
    ({"pg_timeout_s": "5"}, "pg_timeout_s='5' must be"),
    ({"start_timeout_s": -1}, "start_timeout_s=-1 must be"),
    ({"threads_per_rank": 0}, "threads_per_rank=0 must be a positive integer or None"),
    ({"check_collectives": "yes"}, "check_collectives='yes' must be True or False"),
    ({"env": {"A": "1"}}, "must be a tuple of \\(name, value\\) string pairs, e.g."),
    ({"env": (("A", 1),)}, "env entries must be \\(name, value\\) string pairs, got \\('A', 1\\)"),
])
def test_launch_config_names_value_range_and_fix(kwargs, message):
    before = _children()
    with pytest.raises(ConfigError, match=message):
        Cluster(LaunchConfig(**kwargs))
    with pytest.raises(ConfigError, match=message):
        Cluster(**kwargs)
    assert _children() <= before


def test_cluster_refuses_config_and_keywords_together():
    with pytest.raises(ConfigError, match=r"not both \(got \['world_size'\]\); use config.replace\(world_size=...\)"):
        Cluster(LaunchConfig(), world_size=3)
    with pytest.raises(ConfigError, match="must be a kit.LaunchConfig"):
        Cluster({"world_size": 2})  # type: ignore[arg-type]


@pytest.mark.parametrize("call, message", [
    (lambda c: c.run(123), "code must be a string of Python source, got int"),
    (lambda c: c.run("1", timeout_s=0), "timeout_s=0 must be a positive number of seconds, or None"),
    (lambda c: c.run("1", timeout_s=-2.5), "timeout_s=-2.5 must be"),
    (lambda c: c.run("1", check="yes"), "check='yes' must be True, False or None"),
    (lambda c: c.run("1", ranks="0"), "ranks='0' must be a list of rank numbers, e.g. ranks=\\[0\\]"),
    (lambda c: c.run("1", ranks=[0.5]), "must be a list of rank numbers"),
    (lambda c: c.run("1", ranks=[2]), "ranks \\[2\\] not in 0..1; choose from \\[0, 1\\]"),
    (lambda c: c.run("1", ranks=[]), "not in 0..1"),
    (lambda c: c.call("os.getpid"), "must look like 'package.module:function'"),
    (lambda c: c.where([7]), "ranks \\[7\\] not in 0..1"),
])
def test_cluster_call_arguments_are_checked_before_sending(cluster, call, message):
    with pytest.raises(ConfigError, match=message):
        call(cluster)
    assert cluster.run("rank", on_output=quiet).values == {0: 0, 1: 1}  # nothing was half-sent


@pytest.fixture(scope="module")
def magics():
    from kit.notebook.magics import DistributedMagics

    # No shell: IPython's globalipapp may be started once per process, and test_magics owns that.
    m = DistributedMagics(None)
    yield m
    if m.cluster is not None:
        m.cluster.shutdown()


@pytest.mark.parametrize("line, message", [
    ("--cpus two", "invalid int value: 'two'. Valid flags: --gpus N"),
    ("--gpus -1", "world_size=-1 is out of range; use 1 to 64"),
    ("--cpus 100", "world_size=100 is out of range"),
    ("--cpus 2 --threads 0", "threads_per_rank=0 must be a positive integer"),
    ("--cpus 2 --pg-timeout -1", "pg_timeout_s=-1.0 must be a number of seconds between 0.5 and 86400"),
    ("--cpus 2 --timeout 0", "--timeout 0 must be a positive number of seconds"),
    ("--cpus 2 --ranks x", "write it like --ranks 0,1 or --ranks 0-3"),
    ("--gpus 1 --cpus 1", "not both"),
])
def test_cell_magic_flags_fail_before_spawning(magics, line, message):
    before = _children()
    with pytest.raises(UsageError, match=message):
        magics.distributed(line, "1")
    assert _children() <= before


@pytest.mark.parametrize("line, message", [
    ("", "usage: %dist status"),
    ("status --bogus 1", "unknown flag\\(s\\) \\['--bogus'\\]"),
    ("where --ranks", "--ranks needs a value"),
    ("restart --cpus 0", "world_size=0 is out of range; use 1 to 64"),
    ("where", "needs running ranks; run a `%%distributed` cell first"),
    ("stauts", "unknown action 'stauts' \\(did you mean `%dist status`\\?\\)\\. The actions: status, restart, .*"
               "`%dist help` says what each does"),
    ("restart 4", "`%dist restart` takes no names, got '4' \\(the number of ranks is a flag: `%dist restart --cpus 4`"),
    ("where now", "`%dist where` takes no names, got 'now'"),
    ("restart --cpus=0", "world_size=0 is out of range"),  # --flag=value is read as --flag value
])
def test_line_magic_arguments(magics, line, message):
    before = _children()
    with pytest.raises(UsageError, match=message):
        magics.dist(line)
    assert _children() <= before


@pytest.mark.parametrize("line", ["help", "--help", "-h", "?"])
def test_dist_help_lists_every_action_with_what_it_does(magics, line, capsys):
    """`%dist help` (what a learner types first) prints each action, its flags and what it does, not
    `UsageError: unknown action 'help'` with one 300-character usage line."""
    before = _children()
    magics.dist(line)
    out = capsys.readouterr().out
    for action in ("status", "restart [--gpus N | --cpus N]", "shutdown", "where", "push NAME", "pull NAME",
                   "export FILE.py", "attach --world-size N", "slurm-script"):
        assert f"%dist {action}" in out, out
    assert "fresh ranks (every variable on them is lost)" in out and "%%distributed --help" in out
    assert _children() <= before


def test_distributed_help_prints_the_flags_and_runs_nothing(magics, capsys):
    before = _children()
    magics.distributed("--help", "raise SystemExit('ran')")
    out = capsys.readouterr().out
    assert "--gpus N" in out and "--no-check" in out and "The cell did not run" in out, out
    assert _children() <= before
