"""Kernel side: `run(config)` one experiment on the kit's ranks, `sweep` a knob over values.

No torch here: the kernel stays light and CUDA-free. Ranks are persistent and reused while
the world size stays the same; a different world size gets fresh processes.
"""
from __future__ import annotations

import atexit
import os
import tempfile
import threading
from typing import Any, Callable

from kit.experiments.config import ExperimentConfig
from kit.experiments.records import append_jsonl, merge

__all__ = ["run", "sweep", "shutdown", "ranks_needed"]

_owned: Any = None  # the Cluster this module started (reused across runs)
_lock = threading.Lock()


def ranks_needed(cfg: ExperimentConfig) -> int:
    """single and dp run in one process (dp drives its replicas from threads)."""
    return 1 if cfg.strategy in ("single", "dp") else cfg.world_size


def _cluster_for(cfg: ExperimentConfig, cluster: Any, device: str) -> Any:
    global _owned
    n = ranks_needed(cfg)
    from kit.experiments.beyond_config import check_backend  # refuse before any rank starts work
    from kit.experiments.config import ExperimentConfigError
    backend = getattr(cluster, "backend", "gloo") if cluster is not None else ("nccl" if device == "gpu" else "gloo")
    check_backend(cfg, backend, ExperimentConfigError)  # e.g. bf16 compression needs NCCL; the rank checks again
    if cluster is not None:
        if n > 1 and cluster.world_size != n:
            raise ValueError(f"{cfg.label()!r} needs world_size={n} but the cluster has {cluster.world_size} "
                             f"ranks; pass config.replace(world_size={cluster.world_size}) or another cluster")
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


def run(config: ExperimentConfig | dict[str, Any], cluster: Any = None, results_path: str | None = None,
        progress: Callable[[int, int], None] | None = None, stop: threading.Event | None = None,
        device: str = "cpu") -> dict[str, Any]:
    """Run one experiment and return its record (appended to `results_path` as soon as it is done).

    `stop`: setting the event ends the run at the next step boundary (all ranks agree, so no
    collective is left hanging); the record then says it stopped early.
    """
    cfg = config if isinstance(config, ExperimentConfig) else ExperimentConfig.from_dict(dict(config))
    c = _cluster_for(cfg, cluster, device)
    steps_total = cfg.warmup_steps + cfg.steps + 1  # +1: the untimed memory probe step
    if progress:
        progress(0, steps_total)
    stop_path = None
    watcher = None
    done = threading.Event()
    if stop is not None:
        fd, stop_path = tempfile.mkstemp(prefix="kit-stop-")
        os.close(fd)
        os.unlink(stop_path)  # the file's existence is the signal; ranks poll it between steps

        def watch() -> None:
            while not done.is_set():
                if stop.wait(0.05):
                    open(stop_path, "w").close()
                    return
        watcher = threading.Thread(target=watch, daemon=True)
        watcher.start()
    try:
        on_progress = (lambda rank, step, total: progress(step, total)) if progress else None
        per_rank = c.call("kit.experiments.runner:run_rank", cfg.to_dict(), stop_path, on_progress=on_progress)
    finally:
        done.set()
        if stop_path and os.path.exists(stop_path):
            os.unlink(stop_path)
    record = merge(per_rank, cfg)
    record["env"]["world_size_launched"] = c.world_size
    if results_path:
        append_jsonl(results_path, record)
    if progress:
        progress(steps_total, steps_total)
    return record


def sweep(base_config: ExperimentConfig | dict[str, Any], knob: str, values: list[Any], cluster: Any = None,
          results_path: str | None = None, progress: Callable[[int, int], None] | None = None,
          stop: threading.Event | None = None, device: str = "cpu") -> list[dict[str, Any]]:
    """One run per value of `knob`; every config is validated before the first run starts."""
    base = base_config if isinstance(base_config, ExperimentConfig) else ExperimentConfig.from_dict(dict(base_config))
    cfgs = [base.replace(**{knob: v}) for v in values]  # fail fast on a bad value
    out: list[dict[str, Any]] = []
    for i, cfg in enumerate(cfgs):
        if stop is not None and stop.is_set():
            break
        if progress:
            progress(i, len(cfgs))
        out.append(run(cfg, cluster=cluster, results_path=results_path, stop=stop, device=device))
    if progress:
        progress(len(out), len(cfgs))
    return out
