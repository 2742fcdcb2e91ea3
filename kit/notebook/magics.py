"""`%%distributed` and `%dist`: a thin IPython skin over `kit.Cluster`.

Flags become a validated LaunchConfig before anything is spawned; bad flags raise
UsageError with the fix; a failing cell raises CellError so Run All stops.
"""
from __future__ import annotations

from typing import Any

from IPython import get_ipython
from IPython.core.error import UsageError
from IPython.core.magic import Magics, cell_magic, line_magic, magics_class
from IPython.core.magic_arguments import argument, magic_arguments, parse_argstring

from kit.engine.output import CellResult
from kit.engine.output import Printer
from kit.engine.output import print_line as _emit
from kit.notebook.flags import check_timeout, config_from_flags, live_changes, parse_ranks
from kit.engine.cluster import Cluster
from kit.engine.devices import place
from kit.engine.launcher import prewarm
from kit.config import LaunchConfig
from kit.errors import CellError, ClusterStateError, ConfigError
from kit.notebook.dist_line import run_line
from kit.notebook.profile_cell import check_path, profiled
from kit.notebook.pushed import push_record
from kit.notebook.scripts import CellRecord
from kit.notebook.show import show_display, show_result

__all__ = ["DistributedMagics", "load", "unload", "get_cluster"]

_INSTANCES: dict[int, "DistributedMagics"] = {}


def get_cluster() -> Cluster | None:
    """The cluster the magics of this kernel's shell are using, if any (the lab bench shares it). Where
    several shells loaded the kit in one process (tests do), the current shell's, not whichever loaded
    first: a `%reload_ext` re-registers its shell last, and "the first" would then be another's."""
    shell = get_ipython()
    magics = _INSTANCES.get(id(shell)) if shell is not None else None
    if magics is None and _INSTANCES:
        magics = next(reversed(_INSTANCES.values()))  # no current shell: the one that loaded the kit last
    return magics.cluster if magics is not None else None


