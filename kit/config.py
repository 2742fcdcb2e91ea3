"""LaunchConfig: what the user asked for, validated and frozen before anything is spawned."""
from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Literal

from kit.cpus import threads_per_rank
from kit.errors import ConfigError

__all__ = ["LaunchConfig", "DeviceRequest", "MAX_WORLD_SIZE"]

DeviceRequest = Literal["gpu", "cpu"]
Launcher = Literal["local", "torchrun", "attach"]
MAX_WORLD_SIZE = 64  # a notebook machine; more ranks than this is a typo, not a plan


@dataclass(frozen=True)
class LaunchConfig:
    """How to start the ranks.

    Args:
        world_size: number of ranks (processes) to start.
        device: "gpu" (NCCL, one GPU per rank, with a loud CPU fallback when there are
            fewer GPUs) or "cpu" (gloo ranks on CPU).
        strict: with device="gpu", refuse to fall back to CPU ranks.
        pg_timeout_s: torch.distributed collective timeout. torch's default is 30 min for
            gloo; a learner waiting on a mismatched collective should hear about it sooner.
        threads_per_rank: torch intra-op threads per rank; None splits the cores evenly,
            because oversubscribed ranks run a DDP step 1.5-2.8x slower on 2 cores.
        start_timeout_s: how long the ranks may take to import torch and rendezvous.
        check_collectives: compare every world collective across ranks before it runs
            (op, shapes, dtypes), so mismatches are named instead of hanging.
        env: extra environment variables for the workers, as (name, value) pairs.
        launcher: "local" (the kit starts the ranks), "torchrun" (torchrun nodes on this machine whose
            ranks attach: the path real clusters use), "attach" (wait for ranks that you start with
            torchrun on other machines; see Cluster.attach).
        host, port: where the attach listener binds (loopback by default: name an interface's address
            only when other machines must reach it; port 0 picks a free one).
        key_file: the 0600 key file ranks must hold to attach (created when missing).
        template: fork local ranks from a warm rank template (a fresh interpreter that imported torch
            once, never the kernel), so start and restart take a fraction of a second; False starts
            every rank as a fresh interpreter (`--no-template`). Unsafe forks fall back by themselves.
    """

    world_size: int = 2
    device: DeviceRequest = "cpu"
    strict: bool = False
    pg_timeout_s: float = 60.0
    threads_per_rank: int | None = None
    start_timeout_s: float = 120.0
    check_collectives: bool = True
    env: tuple[tuple[str, str], ...] = field(default=())
    launcher: Launcher = "local"
    host: str = "127.0.0.1"
    port: int = 0
    key_file: str | None = None
    template: bool = True

    def __post_init__(self) -> None:
        if isinstance(self.world_size, bool) or not isinstance(self.world_size, int):
            raise ConfigError(f"world_size must be an integer, got {self.world_size!r}")
        if not 1 <= self.world_size <= MAX_WORLD_SIZE:
            raise ConfigError(
                f"world_size={self.world_size} is out of range; use 1 to {MAX_WORLD_SIZE} "
                "(on a 2-core machine, 2 ranks is the sweet spot)"
            )
        if self.device not in ("gpu", "cpu"):
            raise ConfigError(f"device={self.device!r} is not 'gpu' or 'cpu' (use 'gpu' for NCCL ranks, 'cpu' for gloo)")
        if self.strict and self.device != "gpu":
            raise ConfigError("strict=True only applies to device='gpu' (--strict goes with --gpus)")
        for name in ("pg_timeout_s", "start_timeout_s"):
            value = getattr(self, name)
            if not isinstance(value, (int, float)) or not 0.5 <= value <= 86_400:
                raise ConfigError(f"{name}={value!r} must be a number of seconds between 0.5 and 86400")
        t = self.threads_per_rank
        if t is not None and (isinstance(t, bool) or not isinstance(t, int) or t < 1):
            raise ConfigError(f"threads_per_rank={t!r} must be a positive integer or None (auto)")
        for name in ("strict", "check_collectives", "template"):
            if not isinstance(getattr(self, name), bool):
                raise ConfigError(f"{name}={getattr(self, name)!r} must be True or False")
        if not isinstance(self.env, tuple):
            raise ConfigError(f"env={self.env!r} must be a tuple of (name, value) string pairs, "
                              f"e.g. env=(('PYTHONPATH', '/my/dir'),)")
        for pair in self.env:
            if not (isinstance(pair, tuple) and len(pair) == 2 and all(isinstance(s, str) for s in pair)):
                raise ConfigError(f"env entries must be (name, value) string pairs, got {pair!r}")

        if self.launcher not in ("local", "torchrun", "attach"):
            raise ConfigError(f"launcher={self.launcher!r} must be 'local', 'torchrun' or 'attach'")
        if not isinstance(self.host, str) or not self.host:
            raise ConfigError(f"host={self.host!r} must be an address of this machine, e.g. '127.0.0.1'")
        if isinstance(self.port, bool) or not isinstance(self.port, int) or not 0 <= self.port <= 65535:
            raise ConfigError(f"port={self.port!r} must be 0 (any free port) to 65535")
        if self.key_file is not None and (not isinstance(self.key_file, str) or not self.key_file):
            raise ConfigError(f"key_file={self.key_file!r} must be a path, or None (the default key file)")

    @property
    def threads(self) -> int:
        """Threads each rank gets: an explicit OMP_NUM_THREADS, else the CPUs this process may use
        (affinity, cgroup quota) split evenly, at least one (kit.cpus)."""
        if self.threads_per_rank is not None:
            return self.threads_per_rank
        return threads_per_rank(self.world_size)

    def replace(self, **changes: object) -> "LaunchConfig":
        return replace(self, **changes)  # type: ignore[arg-type]
