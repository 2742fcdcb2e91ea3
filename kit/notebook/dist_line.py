"""The `%dist` line magic's subcommands (status, restart, shutdown, where, push, pull, attach, export,
slurm-script)."""
from __future__ import annotations

import shlex
from typing import Any, Protocol

from IPython.core.error import UsageError

from kit.config import LaunchConfig
from kit.engine.cluster import Cluster, live_clusters
from kit.engine.output import print_line as _emit
from kit.engine.template import close_idle
from kit.errors import TransferError
from kit.notebook.dist_actions import ACTIONS, USAGE, help_text, parse
from kit.notebook.flags import parse_ranks
from kit.notebook.scale_out import run_scale_out
from kit.notebook.scripts import CellRecord


class _Magics(Protocol):
    """What `%dist` needs from the magics object (kit.notebook.magics.DistributedMagics)."""

    cluster: Cluster | None
    shell: Any
    history: list[CellRecord]

    def start_cluster(self, config: LaunchConfig) -> Cluster: ...

    @staticmethod
    def validate_ranks(cluster: Cluster, ranks: list[int] | None) -> None: ...

    def record_push(self, names: list[str], ranks: list[int] | None) -> None: ...

__all__ = ["run_line"]

# how each rank was started, as `%dist status` says it (Cluster.status()'s "started")
STARTED = {"forked": "forked from the rank template", "fresh": "its own interpreter", "attached": "torchrun"}
_HELP_WORDS = ("help", "-h", "--help", "?")
_NO_NAMES = {"restart": " (the number of ranks is a flag: `%dist restart --cpus 4`, or --gpus 4)",
             "where": " (one rank's: `%dist where --ranks 1`)"}


def _unknown(action: str) -> str:
    import difflib

    near = difflib.get_close_matches(action.lower().lstrip("-"), list(ACTIONS), n=1, cutoff=0.6)
    meant = f" (did you mean `%dist {near[0]}`?)" if near else ""
    return (f"unknown action {action!r}{meant}. The actions: {', '.join(ACTIONS)}; "
            f"`%dist help` says what each does and takes")


def run_line(magics: _Magics, line: str) -> Any:
    words = shlex.split(line)
    if not words:
        raise UsageError(f"{USAGE}. `%dist help` says what each action does")
    if words[0] in _HELP_WORDS:
        print(help_text())
        return None
    action = words[0]
    if action not in ACTIONS:
        raise UsageError(_unknown(action))
    names, flags, switches = parse(action, words[1:])
    if not ACTIONS[action].words and names:  # `%dist restart 4` restarted the same 2 ranks without a word
        raise UsageError(f"`%dist {action}` takes no names, got {' '.join(names)!r}{_NO_NAMES.get(action, '')}; "
                         f"nothing was done. `%dist help` lists each action's flags")
    if action in ("attach", "export", "slurm-script"):  # beyond this kernel
        return run_scale_out(magics, action, names, flags, "--force" in switches)
    if action in _LIFECYCLE:
        return _LIFECYCLE[action](magics, flags)
    cluster = magics.cluster
    if cluster is None or cluster.state == "stopped":
        raise UsageError(f"`%dist {action}` needs running ranks; run a `%%distributed` cell first")
    ranks = parse_ranks(flags.get("--ranks"))
    magics.validate_ranks(cluster, ranks)
    if action == "where":
        for r, text in cluster.where(ranks).items():
            print(f"--- rank {r} ---\n{text}")
        return None
    if not names:
        raise UsageError(f"`%dist {action}` needs variable names, e.g. `%dist {action} lr model`")
    return (_push if action == "push" else _pull)(magics, cluster, names, ranks)


def _others(magics: _Magics) -> list[Cluster]:
    """Ranks of this kernel that `%%distributed` did not start: kit.experiments' run/sweep/compare and the
    lab bench start their own when no %%distributed ranks of the size they need are ready."""
    return [c for c in live_clusters() if c is not magics.cluster]