@magics_class
class DistributedMagics(Magics):
    cluster: Cluster | None = None

    def __init__(self, shell: Any = None):
        super().__init__(shell)
        self.history: list[CellRecord] = []  # executed %%distributed cells, for `%dist export`
        self._fallback_noted: Cluster | None = None  # the ranks the "--gpus on CPU ranks" line was said for

    def _record(self, cell: str, line: str, result: CellResult, ranks: list[int] | None, expect_error: bool,
                fresh: bool) -> None:
        error = CellError(result.failures, result.notes).root.summary() if result.failures else ""  # type: ignore
        self.history.append(CellRecord(self._label() or f"cell {len(self.history) + 1}", cell, line.strip(),
                                       result.ok, error, tuple(ranks) if ranks else None, expect_error, fresh))

    def start_cluster(self, config: LaunchConfig) -> Cluster:
        cluster = Cluster(config)
        try:
            cluster.start()
        except ConfigError as e:
            raise UsageError(str(e)) from None
        except KeyboardInterrupt:  # the stop button while ranks start: one line, nothing left running
            cluster.shutdown()
            raise UsageError("start-up interrupted: no ranks are running; run the cell again to start them "
                             "(only the first start imports torch; later ones take about a second)") from None
        if cluster.banner:
            # Visible and honest, but calm: on Binder (no GPU) and Colab (one GPU) this is the expected path,
            # so it goes to stdout, not the red stderr box that reads like an error.
            _emit(-1, "stdout", cluster.banner)
        if cluster.reaped:
            _emit(-1, "stderr", f"stopped {len(cluster.reaped)} stale worker(s) left by a kernel that died "
                                f"(pids {cluster.reaped})")
        return cluster

    @magic_arguments()
    @argument("--gpus", type=int, metavar="N", help="N ranks, one GPU each with NCCL; with fewer GPUs, N CPU ranks "
              "(gloo) and a banner saying so. Default when nothing runs yet: --gpus 2.")
    @argument("--cpus", type=int, metavar="N", help="N CPU ranks with the gloo backend.")
    @argument("--ranks", metavar="LIST", help="run only on these ranks, e.g. 0 or 0,1 or 0-3 (all by default).")
    @argument("--fresh", action="store_true", help="run this cell once in new processes, then stop them "
              "(clean, repeatable measurements; the persistent ranks are untouched).")
    @argument("--timeout", type=float, metavar="S", help="interrupt the cell after S seconds (off by default).")
    @argument("--strict", action="store_true", help="with --gpus: fail instead of falling back to CPU ranks.")
    @argument("--no-check", action="store_true", help="skip the pre-flight check that compares each collective "
              "across ranks (use in measured loops).")
    @argument("--expect-error", action="store_true", help="this cell fails on purpose (lessons): show the error "
              "without stopping Run All; it is an error if the cell succeeds.")
    @argument("--pg-timeout", type=float, metavar="S", help="collective timeout in seconds (default 60).")
    @argument("--threads", type=int, metavar="T", help="torch threads per rank (default: OMP_NUM_THREADS if set, "
              "else the CPUs this kernel may use / ranks).")
    @argument("--no-template", action="store_true", help="start the ranks as fresh interpreters instead of forking "
              "them from the warm rank template (slower; applies when ranks start).")
    @argument("--profile", metavar="DIR", help="run torch.profiler on every rank for this cell; DIR (created) gets "
              "one trace of all ranks, all_ranks.json (ui.perfetto.dev), and torch.profiler's "
              "own file per rank in DIR/ranks (TensorBoard's profiler plugin, HolisticTraceAnalysis).")
    @cell_magic
    def distributed(self, line: str, cell: str) -> None:
        """Run the cell on every rank of a persistent torch.distributed group.

        Each rank is a fresh Python process with `rank`, `world_size`, `local_rank`, `device`,
        `torch` and `dist` (torch.distributed, initialised) predefined; variables persist
        between cells. Output streams live as `[rank N] ...`; the last expression's value is
        shown per rank (once if identical). A failure raises, showing the first failing rank's
        traceback. Interrupt once to stop the cell on every rank, twice to see every rank's
        stack, three times to stop waiting. See also `%dist status|restart|shutdown|where|push|pull`.
        """
        if set(line.split()) & {"--help", "-h"}:  # argparse's own help is off in magics: it said "unrecognized"
            print(self.distributed.parser.format_help().rstrip() + "\nThe cell did not run. `%dist help` lists "
                  "the commands for the ranks (status, restart, where, push, pull ...).")
            return None
        try:
            args = parse_argstring(self.distributed, line)
        except UsageError as e:
            raise UsageError(f"{e}. Valid flags: --gpus N, --cpus N, --ranks LIST, --fresh, --timeout S, --strict, "
                             "--no-check, --expect-error, --pg-timeout S, --threads T, --profile DIR, "
                             "--no-template. See `%%distributed?`.") from None
        check_timeout(args.timeout)
        ranks = parse_ranks(args.ranks)
        if args.profile is not None:
            check_path(args.profile)  # a bad path is refused before any rank starts
        running = self.cluster if self.cluster and self.cluster.state != "stopped" else None
        config = config_from_flags(args, running.config if running and not args.fresh else None)
        check = False if args.no_check else None
        cluster, throwaway = self._ranks_for(args, running, config, ranks, line)
        try:
            self.validate_ranks(cluster, ranks)
            result = self._run(cluster, cell, ranks, args.timeout, check, args.profile)
        finally:
            if throwaway:
                cluster.shutdown()
        self._record(cell, line, result, ranks, args.expect_error, throwaway)
        show_result(result, args.expect_error)

    def _ranks_for(self, args: Any, running: Cluster | None, config: LaunchConfig | None, ranks: list[int] | None,
                   line: str) -> tuple[Cluster, bool]:
        """The ranks this cell runs on, and whether they are a throwaway set, stopped after the cell: --fresh
        starts new ones from the flags alone and leaves the persistent ranks (and `self.cluster`) untouched;
        otherwise the running ranks (the flags checked against them), or new persistent ones."""
        if running is not None and not args.fresh:
            if config is not None:
                self._same_placement(running, config, line)
                self._note_cpu_fallback(running, config)
            self._apply_live(running, live_changes(args, running.config))
            return running, False
        config = config or LaunchConfig(device="gpu")
        self.validate_ranks(config, ranks)  # before any rank starts
        started = self.start_cluster(config)
        if not args.fresh:
            self.cluster = started
        return started, args.fresh

    def _run(self, cluster: Cluster, cell: str, ranks: list[int] | None, timeout: float | None,
             check: bool | None, profile: str | None = None) -> CellResult:
        def run() -> CellResult:
            printer = Printer()  # the cell's lines in batches: a flood is a few messages, not one per line
            try:
                return cluster.run(cell, ranks, on_output=printer, timeout_s=timeout, check=check,
                                   on_display=show_display, label=self._label())
            finally:
                printer.flush()
        try:
            if profile is None:
                return run()
            result, trace = profiled(cluster, profile, ranks, self._label(), run)
            if trace is not None:
                from IPython.display import display

                from kit.plots.trace import trace_timeline
                display(trace_timeline(trace))
            return result
        except (ConfigError, ClusterStateError) as e:  # a bad argument, or broken/busy ranks: the fix, not a
            raise UsageError(str(e)) from None          # traceback through the kit

    @staticmethod
    def _same_placement(running: Cluster, config: LaunchConfig, line: str) -> None:
        """--gpus N without GPUs means the same CPU ranks as --cpus N: compare where ranks would run."""
        try:
            wanted = place(config)  # raises under --strict when the GPUs are missing
        except ConfigError as e:
            raise UsageError(str(e)) from None
        have = running.placement
        if have is None or (config.world_size, wanted.backend, wanted.gpu_ids) != (
                running.world_size, have.backend, have.gpu_ids):
            flag = f"--{config.device}s {config.world_size}"
            raise UsageError(f"{running.world_size} {running.device_type.upper()} rank(s) ({running.backend}) are "
                             f"already running with your variables, and `{line.strip()}` asks for "
                             f"{config.world_size} {wanted.device_type.upper()} rank(s) ({wanted.backend}). Run "
                             f"`%dist restart {flag}` to replace them (state is lost), use --fresh for a one-off "
                             f"run, or drop the flag to use them.")

    def _note_cpu_fallback(self, running: Cluster, config: LaunchConfig) -> None:
        """`--gpus N` on the CPU ranks `--cpus N` started (no GPU here): said once per set of ranks."""
        if config.device == "gpu" and running.device_type == "cpu" and self._fallback_noted is not running:
            self._fallback_noted = running
            _emit(-1, "stdout", f"--gpus {config.world_size}: no GPU is visible, so this cell runs on the "
                                f"{running.world_size} CPU ranks (gloo) already running, as --cpus "
                                f"{running.world_size} would; your variables are there")

    @staticmethod
    def _apply_live(cluster: Cluster, config: LaunchConfig) -> None:
        if config.threads == cluster.config.threads:
            return
        cluster.call("torch:set_num_threads", config.threads, on_output=_emit)  # a call, so cell numbers stay
        cluster.config = config
        _emit(-1, "stderr", f"{config.threads} torch thread(s) per rank now (torch.set_num_threads on every rank)")

    def _label(self) -> str | None:
        """Jupyter's "In [7]" for this cell, so tracebacks and the ledger name what the user sees
        (None outside a numbered execution: the cluster counts cells itself).

        The running cell's ExecutionResult holds the number Jupyter shows on every IPython since 7:
        `shell.execution_count` is that number during the cell up to IPython 8, but IPython 9
        increments it before the cell runs (one too many)."""
        running = getattr(getattr(self.shell, "displayhook", None), "exec_result", None)
        count = getattr(running, "execution_count", None)
        return f"In [{count}]" if isinstance(count, int) and count > 0 else None

    @staticmethod
    def validate_ranks(cluster: Cluster | LaunchConfig, ranks: list[int] | None) -> None:
        bad = [r for r in ranks or [] if not 0 <= r < cluster.world_size]
        if bad:
            raise UsageError(f"--ranks {bad} out of range: this group has ranks 0..{cluster.world_size - 1}")

    @line_magic
    def dist(self, line: str) -> Any:
        """`%dist status | restart [--gpus N | --cpus N] | shutdown | where | push NAME... | pull NAME... [--ranks L]`
        `| attach --world-size N [--host H] [--port P] [--key-file F] | export FILE.py | slurm-script [FILE] --nodes N`

        status: state, backend, pids and memory of each rank. restart: fresh ranks (variables
        are lost). shutdown: stop the ranks. where: each rank's current line, stack and recent
        collectives. push: copy kernel variables to the ranks. pull: copy variables from the
        ranks into the kernel as {rank: value} (or the value itself with --ranks N). attach: wait for
        ranks that torchrun starts on other nodes (prints the command). export: the executed cells as a
        torchrun script. slurm-script: an sbatch script that starts those torchrun nodes.
        """
        return run_line(self, line)

    def record_push(self, names: list[str], ranks: list[int] | None) -> None:
        """A push every chosen rank kept (dist_line._push says when): `%dist export` writes its values where it
        came (before, the script had none of them: a cell using a pushed `lr` failed under torchrun)."""
        ns = self.shell.user_ns
        flags = " ".join(names) + (f" --ranks {','.join(map(str, ranks))}" if ranks else "")
        self.history.append(push_record(self._label() or f"cell {len(self.history) + 1}", names,
                                        {n: ns[n] for n in names}, tuple(ranks) if ranks else None, flags))


