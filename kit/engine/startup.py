"""Kernel side: bringing a Cluster's ranks up: where they run (local placement, or torchrun's nodes),
the notes about it, opening the ranks and their IO thread, then waiting until every rank is ready.

`Cluster.start` checks its state and calls `open_ranks`; on any failure or interrupt on the way the
Cluster is shut down, so nothing is left running.
"""
from __future__ import annotations

import os
import secrets
import time
from typing import Any

from kit.cpus import usable_cpus
from kit.engine.devices import plan
from kit.engine.io import IOThread
from kit.engine.launcher import make_run_dir, reap_stale, runtime_notes
from kit.engine.local import LocalRanks
from kit.engine.output import print_line
from kit.engine.preflight import Preflight
from kit.engine.ready import wait_ready
from kit.engine.remote import RemoteRanks

__all__ = ["open_ranks"]


def _place_locally(cluster: Any) -> None:
    """Local ranks: the devices (raises ConfigError under --strict), a note when ranks outnumber the
    cores, and the stale workers of a dead kernel reaped."""
    cluster.placement = plan(cluster.config)
    cores = usable_cpus()  # affinity and the cgroup quota, not the host's cores
    world = cluster.world_size
    if cluster.placement.backend == "gloo" and world > cores:
        # stdout: information, not an error (a lesson that needs 4 ranks on 2 cores shows it too)
        print_line(-1, "stdout", f"{world} ranks on {cores} core(s): the ranks share the cores, so start-up "
                                 f"and every step run slower; expected where a lesson asks for {world} ranks. "
                                 f"Otherwise --cpus {cores} shows the same collectives faster.")
    cluster.reaped = reap_stale()


def open_ranks(cluster: Any) -> None:
    """Start the ranks of a stopped `cluster` (kit.engine.cluster.Cluster) and wait until all are ready."""
    if cluster.config.launcher == "local":
        _place_locally(cluster)
    cluster._run_dir = make_run_dir()
    for text in runtime_notes():
        print_line(-1, "stderr", text)
    marker = f"\x1bKIT{secrets.token_hex(8)}:"
    try:  # anything failing or interrupted on the way: leave nothing running
        cluster._ranks_of = LocalRanks(cluster.config, cluster.placement, cluster._run_dir) if cluster.placement \
            else RemoteRanks(cluster.config, cluster._run_dir, os.path.basename(cluster._run_dir))
        t0 = time.monotonic()
        cluster._workers, cluster._channels = cluster._ranks_of.open(marker, print_line)
        cluster._preflight = Preflight(cluster.world_size, cluster._send)
        cluster._io = IOThread(cluster._workers, cluster._channels, marker.encode(), cluster._on_frame)
        cluster._io.start()
        cluster._pg_generation = 0
        cluster._ranks_of.welcome(marker)
        budget = cluster.config.start_timeout_s  # attached ranks: what is left of it after they came
        if isinstance(cluster._ranks_of, RemoteRanks):
            budget = max(5.0, budget - (time.monotonic() - t0))
        wait_ready(cluster._io.events, cluster.world_size, budget, print_line)
    except BaseException:
        cluster.shutdown()
        raise
