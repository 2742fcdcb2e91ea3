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


def test_dist_help_and_usage_show_exactly_the_flags_each_action_takes(magics, capsys):
    """Each action's `%dist help` row shows every flag its parser accepts and no other, and the usage line
    (what a bare `%dist` prints) shows the same: e.g. slurm-script's row without the [--key-file F] it takes,
    or `where` shown without [--ranks L], would send a learner to the wrong command."""
    import re

    from kit.notebook.dist_actions import ACTIONS, parse

    magics.dist("help")
    rows = {line.split()[1]: line for line in capsys.readouterr().out.splitlines() if line.startswith("  %dist ")}
    with pytest.raises(UsageError) as bare:
        magics.dist("")
    assert set(rows) == set(ACTIONS), rows
    for action, row in rows.items():
        shown = set(re.findall(r"--[a-z-]+", row))
        assert shown == ACTIONS[action].valued() | ACTIONS[action].switches(), row
        for flag in shown:  # the parser takes each flag the row shows, with a value where the row gives one
            value = [] if re.search(re.escape(flag) + r"(\]| \||$)", row) else ["1"]
            parse(action, [flag, *value])
        with pytest.raises(UsageError, match=f"unknown flag.*--bogus.*usage: %dist {re.escape(action)}"):
            parse(action, ["--bogus", "1"])
        assert row.removeprefix("  %dist ") in str(bare.value), (row, str(bare.value))


@pytest.mark.parametrize("action, words", [
    ("attach", ["--world-size=2", "--port=29601", "--key-file=k", "--timeout=5"]),
    ("slurm-script", ["job.sbatch", "--nodes=2", "--gpus-per-node=4", "--key-file=k", "--force"]),
    ("pull", ["lr", "--ranks=0,1"]),
    ("restart", ["--cpus=4", "--pg-timeout=30"]),
])
def test_every_action_reads_flag_equals_value_as_flag_value(action, words):
    """`--flag=value` reads as `--flag value` for every action, those beyond this kernel included (e.g.
    `%dist attach --world-size=2` refused as "unknown flag --world-size=2")."""
    from kit.notebook.dist_actions import parse

    spaced = [part for w in words for part in w.split("=", 1)]
    assert parse(action, words) == parse(action, spaced)
    assert all("=" not in v for v in parse(action, words)[1].values())


def test_attach_with_flag_equals_value_attaches_as_asked(monkeypatch):
    """`%dist attach --world-size=2 --port=29601` waits for 2 ranks on port 29601, as the spaced flags do."""
    from kit.notebook import scale_out
    from kit.notebook.magics import DistributedMagics

    asked = []

    def attach(world_size, **kw):
        asked.append((world_size, kw))
        raise ValueError("stop here")  # a ConfigError's way out: nothing is started

    monkeypatch.setattr(scale_out.Cluster, "attach", staticmethod(attach))
    with pytest.raises(UsageError, match="stop here"):
        DistributedMagics(None).dist("attach --world-size=2 --port=29601 --timeout=5")
    assert asked == [(2, {"host": "127.0.0.1", "port": 29601, "key_file": None, "timeout_s": 5.0})]


def test_slurm_script_with_flag_equals_value_writes_the_key_file_asked(magics, tmp_path, capsys):
    """`%dist slurm-script F --nodes=2 --key-file=K` writes the sbatch script for 2 nodes with that key file."""
    path, key = tmp_path / "job.sbatch", tmp_path / "attach.key"
    magics.dist(f"slurm-script {path} --nodes=2 --port=29700 --key-file={key}")
    text = path.read_text()
    assert "#SBATCH --nodes=2" in text and f":29700 --key-file {key}" in text, text
    assert f"Copy {key} to the nodes" in capsys.readouterr().out


def test_distributed_help_prints_the_flags_and_runs_nothing(magics, capsys):
    before = _children()
    magics.distributed("--help", "raise SystemExit('ran')")
    out = capsys.readouterr().out
    assert "--gpus N" in out and "--no-check" in out and "The cell did not run" in out, out
    assert _children() <= before
