"""The `%dist` subcommands that take the notebook's work beyond this kernel: attach (ranks that torchrun
started elsewhere), export (the cells as a torchrun script) and slurm-script (an sbatch script).

Their words arrive parsed (kit.notebook.dist_actions.parse, from the one table of every action's flags), and
every file they write goes through kit.notebook.scripts.write_script (new files only unless --force, never
through a symbolic link)."""
from __future__ import annotations

import socket
from typing import Any

from IPython.core.error import UsageError

from kit.engine.cluster import Cluster
from kit.notebook.dist_actions import usage
from kit.notebook.scripts import export_script, slurm_script, write_script

__all__ = ["run_scale_out", "SLURM_PORT"]

SLURM_PORT = 29650  # a fixed port, so the sbatch script and `%dist attach` agree before the job starts
def _number(flags: dict[str, str], flag: str, kind: type, default: Any = None) -> Any:
    if flag not in flags:
        if default is None:
            raise UsageError(f"{flag} is required")
        return default
    try:
        return kind(flags[flag])
    except ValueError:
        raise UsageError(f"{flag} {flags[flag]!r} is not a number") from None


def run_scale_out(magics: Any, action: str, names: list[str], flags: dict[str, str], force: bool) -> None:
    if action == "attach":
        if magics.cluster is not None and magics.cluster.state != "stopped":
            raise UsageError("ranks are already running here; `%dist shutdown` first (their variables are lost)")
        try:
            magics.cluster = Cluster.attach(_number(flags, "--world-size", int), host=flags.get("--host", "127.0.0.1"),
                                            port=_number(flags, "--port", int, 0), key_file=flags.get("--key-file"),
                                            timeout_s=_number(flags, "--timeout", float, 600.0))
        except ValueError as e:  # ConfigError: a bad host, port or key file
            raise UsageError(str(e)) from None
        print(f"attached: {magics.cluster.world_size} rank(s); `%%distributed` cells now run on them")
        return
    if action == "export":
        if len(names) != 1 or not names[0].endswith(".py"):
            raise UsageError(f"usage: %dist {usage('export')} writes the executed %%distributed cells as a "
                             "torchrun script")
        size = magics.cluster.world_size if magics.cluster is not None else 2
        timeout_s = magics.cluster.config.pg_timeout_s if magics.cluster is not None else None
        _write(names[0], export_script(magics.history, names[0], size, timeout_s), force)
        cells = [c for c in magics.history if c.pushed is None]
        pushes = [c for c in magics.history if c.pushed is not None and c.exported]
        kept = sum(1 for c in cells if c.exported)
        values = sorted({n for c in pushes for n in c.pushed or () if n not in c.unwritable})  # assigned
        stops = sorted({n for c in pushes for n in c.unwritable})
        print(f"wrote {names[0]}: {kept} of {len(cells)} cell(s)"
              + (f" and the pushed {', '.join(values)} as assignments" if values else "")
              + f"; run it with `torchrun --nproc-per-node {size} {names[0]}`"
              + (f". {', '.join(stops)} "
                 f"{'is not a Python literal' if len(stops) == 1 else 'are not Python literals'}: the script stops "
                 f"where {'it is' if len(stops) == 1 else 'they are'} pushed, saying so; define "
                 f"{'it' if len(stops) == 1 else 'them'} there" if stops else ""))
        return
    from kit.engine.attach import DEFAULT_KEY_FILE

    nodes, gpus = _number(flags, "--nodes", int), _number(flags, "--gpus-per-node", int, 0)
    port = _number(flags, "--port", int, SLURM_PORT)
    host = flags.get("--host") or socket.getfqdn()
    path = names[0] if names else "kit-attach.sbatch"
    key_file = flags.get("--key-file", DEFAULT_KEY_FILE)
    try:
        text = slurm_script(nodes, gpus, f"{host}:{port}", key_file)
    except ValueError as e:
        raise UsageError(str(e)) from None
    _write(path, text, force)
    print(f"wrote {path}. Copy {key_file} to the nodes (mode 0600), run `%dist attach --world-size "
          f"{nodes * max(1, gpus)} --host 0.0.0.0 --port {port}` here, then `sbatch {path}` on the login node")


def _write(path: str, text: str, force: bool) -> None:
    try:
        write_script(path, text, force)
    except ValueError as e:
        raise UsageError(str(e)) from None