_PARKED: dict[int, Cluster] = {}  # an unloaded kit's ranks, until the execution that unloaded it ends


def _park(ipython: Any, cluster: Cluster) -> None:
    """Keep an unloading kit's ranks until the running execution ends, then stop them unless a load took them.

    `%reload_ext` calls unload, then load, inside one execution; `%unload_ext` calls unload alone. IPython's
    ExtensionManager holds the same state at both unloads (the extension is in `loaded`), so instead of asking
    who called, unload waits for the load: the same either way, also for `%unload_ext` then `%load_ext` in one cell.
    A script that drives the shell outside any execution (no `exec_result`) has no end to wait for: stop now."""
    if getattr(getattr(ipython, "displayhook", None), "exec_result", None) is None:
        cluster.shutdown()
        return
    _PARKED[id(ipython)] = cluster

    def stop_unless_loaded() -> None:
        ipython.events.unregister("post_execute", stop_unless_loaded)
        left = _PARKED.pop(id(ipython), None)
        if left is not None:
            left.shutdown()

    ipython.events.register("post_execute", stop_unless_loaded)  # fires after every execution, silent ones too


def load(ipython: Any) -> None:
    magics = _INSTANCES.get(id(ipython))
    if magics is None:
        magics = _INSTANCES[id(ipython)] = DistributedMagics(ipython)
    parked = _PARKED.pop(id(ipython), None)
    if parked is not None and parked.state != "stopped":
        magics.cluster = parked
        _emit(-1, "stderr", f"%reload_ext kept the {parked.world_size} running rank(s) and their variables; "
                            f"`%dist restart` starts fresh ones")
    ipython.register_magics(magics)  # re-registering the same instance keeps the running ranks
    prewarm(LaunchConfig())  # the rank template imports torch while the user reads: the first cell starts fast


def unload(ipython: Any) -> None:
    magics = _INSTANCES.pop(id(ipython), None)
    if magics is not None and magics.cluster is not None:
        _park(ipython, magics.cluster)
    table = ipython.magics_manager.magics
    table["cell"].pop("distributed", None)
    table["line"].pop("dist", None)
