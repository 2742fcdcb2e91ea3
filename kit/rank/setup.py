"""Worker side: importing torch and joining the default process group, kit-style.

Owns the one place where a rank calls `init_process_group` (a FileStore in the private run
directory, a fresh store prefix for every re-creation), the friendly replacement for
tutorial code's own `init_process_group`, and recognising process-group failures.
"""
from __future__ import annotations

import datetime
import inspect
import os
import sys
from dataclasses import dataclass
from typing import Any, Callable

__all__ = ["setup_torch", "looks_like_pg_failure", "check_init_args", "TorchSetup",
           "subgroups_time_out_like_the_default"]


@dataclass
class TorchSetup:
    """What joining the group produced: the worker keeps it to re-create the group later."""

    init: Callable[[str], None]  # init(prefix): join the default group on a fresh store prefix
    store: Any
    device: Any
    info: dict[str, Any]


def looks_like_pg_failure(e: BaseException) -> bool:
    """Collectives run by DDP's C++ reducer bypass the ledger; recognise their failures here.

    Only a failed collective may mark the group suspect (a reset costs every DDP model): a store
    or network error (a TCPStore on a port in use, a FileStore wait) is the user's own object
    failing, and the group is fine.
    """
    dist = sys.modules.get("torch.distributed")
    if dist is None:
        return False
    store_errors = tuple(t for t in (getattr(dist, "DistStoreError", None), getattr(dist, "DistNetworkError", None))
                         if isinstance(t, type))
    if store_errors and isinstance(e, store_errors):
        return False
    backend_error = getattr(dist, "DistBackendError", None)
    if isinstance(backend_error, type) and isinstance(e, backend_error):
        return True
    if not isinstance(e, RuntimeError):
        return False
    try:
        text = str(e)
    except Exception:  # a user exception whose __str__ raises is not a gloo failure
        return False
    return any(s in text for s in ("Connection closed by peer", "Connection reset by peer", "Application timeout",
                                   "ProcessGroupGloo", "gloo/transport")) or \
        ("Timed out waiting" in text and "operation" in text)  # gloo: "Timed out waiting 5000ms for recv operation"


def check_init_args(original: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
    """Raise what torch's `init_process_group` would raise for these arguments (same error types,
    torch's own messages), so a cell that runs in the kit also runs under torchrun."""
    torch, dist = sys.modules["torch"], sys.modules["torch.distributed"]
    bound = inspect.signature(original).bind(*args, **kwargs).arguments  # TypeError, as torch
    backend, store, init_method = bound.get("backend"), bound.get("store"), bound.get("init_method")
    timeout, device_id = bound.get("timeout"), bound.get("device_id")
    if store is not None and init_method is not None:
        raise AssertionError("Cannot specify both init_method and store.")
    if store is not None:
        if not bound.get("world_size", -1) > 0:
            raise AssertionError("world_size must be positive if using store")
        if not bound.get("rank", -1) >= 0:
            raise AssertionError("rank must be non-negative if using store")
    if isinstance(device_id, int):
        acc = torch.accelerator.current_accelerator()
        if acc is None:
            raise ValueError("device_id is an int, but no accelerator support is found from the current "
                             "compilation. Please use a different compiled version that supports your accelerator.")
        device_id = torch.device(acc.type, device_id)
    if device_id is not None and (device_id.index is None or device_id.type == "cpu"):  # AttributeError, as torch
        raise ValueError("init_process_group device_id parameter must be an accelerator with an index")
    if backend is not None:
        name = dist.Backend(backend)  # ValueError for a non-string, as torch
        if "," not in name and ":" not in name and name not in dist.Backend.backend_type_map:
            raise AssertionError(f"Unknown backend type {name}")
    if timeout is not None and not isinstance(timeout, datetime.timedelta):
        raise TypeError(f"Expected timeout argument to be of type datetime.timedelta, got {timeout}")


def _friendly_init(original: Any, init: Any, backend: str) -> Any:
    """Tutorial scripts start with `dist.init_process_group(...)`; in a kit rank the group
    already exists, and torch would raise "trying to initialize the default process group
    twice". Say so and carry on; after a `destroy_process_group()` re-create the kit's group."""
    calls = [0]

    def init_process_group(*args: Any, **kwargs: Any) -> None:
        dist = sys.modules["torch.distributed"]
        check_init_args(original, args, kwargs)
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


def subgroups_time_out_like_the_default(timeout: datetime.timedelta) -> None:
    """Every group made later without its own timeout (`new_group`, each DeviceMesh dimension, a
    library's groups) gets the kit's --pg-timeout, not torch's 30-minute (gloo) or 10-minute (NCCL)
    default, so a mistake in tensor-parallel or pipeline code fails when the kit says it will. This is
    torch's own module default, which `%dist export` sets the same way in the script's header, so the
    script under torchrun times out its groups as the cells did."""
    c10d = sys.modules["torch.distributed.distributed_c10d"]
    c10d.default_pg_timeout = timeout
    if c10d.default_pg_nccl_timeout is not None:
        c10d.default_pg_nccl_timeout = timeout


def setup_torch(rank: int, world_size: int, env: dict[str, str]) -> TorchSetup:
    """Import torch, set threads and device, join the default group ("pg0") and make tutorial
    code's own `init_process_group` friendly. The caller installs the ledger and the namespace."""
    import torch
    import torch.distributed as dist

    if env.get("KIT_THREADS"):  # attached ranks keep torchrun's OMP_NUM_THREADS unless the notebook says
        torch.set_num_threads(int(env["KIT_THREADS"]))
    backend, gpu = env["KIT_BACKEND"], env.get("KIT_GPU_ID", "")
    if backend == "auto":  # an attached rank: the node knows its GPUs, the kernel does not
        backend = "nccl" if torch.cuda.is_available() else "gloo"
    if backend == "nccl":
        torch.cuda.set_device(int(gpu))
        device = torch.device("cuda", int(gpu))
    else:
        device = torch.device("cpu")
        # Accelerate takes its CPU path only when told (`accelerate launch --cpu` sets this); without
        # it a plain Accelerator() here trains N independent copies (num_processes == 1).
        os.environ.setdefault("ACCELERATE_USE_CPU", "true")
    timeout = datetime.timedelta(seconds=float(env["KIT_PG_TIMEOUT_S"]))
    if env.get("KIT_RENDEZVOUS") == "env":  # under torchrun: its rendezvous store (MASTER_ADDR/PORT, env://)
        store = next(dist.rendezvous("env://", rank=rank, world_size=world_size, timeout=timeout))[0]
    else:
        store = dist.FileStore(os.path.join(env["KIT_RUN_DIR"], "store"), world_size)

    original_init = dist.init_process_group  # before _friendly_init replaces the module's name

    def init(prefix: str) -> None:
        original_init(backend, store=dist.PrefixStore(prefix, store), rank=rank, world_size=world_size,
                      timeout=timeout)

    init("pg0")
    subgroups_time_out_like_the_default(timeout)
    dist.init_process_group = _friendly_init(original_init, init, backend)
    info = {"torch": str(torch.__version__), "cuda_count": torch.cuda.device_count() if backend == "nccl" else 0,
            "device": str(device), "backend": backend, "threads": torch.get_num_threads()}
    return TorchSetup(init=init, store=store, device=device, info=info)
