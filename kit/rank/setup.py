"""Worker side: importing torch and joining the default process group, kit-style.

Owns the one place where a rank calls `init_process_group` (a FileStore in the private run
directory, a fresh store prefix for every re-creation), the friendly replacement for
tutorial code's own `init_process_group`, and recognising process-group failures.
"""
from __future__ import annotations

import os
import sys
from dataclasses import dataclass
from typing import Any, Callable

__all__ = ["setup_torch", "looks_like_pg_failure", "TorchSetup"]


@dataclass
class TorchSetup:
    """What joining the group produced: the worker keeps it to re-create the group later."""

    init: Callable[[str], None]  # init(prefix): join the default group on a fresh store prefix
    store: Any
    device: Any
    info: dict[str, Any]


def looks_like_pg_failure(e: BaseException) -> bool:
    """Collectives run by DDP's C++ reducer bypass the ledger; recognise their failures here."""
    dist = sys.modules.get("torch.distributed")
    dist_error = getattr(dist, "DistError", None) if dist else None
    if dist_error is not None and isinstance(e, dist_error):
        return True
    text = str(e)
    return isinstance(e, RuntimeError) and any(s in text for s in ("Connection closed by peer", "Timed out waiting",
                                                                   "Application timeout", "gloo"))


def _friendly_init(original: Any, init: Any, backend: str) -> Any:
    """Tutorial scripts start with `dist.init_process_group(...)`; in a kit rank the group
    already exists, and torch would raise "trying to initialize the default process group
    twice". Say so and carry on; after a `destroy_process_group()` re-create the kit's group."""
    calls = [0]

    def init_process_group(*args: Any, **kwargs: Any) -> None:
        dist = sys.modules["torch.distributed"]
        asked = kwargs.get("backend", args[0] if args else None)
        if dist.is_initialized():
            differs = f" (you asked for {asked!r}: this rank runs {backend!r}, see the kit's banner)" \
                if asked and str(asked).split(":")[0] != backend else ""
            print(f"[kit] init_process_group() skipped: the kit already set up the default group "
                  f"(backend {backend!r}, rank {dist.get_rank()} of {dist.get_world_size()}){differs}",
                  file=sys.stderr)
            return None
        calls[0] += 1  # every rank calls it in the same order, so the store prefix matches
        init(f"user{calls[0]}")
        return None

    init_process_group.__wrapped__ = original  # type: ignore[attr-defined]
    init_process_group.__doc__ = original.__doc__
    return init_process_group


def setup_torch(rank: int, world_size: int, env: dict[str, str]) -> TorchSetup:
    """Import torch, set threads and device, join the default group ("pg0") and make tutorial
    code's own `init_process_group` friendly. The caller installs the ledger and the namespace."""
    import datetime

    import torch
    import torch.distributed as dist

    torch.set_num_threads(int(env["KIT_THREADS"]))
    backend, gpu = env["KIT_BACKEND"], env.get("KIT_GPU_ID", "")
    if backend == "nccl":
        torch.cuda.set_device(int(gpu))
        device = torch.device("cuda", int(gpu))
    else:
        device = torch.device("cpu")
    store = dist.FileStore(os.path.join(env["KIT_RUN_DIR"], "store"), world_size)
    timeout = datetime.timedelta(seconds=float(env["KIT_PG_TIMEOUT_S"]))

    original_init = dist.init_process_group  # before _friendly_init replaces the module's name

    def init(prefix: str) -> None:
        original_init(backend, store=dist.PrefixStore(prefix, store), rank=rank, world_size=world_size,
                      timeout=timeout)

    init("pg0")
    dist.init_process_group = _friendly_init(original_init, init, backend)
    info = {"torch": str(torch.__version__), "cuda_count": torch.cuda.device_count() if backend == "nccl" else 0,
            "device": str(device), "backend": backend, "threads": torch.get_num_threads()}
    return TorchSetup(init=init, store=store, device=device, info=info)
