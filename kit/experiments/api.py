"""Kernel side: `run(config)` one experiment on the kit's ranks, `sweep` a knob over values.

No torch here: the kernel stays light and CUDA-free. Ranks are persistent and reused while
the world size stays the same; a different world size gets fresh processes.
"""
from __future__ import annotations

import atexit
import threading
from typing import Any, Callable, Iterable

from kit.experiments.config import ExperimentConfig
from kit.experiments.choices import ONE_PROCESS
from kit.experiments.records import append_jsonl, combine_repeats, merge
from kit.experiments.run_record import INTERRUPTED_NOTE, RunRecord
from kit.experiments.stats import interleave
from kit.keywords import names_unknown_keywords

__all__ = ["run", "sweep", "shutdown", "ranks_needed", "cluster_for", "check_backend_for", "interrupted"]

_owned: Any = None  # the Cluster this module started (reused across runs)
_lock = threading.Lock()


def ranks_needed(cfg: ExperimentConfig) -> int:
    """single and dp run in one process (dp drives its replicas from threads)."""
    return 1 if cfg.strategy in ONE_PROCESS else cfg.world_size


def check_backend_for(cfg: ExperimentConfig, cluster: Any, device: str) -> None:
    """Refuse a config the cluster's backend cannot run (e.g. bf16 compression needs NCCL) before
    any rank starts work; the rank checks again."""
    from kit.experiments.config_rules import check_backend
    from kit.experiments.config import ExperimentConfigError
    backend = getattr(cluster, "backend", "gloo") if cluster is not None else ("nccl" if device == "gpu" else "gloo")
    check_backend(cfg, backend, ExperimentConfigError)


def _cluster_for(cfg: ExperimentConfig, cluster: Any, device: str) -> Any:
    """`cluster_for` a config: its backend checked first, and a size mismatch named by its label."""
    n = ranks_needed(cfg)
    check_backend_for(cfg, cluster, device)
    if cluster is not None and n > 1 and cluster.world_size != n:
        raise ValueError(f"{cfg.label()!r} needs world_size={n} but the cluster has {cluster.world_size} "
                         f"ranks; pass config.replace(world_size={cluster.world_size}) or another cluster")
    return cluster_for(n, cluster, device)


def cluster_for(world_size: int, cluster: Any = None, device: str = "cpu") -> Any:
    """The ranks a run or a benchmark uses: `cluster` when given (it must have `world_size` ranks),
    else the ranks `%%distributed` started when they are ready and of that size, else ranks this
    module starts and keeps for the next call (`shutdown()` stops them; another size restarts them).

    `world_size=1` is served by any cluster: one-process work runs on its rank 0.
    """
    global _owned
    if isinstance(world_size, bool) or not isinstance(world_size, int) or world_size < 1:
        raise ValueError(f"world_size={world_size!r}: give the number of ranks, an int >= 1")
    n = world_size
    if cluster is not None:
        if n > 1 and cluster.world_size != n:
            raise ValueError(f"world_size={n} but the cluster has {cluster.world_size} ranks; "
                             f"pass world_size={cluster.world_size} or a cluster of {n} ranks")
        return cluster
    import kit

    shared = kit.current_cluster()  # the ranks %%distributed started: reuse them (Binder has 1-2 GB)
    if shared is not None and shared.state == "ready" and (n == 1 or shared.world_size == n):
        return shared
    from kit.engine.cluster import Cluster
    from kit.config import LaunchConfig
    with _lock:
        if _owned is not None and (_owned.world_size != n or _owned.state != "ready"):
            _owned.shutdown()  # a different world size needs fresh processes
            _owned = None
        if _owned is None:
            # Measured runs: no collective pre-flight (it would add a round trip per collective).
            _owned = Cluster(LaunchConfig(world_size=n, device=device, check_collectives=False)).start()
        return _owned


def shutdown() -> None:
    """Stop the ranks `run`/`sweep` started (they are reused until then)."""
    global _owned
    with _lock:
        if _owned is not None:
            _owned.shutdown()
            _owned = None


atexit.register(shutdown)


