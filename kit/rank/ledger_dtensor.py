"""Worker side: DTensor's collectives in the ledger, recorded only (no pre-flight, nothing changed).

DTensor never calls `dist.*`: it redistributes through torch's functional collectives
(`torch.distributed._functional_collectives`: `all_reduce`, `all_gather_single`, `reduce_scatter_single`,
`all_to_all_single`, ...), which return at once with an `AsyncCollectiveTensor` and wait on first use
(`wait_tensor`); and `distribute_tensor` (so `parallelize_module`) scatters and broadcasts through c10d's
`scatter`/`broadcast`, imported by name into `torch.distributed.tensor._collective_utils`. The ledger's
`dist.*` wrappers see none of them. Here each is wrapped where torch's own code looks it up (the
module's attribute, read at every call), as those modules are imported: the wrapper notes the call in
the ledger and calls torch's function with the same arguments. A functional collective's entry stays
open until its result is waited for, so `%dist where` says "blocked inside all_gather_single(...)" while
a rank waits there.

Why not torch's hooks: `CommDebugMode` (torch.distributed.tensor.debug) is a TorchDispatchMode, which
costs every op of the cell a Python round trip and changes what runs under it; c10d's
`_register_on_completion_hook` exists for NCCL only and reports ends, not what a rank waits in; the
flight recorder needs an environment variable at group creation and has no cell line. Under
torch.compile or FX tracing the wrappers step aside (`is_compiling`, `_are_we_tracing`), so a compiled
graph is traced as torch's own functions and has nothing of the kit in it.
"""
from __future__ import annotations

import functools
import importlib.abc
import importlib.machinery
import inspect
import sys
import threading
import time
from types import ModuleType
from typing import Any, Callable

from kit.rank.ledger import Entry, Ledger, argument_binder, cell_line, describe_error, observers, tensor_spec

__all__ = ["install_dtensor", "FUNCTIONAL", "DTENSOR_C10D"]

FUNCOL = "torch.distributed._functional_collectives"
# The functional collectives that call torch.ops._c10d_functional themselves; the others (all_gather_tensor,
# permute_tensor, the *_inplace forms dynamo rewrites to) call one of these, so each collective is one entry.
FUNCTIONAL = ("all_reduce", "all_gather_single", "reduce_scatter_single", "all_to_all_single", "broadcast",
              "all_reduce_coalesced", "all_gather_single_coalesced", "reduce_scatter_single_coalesced")
DTENSOR_C10D = ("scatter", "broadcast")  # distribute_tensor's, by name in _collective_utils
COLLECTIVE_UTILS = "torch.distributed.tensor._collective_utils"
_SCALARS = ("reduceOp", "gather_dim", "scatter_dim", "src")
_PENDING_MAX = 256  # results issued and never waited for (dropped by the cell) are forgotten beyond this


def _group_label(group: Any) -> str:
    """The group as the cell named it: a mesh dimension by its name, a group by its size."""
    if isinstance(group, tuple) and len(group) == 2:
        mesh, dim = group
        names = getattr(mesh, "mesh_dim_names", None)
        return f"mesh dim {names[dim]!r}" if names else f"mesh dim {dim}"
    names = getattr(group, "mesh_dim_names", None)
    if names is not None or type(group).__name__ == "DeviceMesh":
        return f"mesh dim {names[0]!r}" if names else "mesh"
    if isinstance(group, (list, tuple)):
        return f"ranks {list(group)}"
    if isinstance(group, str):
        return f"group {group!r}"
    desc = getattr(group, "group_desc", "")  # DeviceMesh describes its dimensions' groups "mesh_<name>"
    if desc == "default_pg":  # a 1-D mesh over every rank uses the default group itself
        return "WORLD"
    if isinstance(desc, str) and desc.startswith("mesh_"):
        return f"mesh dim {desc[5:]!r}"
    size = getattr(group, "size", None)
    return f"group of {size()} ranks" if callable(size) else type(group).__name__


def _storage_key(t: Any) -> int | None:
    elem = getattr(t, "elem", None)  # an AsyncCollectiveTensor: the collective's output, waited on later
    if elem is None:
        return None
    try:
        return elem.untyped_storage().data_ptr()
    except (RuntimeError, AttributeError):
        return None


