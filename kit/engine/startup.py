"""Kernel side: bringing a Cluster's ranks up: where they run (local placement, or torchrun's nodes),
the notes about it, opening the ranks and their IO thread, then waiting until every rank is ready.

`Cluster.start` checks its state, calls `place_locally` for local ranks, then `open_ranks`, which returns
the ranks' running state (engine/running.py); on any failure or interrupt on the way nothing is left running.
A start whose rank template dies under it (its forked ranks die with it) starts over with fresh interpreters,
saying so as every other template fallback does.
"""
from __future__ import annotations

import os
import secrets
import time
from typing import Iterator

from kit.config import LaunchConfig
from kit.cpus import usable_cpus
from kit.engine.devices import Placement, place
from kit.engine.launcher import fallback_note
from kit.engine.run_dirs import make_run_dir, reap_stale, runtime_notes, unregister
from kit.engine.local import LocalRanks
from kit.engine.output import print_line
from kit.engine.ready import wait_ready
from kit.engine.remote import RemoteRanks
from kit.engine.running import Running
from kit.engine.template_process import TemplateLost
from kit.errors import WorkerStartError

__all__ = ["place_locally", "open_ranks"]


def place_locally(config: LaunchConfig) -> tuple[Placement, list[int]]:
    """Local ranks: the devices (raises ConfigError under --strict), a note when ranks outnumber the
    cores, and the stale workers of a dead kernel reaped (their pids returned)."""
    placement = place(config)
    cores = usable_cpus()  # affinity and the cgroup quota, not the host's cores
    world = config.world_size
    if placement.backend == "gloo" and world > cores:
        # stdout: information, not an error (a lesson that needs 4 ranks on 2 cores shows it too)
        print_line(-1, "stdout", f"{world} ranks on {cores} core(s): the ranks share the cores, so start-up "
                                 f"and every step run slower; expected where a lesson asks for {world} ranks. "
                                 f"Otherwise {cores} ranks show the same collectives faster (--cpus {cores} in a "
                                 f"%%distributed cell, world_size={cores} in a config).")
    return placement, reap_stale()


def open_ranks(config: LaunchConfig, placement: Placement | None, ids: Iterator[int]) -> Running:
    """Start the ranks (here when `placement` is given, else through torchrun's nodes) and wait until all
    joined the process group. Anything failing or interrupted on the way leaves nothing running."""
    try:
        return _open_ranks(config, placement, ids)
    except TemplateLost as lost:
        fallback_note(lost.why, print_line)
        return _open_ranks(config.replace(template=False), placement, ids)


def _open_ranks(config: LaunchConfig, placement: Placement | None, ids: Iterator[int]) -> Running:
    run_dir = make_run_dir()
    for text in runtime_notes():
        print_line(-1, "stderr", text)
    marker = f"\x1bKIT{secrets.token_hex(8)}:"
    launcher = LocalRanks(config, placement, run_dir) if placement \
        else RemoteRanks(config, run_dir, os.path.basename(run_dir))
    running: Running | None = None
    try:
        t0 = time.monotonic()
        workers, channels = launcher.open(marker, print_line)
        running = Running(config, launcher, workers, channels, run_dir, marker.encode(), ids)
        running.io.start()
        launcher.welcome(marker)
        budget = config.start_timeout_s  # attached ranks: what is left of it after they came
        if isinstance(launcher, RemoteRanks):
            budget = max(5.0, budget - (time.monotonic() - t0))
        wait_ready(running.io.events, config.world_size, budget, print_line)
        running.joined = True
        return running
    except BaseException as e:
        lost = launcher.template_death() if isinstance(e, WorkerStartError) and isinstance(launcher, LocalRanks) \
            else None
        if running is not None:
            running.stop()
        else:
            launcher.close()
            unregister(run_dir)
        if lost is not None:
            raise TemplateLost(lost) from e
        raise