@names_unknown_keywords  # run(cfg, repeat=2): 'did you mean repeats=?', not Python's bare TypeError
def run(config: ExperimentConfig | dict[str, Any], cluster: Any = None, results_path: str | None = None,
        progress: Callable[[int, int], None] | None = None, stop: threading.Event | None = None,
        device: str = "cpu", repeats: int = 1, profile: str | None = None) -> dict[str, Any]:
    """Run one experiment and return its record (appended to `results_path` as soon as it is done): a dict
    (run_record.RunRecord) that a notebook shows as a short summary; print(record) shows all of it.

    `profile`: a folder (created; its parent must exist); torch.profiler runs on every rank during the
    (first repeat's) steps, and the folder gets one merged trace of all ranks, all_ranks.json (open it in
    ui.perfetto.dev), and torch.profiler's own file per rank in ranks/ (TensorBoard's profiler plugin,
    HolisticTraceAnalysis); kit/engine/trace.py. The profiler slows the steps: the record says so in its notes.
    `repeats`: run the configuration that many times, each with a fresh model, and return one
    record keeping every repeat (records.combine_repeats); one repeat alone says nothing about
    run-to-run noise, which is what a comparison must beat.
    `progress(k, n)`: k of n *measured* steps done (warm-up reports 0), over all repeats.
    `stop`: setting the event ends the run at the next step boundary (all ranks agree, so no
    collective is left hanging) and starts no later repeat; the record then has `complete: False`
    and says it stopped. The kernel tells the ranks on their control channel (Cluster.call's `stop`),
    so ranks attached from other hosts (`%dist attach`) stop as local ones do; between steps they
    MAX-reduce the flag, so a rank whose message is still on its way stops at the same step.
    """
    cfg = config if isinstance(config, ExperimentConfig) else ExperimentConfig.from_dict(dict(config))
    _check_repeats(repeats)
    if profile is not None:
        from kit.engine.trace import check_folder
        profile = check_folder(profile)  # refused before any rank starts
    c = _cluster_for(cfg, cluster, device)
    total = cfg.steps * repeats
    if progress:
        progress(0, total)
    recs: list[dict[str, Any]] = []
    for i in range(repeats):
        if stop is not None and stop.is_set() and recs:
            break

        def measured(step: int, _n: int, _done: int = i * cfg.steps) -> None:
            if progress:  # the ranks count warm-up and the memory probe too; the learner sees measured steps
                progress(_done + min(cfg.steps, max(0, step - cfg.warmup_steps)), total)
        try:
            recs.append(_run_once(cfg, c, measured if progress else None, stop, profile if i == 0 else None))
        except BaseException as e:  # the interrupt after a repeat finished: those repeats are returned, as sweep does
            if not interrupted(e) or not recs:
                raise
            print(f"[kit] run interrupted: returning the {len(recs)} of {repeats} repeat(s) that finished (the one "
                  "in progress was dropped). Every rank is kept; the cell goes on with them, and a Run All with the "
                  "cells after it.")
            break
    record = RunRecord(combine_repeats(recs))  # a dict that a notebook shows as a short summary
    if len(recs) < repeats and record.get("complete", True):
        record["complete"] = False
        record["notes"].append(INTERRUPTED_NOTE.format(done=len(recs), asked=repeats))
    if results_path:
        append_jsonl(results_path, record)
    if progress and record.get("complete", True):
        progress(total, total)
    return record


def interrupted(e: BaseException) -> bool:
    """The user's interrupt (the notebook's stop button, Ctrl-C), in the kernel or forwarded to every rank of
    the run in progress (CellError "rank 1 raised KeyboardInterrupt"), as opposed to a failure. A request the
    interrupt ended counts even where a rank raised something else: a DDP run's rank left waiting in the
    gradient all-reduce is released by the kit with gloo's error (watch_checks.release_after_interrupt),
    and its ranks and group are kept. A rank that died is a failure: its ranks are not all kept."""
    from kit.errors import CellError
    if isinstance(e, KeyboardInterrupt):
        return True
    if not isinstance(e, CellError) or not e.failures or any(f.died for f in e.failures.values()):
        return False
    return e.interrupted or all(f.ename == "KeyboardInterrupt" for f in e.failures.values())


def _check_repeats(repeats: Any) -> None:
    if isinstance(repeats, bool) or not isinstance(repeats, int) or repeats < 1:
        raise ValueError(f"repeats={repeats!r} must be an integer >= 1 (try 3 or 5)")


