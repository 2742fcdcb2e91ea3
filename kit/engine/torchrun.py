"""Kernel side: `LaunchConfig(launcher="torchrun")` starts torchrun "nodes" on this machine whose ranks
attach to the kernel, so the attach path (the one real clusters use) runs locally and in CI.

Each node is `python -m torch.distributed.run --nnodes N --node-rank i --nproc-per-node 1` with a c10d
rendezvous on 127.0.0.1 and `--max-restarts 0` (a failed rank is reported, not silently restarted).
The agents lead their own sessions and carry the cluster's session marker, so the watchdog kills them
and their ranks when the kernel dies; the ranks also exit when their control connection closes.
"""
from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time

from kit.config import LaunchConfig

__all__ = ["node_command", "launch_nodes", "failed", "stop_nodes"]


def _free_port(host: str) -> int:
    with socket.socket() as s:
        s.bind((host, 0))
        return s.getsockname()[1]


def node_command(node: int, nnodes: int, rdzv: str, run_id: str, attach: str, key_file: str,
                 log_dir: str) -> list[str]:
    """One node's torchrun command line (the key file's path, never the key). `--log-dir`: without it torch
    elastic makes a `torchelastic_*` folder in the temp folder per agent and never removes it; in the run
    directory it goes when the run does."""
    return [sys.executable, "-m", "torch.distributed.run", "--nnodes", str(nnodes), "--node-rank", str(node),
            "--nproc-per-node", "1", "--max-restarts", "0", "--monitor-interval", "0.1", "--log-dir", log_dir,
            "--rdzv-backend", "c10d", "--rdzv-endpoint", rdzv, "--rdzv-id", run_id,
            "--rdzv-conf", f"is_host={1 if node == 0 else 0}", "--local-addr", "127.0.0.1",
            "-m", "kit.rank.worker", "--attach", attach, "--key-file", key_file]


def launch_nodes(config: LaunchConfig, attach: str, key_file: str, run_dir: str,
                 session: str) -> list[subprocess.Popen[bytes]]:
    """Start one torchrun agent per rank on this machine; their logs go to the run directory."""
    rdzv = f"127.0.0.1:{_free_port('127.0.0.1')}"
    env = dict(os.environ)
    env.update({"GLOO_SOCKET_IFNAME": "lo", "NCCL_SOCKET_IFNAME": "lo", "OMP_NUM_THREADS": str(config.threads),
                "MPLBACKEND": "Agg", "PYTHONUNBUFFERED": "1", "KIT_SESSION": session, "LOGLEVEL": "WARNING"})
    env.update(dict(config.env))
    agents: list[subprocess.Popen[bytes]] = []
    try:
        for node in range(config.world_size):
            log = open(os.path.join(run_dir, f"torchrun-node{node}.log"), "wb")  # noqa: SIM115 - the child holds it
            agents.append(subprocess.Popen(
                node_command(node, config.world_size, rdzv, session, attach, key_file,
                             os.path.join(run_dir, "torchelastic")), stdin=subprocess.DEVNULL,
                stdout=log, stderr=subprocess.STDOUT, env=env, start_new_session=True))
            log.close()
    except BaseException:
        stop_nodes(agents, grace_s=0)
        raise
    return agents


def failed(agents: list[subprocess.Popen[bytes]], run_dir: str) -> str | None:
    """Why a node's torchrun ended before its rank attached (with its log's tail), or None."""
    for node, agent in enumerate(agents):
        if agent.poll() is not None:
            try:
                with open(os.path.join(run_dir, f"torchrun-node{node}.log"), errors="replace") as f:
                    tail = "".join(f.readlines()[-15:])
            except OSError:
                tail = ""
            return f"torchrun node {node} exited with code {agent.returncode}:\n{tail}"
    return None


def stop_nodes(agents: list[subprocess.Popen[bytes]], grace_s: float = 5.0) -> None:
    """Wait for the agents to end on their own (their ranks got "shutdown" or lost the kernel), then
    SIGTERM, then SIGKILL their process groups: our own children, by pid."""
    deadline = time.monotonic() + grace_s
    for sig in (None, signal.SIGTERM, signal.SIGKILL):
        for agent in agents:
            if sig is not None and agent.poll() is None:
                try:
                    os.killpg(agent.pid, sig)  # the agent leads its own session: pgid == pid
                except (ProcessLookupError, PermissionError):
                    pass
        for agent in agents:
            try:
                agent.wait(timeout=max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                pass
        if all(a.poll() is not None for a in agents):
            return
        deadline = time.monotonic() + 2.0