def _say_others(others: list[Cluster], then: str) -> None:
    if others:
        pids = ", ".join(str(p) for c in others for p in c.pids.values())
        print(f"also running in this kernel: {sum(c.world_size for c in others)} rank(s) that kit.experiments "
              f"(run, sweep, compare, the lab bench) or a Cluster of yours started, pids {pids}; {then}")


def _status(magics: _Magics, flags: dict[str, str]) -> None:
    cluster = magics.cluster
    if cluster is None or cluster.state == "stopped":  # never started, or after `%dist shutdown`
        print("no %%distributed ranks running; start them with a `%%distributed --gpus 2` (or --cpus 2) cell")
        _say_others(_others(magics), "`%dist shutdown` stops them")
        return None
    s = cluster.status()
    print(f"{s['state']}: {s['world_size']} rank(s), backend {s['backend']} on {s['device_type']}, "
          f"{s['threads_per_rank']} thread(s) per rank, up {s['uptime_s']:.0f} s")
    for r, info in s["ranks"].items():
        mem = f"{info['rss_mib']:.0f} MiB" if info["rss_mib"] else "-"
        node = f" on {info['node']}" if info.get("node") else ""
        print(f"  rank {r}: pid {info['pid']}{node} ({STARTED.get(info.get('started'), '?')}), "
              f"{'alive' if info['alive'] else 'exited ' + str(info['exit_code'])}, rss {mem}")
    if s.get("attach"):
        a = s["attach"]
        print(f"  ranks attach on {a['address']} (key file {a['key_file']}); {a['refused_total']} attacher(s) refused")
    if s["broken_reason"]:
        print(f"  broken: {s['broken_reason']}; run `%dist restart`")
    _say_others(_others(magics), "`%dist shutdown` stops them too")
    return None


def _restart_config(config: LaunchConfig, flags: dict[str, str]) -> LaunchConfig:
    """The running ranks' config with `%dist restart`'s flags applied (bad values: UsageError)."""
    for flag, device in (("--gpus", "gpu"), ("--cpus", "cpu")):
        if flag in flags:
            if not flags[flag].isdigit():
                raise UsageError(f"{flag} {flags[flag]!r} is not a number of ranks; write e.g. {flag} 2")
            try:
                config = config.replace(world_size=int(flags[flag]), device=device, strict=False)
            except ValueError as e:
                raise UsageError(f"{flag} {flags[flag]}: {e}") from None
    for flag, field, kind in (("--pg-timeout", "pg_timeout_s", float), ("--threads", "threads_per_rank", int)):
        if flag in flags:
            try:
                config = config.replace(**{field: kind(flags[flag])})
            except ValueError as e:  # not a number, or out of range (ConfigError is a ValueError)
                raise UsageError(f"{flag} {flags[flag]}: {e}") from None
    return config


def _restart(magics: _Magics, flags: dict[str, str]) -> None:
    cluster = magics.cluster
    config = _restart_config(cluster.config if cluster else LaunchConfig(device="gpu"), flags)
    was_running = _stop_ranks(magics)
    magics.cluster = magics.start_cluster(config)
    print(f"restarted: {config.world_size} fresh rank(s) ({magics.cluster.backend}); earlier variables are gone"
          if was_running else f"started: {config.world_size} rank(s) ({magics.cluster.backend}); "
          "no %%distributed ranks were running")
    _say_others(_others(magics), "they are not these; `%dist shutdown` stops all")
    return None


def _stop_ranks(magics: _Magics) -> bool:
    """Stop the %%distributed ranks, if any; return whether they were running. The cells so far ran on
    ranks that are gone: `%dist export` leaves them out (commented, with the reason), as the script
    stands for the ranks that run next (before, it ran them again before the cells after a restart,
    whose ranks never had their variables)."""
    was_running = magics.cluster is not None and magics.cluster.state != "stopped"
    if magics.cluster is not None:
        magics.cluster.shutdown()
    for record in magics.history:
        record.replaced = True
    return was_running