class _Recorder:
    """The wrappers' shared state: the ledger, and the functional collectives issued but not yet waited for."""

    def __init__(self, ledger: Ledger):
        self.ledger = ledger
        self.pending: dict[int, Entry] = {}
        self.depth = 0  # a recorded call inside another (all_gather_tensor -> all_gather_single): recorded once
        self.torch = sys.modules["torch"]
        # the thread that runs the cells; another (CUDA's autograd threads, a user's) passes through: the
        # ledger's `current` is what the main thread waits in
        self.main_ident = threading.get_ident()

    def stepping_aside(self, tracing: Callable[[], bool] | None = None) -> bool:
        # is_compiling first: dynamo traces it as a constant and never reaches what it cannot trace (get_ident)
        return (self.torch.compiler.is_compiling() or self.depth > 0 or threading.get_ident() != self.main_ident
                or (tracing is not None and tracing()))

    def begin(self, name: str, bound: dict[str, Any], tensor_arg: str, group_arg: str) -> Entry:
        parts = [s for s in (tensor_spec(bound.get(tensor_arg)),) if s]
        parts += [f"{'op' if k == 'reduceOp' else k}={str(bound[k]).lower() if k == 'reduceOp' else bound[k]}"
                  for k in _SCALARS if bound.get(k) is not None]
        if bound.get(group_arg) is not None:
            parts.append(f"group={_group_label(bound[group_arg])}")
        label, line = cell_line()
        ledger = self.ledger
        entry = Entry(0, name, f"{name}({', '.join(parts)})", line, cell=label or ledger.cell, request=ledger.cell,
                      recorded_only=True)
        ledger.entries.append(entry)
        return entry

    def failed(self, entry: Entry, e: BaseException) -> None:
        entry.error = describe_error(e)
        # torch checks arguments (TypeError, ValueError, the functional collectives' asserts) before sending
        self.ledger.suspect = self.ledger.suspect or not isinstance(e, (TypeError, ValueError, AssertionError))

    def end(self, entry: Entry) -> None:
        entry.ended_s = time.monotonic()
        for observe in observers:  # empty unless a profile runs (kit/rank/profile.py)
            observe(entry)

    def call(self, entry: Entry, fn: Callable[..., Any], args: tuple, kwargs: dict, waits_later: bool) -> Any:
        ledger, before = self.ledger, self.ledger.current
        ledger.current = entry
        self.depth += 1
        try:
            out = fn(*args, **kwargs)
        except BaseException as e:
            self.failed(entry, e)
            self.end(entry)
            raise
        finally:
            self.depth -= 1
            ledger.current = before
        keys = [k for t in (out if isinstance(out, list) else [out]) if (k := _storage_key(t)) is not None] \
            if waits_later else []
        if not keys:
            self.end(entry)
            return out
        entry.phase = "issued"
        for key in keys:
            self.pending[key] = entry
        while len(self.pending) > _PENDING_MAX:
            self.pending.pop(next(iter(self.pending)))
        return out

    def wait(self, fn: Callable[..., Any], tensor: Any) -> Any:
        try:
            key = tensor.untyped_storage().data_ptr() if self.pending else None
        except (RuntimeError, AttributeError):
            key = None
        entry = self.pending.pop(key, None) if key is not None else None
        if entry is None:
            return fn(tensor)
        ledger, before = self.ledger, self.ledger.current
        ledger.current, entry.phase = entry, "inside"
        try:
            return fn(tensor)
        except BaseException as e:
            self.failed(entry, e)
            raise
        finally:
            ledger.current = before
            if not any(v is entry for v in self.pending.values()):  # a coalesced call's last result
                self.end(entry)