def _run_once(cfg: ExperimentConfig, c: Any, progress: Callable[[int, int], None] | None,
              stop: threading.Event | None, profile: str | None = None) -> dict[str, Any]:
    on_progress = (lambda rank, step, total: progress(step, total)) if progress else None
    # `stop`: the engine sends it to the ranks running this call (a STOP_REQUEST frame with its id); with
    # `stoppable` the ranks look for it between steps (runner._agree_to_stop), else they never look.
    per_rank = c.call("kit.experiments.runner:run_rank", cfg.to_dict(), stop is not None, on_progress=on_progress,
                      stop=stop, **({"profile": True} if profile else {}))
    profiles = {r: p.pop("profile") for r, p in per_rank.items() if p.get("profile")}
    record = merge(per_rank, cfg)
    if profile:
        from kit.engine.trace import MERGED_NAME, RANKS_DIR, write_profiles
        record["profile"] = write_profiles(profiles, profile, title=cfg.label())["otherData"]["files"]["folder"]
        record["notes"].append(f"profiled: torch.profiler ran during these steps, so they include its overhead "
                               f"(docs/measuring.md); traces in {record['profile']}: {MERGED_NAME} (every rank, "
                               f"ui.perfetto.dev), {RANKS_DIR}/ (one file per rank: TensorBoard, HTA)")
    record["env"]["world_size_launched"] = c.world_size
    return record


@names_unknown_keywords
def sweep(base_config: ExperimentConfig | dict[str, Any], knob: str, values: list[Any], cluster: Any = None,
          results_path: str | None = None, progress: Callable[[int, int], None] | None = None,
          stop: threading.Event | None = None, device: str = "cpu", repeats: int = 1) -> list[dict[str, Any]]:
    """One record per value of `knob`; every config is validated before the first run starts.

    `repeats` > 1: the points run round-robin (1 2 3, 2 3 1, 3 1 2, ...), not point after
    point, so a drift in machine load spreads over every point instead of posing as a trend
    along the knob; each point's repeats are combined into one record (records.combine_repeats),
    appended to `results_path` when the sweep ends (one repeat: each record as its run ends).
    `progress(k, n)`: k of n runs done.
    """
    base = base_config if isinstance(base_config, ExperimentConfig) else ExperimentConfig.from_dict(dict(base_config))
    if isinstance(values, (str, bytes)) or not isinstance(values, Iterable):  # was: 'int' object is not iterable
        raise TypeError(f"values={values!r}: give the values of {knob} as a list, e.g. sweep(base, {knob!r}, "
                        f"[{values!r}])")
    values = list(values)
    if not values:  # was: ZeroDivisionError from the run order
        raise ValueError(f"values=[]: give at least one value of {knob} to run, e.g. sweep(base, {knob!r}, "
                         f"[{getattr(base, knob, 1)!r}])")
    cfgs = [base.replace(**{knob: v}) for v in values]  # fail fast on a bad value
    _check_repeats(repeats)
    order = interleave(len(cfgs), repeats)
    got: dict[int, list[dict[str, Any]]] = {}
    for k, i in enumerate(order):
        if progress:
            progress(k, len(order))
        if stop is not None and stop.is_set():
            break
        # One repeat: append each record as it finishes (a crash loses no finished run).
        try:
            rec = run(cfgs[i], cluster=cluster, stop=stop, device=device,
                      results_path=results_path if repeats == 1 else None)
        except BaseException as e:  # the interrupt ends the sweep as `stop` does: what finished is returned
            if not interrupted(e) or not got:
                raise
            _say_interrupted(knob, values, got, repeats, results_path)
            break
        got.setdefault(i, []).append(rec)
    out = [RunRecord(combine_repeats(got[i])) for i in range(len(cfgs)) if i in got]  # shown short, as run's
    if results_path and repeats > 1:
        for rec in out:
            append_jsonl(results_path, rec)
    if progress:
        progress(sum(len(v) for v in got.values()), len(order))
    return out


def _say_interrupted(knob: str, values: list[Any], got: dict[int, list[dict[str, Any]]], repeats: int,
                     results_path: str | None) -> None:
    """One line instead of the interrupted run's rank traceback: what the returned list holds."""
    kept = [f"{values[i]!r}" + (f" ({len(got[i])} of {repeats} repeats)" if len(got[i]) < repeats else "")
            for i in sorted(got)]
    missing = [f"{v!r}" for i, v in enumerate(values) if i not in got]
    print(f"[kit] sweep interrupted: returning the {len(got)} of {len(values)} point(s) that finished, {knob}="
          f"{', '.join(kept)}" + (f"; not run: {', '.join(missing)}" if missing else "")
          + "; the run in progress was dropped" + (f"; {results_path} has them" if results_path else "")
          + ". Every rank is kept; the cell goes on with them, and a Run All with the cells after it.")