def _shutdown(magics: _Magics, flags: dict[str, str]) -> None:
    was_running = _stop_ranks(magics)
    # Shutdown is how a notebook frees its ranks' memory (Binder has 1-2 GB): the ranks kit.experiments and
    # the lab bench started go too (they start again when next needed); before, 2 of them stayed unseen.
    others = _others(magics)
    for other in others:
        other.shutdown()
    # The warm rank template (torch imported, ready to fork ranks) goes too: shutdown is how a notebook
    # hands its ranks' memory to something else (torchrun, lessons 10 and 14); the next start is cold.
    closed = close_idle()
    said = ["ranks stopped" if was_running else "no %%distributed ranks were running"]
    if others:
        said.append(f"stopped {sum(c.world_size for c in others)} rank(s) that kit.experiments (run, sweep, "
                    "compare, the lab bench) or a Cluster of yours started")
    if not was_running and not others:
        said = ["no ranks were running"]
    print("; ".join(said) + (" (and the idle rank template: the next start imports torch afresh)" if closed else ""))
    return None


_LIFECYCLE = {"status": _status, "restart": _restart, "shutdown": _shutdown}  # need no running ranks


def _push(magics: _Magics, cluster: Cluster, names: list[str], ranks: list[int] | None) -> None:
    ns = magics.shell.user_ns
    missing = [n for n in names if n not in ns]
    if missing:
        raise UsageError(f"not defined in the kernel: {', '.join(missing)}")
    listed = ", ".join(names)
    where = ("every rank" if not ranks else f"rank {ranks[0]}" if len(ranks) == 1
             else f"ranks {', '.join(map(str, ranks))}")
    why, pushed = None, False
    try:
        cluster.push({n: ns[n] for n in names}, ranks)
        pushed = True
        _emit(-1, "stdout", f"pushed {listed} to {where}")
    except (TypeError, TransferError) as e:  # refused before sending (too big, a notebook function): say why
        why = str(e)
    except KeyboardInterrupt as e:  # the push says which ranks have the values; Run All stops here
        if pushed:  # it landed after the push returned: every chosen rank has them
            why = f"pushed {listed} to {where} (the interrupt came after the ranks had kept it)"
        elif not e.args:  # transfer.push says every interrupt inside it: this one came before it began
            why = f"push of {listed} interrupted before anything was sent; no rank has {listed}"
        else:
            why = str(e)
        pushed = pushed or getattr(e, "kept_everywhere", False)  # transfer.push: the commit went, then the interrupt
    if pushed:  # every chosen rank has the values, interrupted or not: the exported script assigns them here too
        magics.record_push(names, ranks)
    if why is not None:  # raised here, after the except: no kit frame holding the values rides along
        raise UsageError(why)
    return None


def _pull(magics: _Magics, cluster: Cluster, names: list[str], ranks: list[int] | None) -> None:
    ns = magics.shell.user_ns
    one = ranks[0] if ranks and len(ranks) == 1 else None
    pulled = (f"pulled {', '.join(names)} into the kernel as "
              + (f"the value from rank {one}" if one is not None else "a dict {rank: value}"))
    why, got, values = None, None, None
    try:  # every value whole, or the kernel's variables unchanged, wherever an interrupt lands
        got = cluster.pull(names, ranks, on_output=_emit, whole=True)
        values = {n: got[one][n] if one is not None else {r: v[n] for r, v in got.items()} for n in names}
        ns.update(values)  # one dict update (a C call): an interrupt lands before or after it
        _emit(-1, "stdout", pulled)
    except TransferError as e:
        why = str(e)
    except KeyboardInterrupt as e:
        if values is not None and all(n in ns and ns[n] is v for n, v in values.items()):
            # the values were stored before the interrupt landed: the pull happened, so say so
            _emit(-1, "stdout", pulled + " (the interrupt came after they were stored)")
        else:
            unchanged = f"{', '.join(names)} in the kernel {'is' if len(names) == 1 else 'are'} unchanged"
            why = str(e) if e.args else f"pull of {', '.join(names)} interrupted; {unchanged}"
    if why is not None:
        got = values = None  # raised here, after the except: no kit frame holding the values rides along
        raise UsageError(why)
    return None