def _wrap(recorder: _Recorder, name: str, fn: Callable[..., Any], waits_later: bool,
          tracing: Callable[[], bool] | None) -> Callable[..., Any]:
    params = list(inspect.signature(fn).parameters)
    bind = argument_binder(fn)  # the c10d ledger's binding: cheap on the calls that matter
    wanted = [k for k in (params[0], *_SCALARS, "group") if k in params]  # the arguments the entry shows
    tensor_arg, group_arg = params[0], "group" if "group" in params else ""

    def wrapper(*args: Any, **kwargs: Any) -> Any:
        if recorder.stepping_aside(tracing):
            return fn(*args, **kwargs)
        try:
            every = bind(args, kwargs)
        except TypeError:  # a wrong call: torch raises its own message inside the entry, which records it
            every = {**dict(zip(params, args)), **kwargs}
        bound = {k: every.get(k) for k in wanted}
        return recorder.call(recorder.begin(name, bound, tensor_arg, group_arg), fn, args, kwargs, waits_later)

    functools.update_wrapper(wrapper, fn)
    wrapper._kit_ledger = True  # type: ignore[attr-defined]
    return wrapper


def _wrap_wait(recorder: _Recorder, fn: Callable[..., Any]) -> Callable[..., Any]:
    def wait_tensor(tensor: Any) -> Any:
        # an AsyncCollectiveTensor comes back here with its output (`elem`), where the entry is found
        if recorder.torch.compiler.is_compiling() or not recorder.pending or hasattr(tensor, "elem") \
                or threading.get_ident() != recorder.main_ident:
            return fn(tensor)
        return recorder.wait(fn, tensor)

    functools.update_wrapper(wait_tensor, fn)
    wait_tensor._kit_ledger = True  # type: ignore[attr-defined]
    return wait_tensor


def _patch(module: ModuleType, recorder: _Recorder) -> None:
    def swap(name: str, make: Callable[[Callable[..., Any]], Callable[..., Any]]) -> None:
        fn = getattr(module, name, None)
        if callable(fn) and not getattr(fn, "_kit_ledger", False):
            setattr(module, name, make(fn))

    if module.__name__ == FUNCOL:
        tracing = getattr(module, "_are_we_tracing", None)
        for name in FUNCTIONAL:
            swap(name, lambda fn, name=name: _wrap(recorder, name, fn, True, tracing))
        swap("wait_tensor", lambda fn: _wrap_wait(recorder, fn))
    else:
        for name in DTENSOR_C10D:
            swap(name, lambda fn, name=name: _wrap(recorder, name, fn, False, None))


class _AfterImport(importlib.abc.MetaPathFinder):
    """Runs `patch(module)` right after torch imports one of `names` (a post-import hook: Python has none
    built in). Finds nothing itself: it asks the path finder for the real spec and, for those names only,
    runs the module's own loader, then the patch, then puts the loader back in the module's spec."""

    def __init__(self, names: tuple[str, ...], patch: Callable[[ModuleType], None]):
        self.names, self.patch = names, patch

    def find_spec(self, fullname: str, path: Any, target: Any = None) -> Any:
        if fullname not in self.names:
            return None
        spec = importlib.machinery.PathFinder.find_spec(fullname, path)
        if spec is None or spec.loader is None or not hasattr(spec.loader, "exec_module"):
            return None
        spec.loader = _Then(spec.loader, self.patch)
        return spec


class _Then(importlib.abc.Loader):
    def __init__(self, loader: Any, patch: Callable[[ModuleType], None]):
        self.loader, self.patch = loader, patch

    def create_module(self, spec: Any) -> Any:
        return self.loader.create_module(spec)

    def exec_module(self, module: ModuleType) -> None:
        module.__loader__ = module.__spec__.loader = self.loader  # as if the path finder had found it
        self.loader.exec_module(module)
        self.patch(module)


def install_dtensor(ledger: Ledger) -> None:
    """Record DTensor's and the functional collectives in `ledger`: now for the modules torch already
    imported, else as soon as it imports them (the cell that first imports DTensor is recorded too)."""
    recorder = _Recorder(ledger)
    names = (FUNCOL, COLLECTIVE_UTILS)
    patch = functools.partial(_patch, recorder=recorder)
    for name in names:
        if name in sys.modules:
            patch(sys.modules[name])
    if not any(isinstance(f, _AfterImport) for f in sys.meta_path):
        sys.meta_path.insert(0, _AfterImport(names, lambda module: patch(module)))
