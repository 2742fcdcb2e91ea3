"""Worker side: a ledger of the collectives each rank enters, and the pre-flight check.

Every torch.distributed collective called from Python is wrapped: the wrapper records
(op, tensor shapes and dtypes, sequence number in the cell, cell line) in a small ledger
that the hang doctor reads. When checks are on (teaching cells, not measured runs), the
rank first sends that signature to the kernel and waits for the verdict: the kernel
compares the ranks' signatures and answers "go" or names the mismatch, so a mismatched
collective is reported on every rank before any of them blocks inside gloo (where a shape
mismatch would abort the process and an op mismatch would hang until the timeout).
"""
from __future__ import annotations

import collections
import functools
import inspect
import sys
import threading
import time
from dataclasses import dataclass, field
from typing import Any, Callable

from kit.errors import CollectiveMismatchError, cell_label
from kit.messages import PREFLIGHT
from kit.rank.reply import safe_str

# tensor_spec, cell_line and describe_error are how an entry is written, argument_binder how a call's
# arguments are read: ledger_dtensor.py (DTensor's functional collectives) uses them, so both ledgers
# read alike in `%dist where`.
__all__ = ["Ledger", "Entry", "install", "COLLECTIVES", "P2P", "observers", "request_observers", "tensor_spec",
           "cell_line", "describe_error", "argument_binder"]

COLLECTIVES = (
    "all_reduce", "broadcast", "reduce", "all_gather", "all_gather_into_tensor", "reduce_scatter",
    "reduce_scatter_tensor", "all_to_all", "all_to_all_single", "gather", "scatter", "barrier",
    "monitored_barrier", "all_gather_object", "broadcast_object_list", "gather_object", "scatter_object_list",
)
# Ledger only: their peers differ by design. isend/irecv stay torch's own functions: torch checks
# their identity (`P2POp(dist.isend, ...)`, `batch_isend_irecv`, pipelining's schedules).
P2P = ("send", "recv")
_TENSOR_ARGS = ("tensor", "tensor_list", "output_tensor", "input_tensor", "output", "input", "input_list",
                "output_tensor_list", "input_tensor_list", "output_split_sizes", "input_split_sizes")
_SCALAR_ARGS = ("src", "dst", "op", "group_src", "group_dst")
# Called with each finished Entry, and with the label of each request as it begins;
# `--profile` turns collectives and the profiled cell into trace spans this way.
observers: list[Callable[["Entry"], None]] = []
request_observers: list[Callable[[str], None]] = []
# Their shapes and split sizes differ across ranks by design (each rank sends and receives what its
# routing says: uneven splits, a mixture of experts' dispatch): only the dtypes must agree.
_UNEVEN = ("all_to_all", "all_to_all_single")


def _splits(name: str, bound: dict[str, Any], world: int) -> dict[str, list[int]] | None:
    """Elements this rank sends to and expects from each rank in an all_to_all (the pre-flight pairs them:
    rank i's send[j] must be rank j's recv[i]); None when torch itself will refuse the arguments."""
    try:
        if name == "all_to_all":
            return {"send": [int(t.numel()) for t in bound["input_tensor_list"]],
                    "recv": [int(t.numel()) for t in bound["output_tensor_list"]]}
        out = {}
        for key, tensor, sizes in (("send", bound["input"], bound.get("input_split_sizes")),
                                   ("recv", bound["output"], bound.get("output_split_sizes"))):
            rows = int(tensor.shape[0]) if tensor.dim() else 1
            row = int(tensor.numel()) // rows if rows else 0
            if sizes is None or len(sizes) == 0:
                if rows % world:
                    return None
                sizes = [rows // world] * world
            out[key] = [int(n) * row for n in sizes]
        return out if all(len(v) == world for v in out.values()) else None
    except (KeyError, AttributeError, TypeError, ValueError, IndexError):
        return None


@dataclass
class Entry:
    seq: int  # 1-based index among the cell's collectives on the default group; 0 for p2p and subgroups
    op: str
    sig: str
    line: int | None
    started_s: float = field(default_factory=time.monotonic)
    ended_s: float | None = None
    error: str | None = None
    phase: str = "inside"  # or "pre-flight": waiting for the other ranks' signatures; or "issued": a
    # functional collective's call returned and its result was not waited for yet
    cell: str = ""  # the cell the line is in ("In [5]"): where the calling code was defined
    request: str = ""  # the cell being run ("In [7]"); the seq counts collectives within it
    recorded_only: bool = False  # DTensor's and the functional collectives (ledger_dtensor): no pre-flight

    def describe(self) -> str:
        where = f" at line {self.line}" if self.line else ""
        if self.line and self.cell and self.cell != self.request:
            where += f" of {self.cell}"
        if not self.seq:  # send/recv and subgroup collectives: ranks call different numbers of them
            return f"{self.sig}{where} (in {self.request or 'the cell'})"
        return f"{self.sig}{where} (collective #{self.seq} of {self.request or 'the cell'})"

    def state(self, now: float) -> str:
        """One line for the hang doctor: where this rank waits, and for how long."""
        waited = f", for {now - self.started_s:.1f} s"
        if self.phase == "pre-flight":
            return f"waiting at {self.describe()} for the other ranks (pre-flight check){waited}"
        return f"blocked inside {self.describe()}{waited}"


def argument_binder(fn: Callable[..., Any]) -> Callable[[tuple, dict], dict[str, Any]]:
    """`inspect.signature(fn).bind_partial(*args, **kwargs).arguments`, without its cost on the calls that
    matter: positional arguments zipped onto the parameters' names (2.8 us a call became 0.3 us on this
    project's machine). Anything unusual (too many positionals, an unknown or repeated keyword, a
    *args or **kwargs parameter) goes to bind_partial, which raises TypeError where torch would."""
    signature = inspect.signature(fn)
    kinds = [p.kind for p in signature.parameters.values()]
    positional = [n for n, p in signature.parameters.items()
                  if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
    keywords = {n for n, p in signature.parameters.items() if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)}
    if inspect.Parameter.VAR_POSITIONAL in kinds or inspect.Parameter.VAR_KEYWORD in kinds:
        return lambda args, kwargs: signature.bind_partial(*args, **kwargs).arguments

    def bind(args: tuple, kwargs: dict) -> dict[str, Any]:
        if len(args) > len(positional) or any(k not in keywords or k in positional[:len(args)] for k in kwargs):
            return signature.bind_partial(*args, **kwargs).arguments
        bound = dict(zip(positional, args))
        bound.update(kwargs)
        return bound
    return bind


def tensor_spec(x: Any) -> str | None:
    """"float32[4, 8]" for a tensor, "2 x float32[4]" for a list of them, None for anything else."""
    torch = sys.modules["torch"]
    if isinstance(x, torch.Tensor):
        dtype = str(x.dtype).replace("torch.", "")
        return f"{dtype}{list(x.shape)}"
    if isinstance(x, (list, tuple)) and x and all(isinstance(t, torch.Tensor) for t in x):
        return f"{len(x)} x {tensor_spec(x[0])}"
    return None


def cell_line() -> tuple[str, int | None]:
    """(label, line) of the innermost cell frame calling the collective."""
    frame = sys._getframe(2)
    while frame is not None:
        if frame.f_code.co_filename.startswith("<cell"):
            return cell_label(frame.f_code.co_filename), frame.f_lineno
        frame = frame.f_back
    return "", None


class Ledger:
    """Per-rank record of collectives, plus the pre-flight handshake with the kernel."""

    def __init__(self, rank: int):
        self.rank = rank
        self.entries: collections.deque[Entry] = collections.deque(maxlen=64)
        self.current: Entry | None = None  # entered and not yet returned
        self.check = True
        self.request_id: int | None = None
        self.seq = 0
        self.cell = ""
        self.suspect = False  # a collective raised: the group may be poisoned
        self._verdict: dict[str, Any] | None = None
        self._verdict_ready = threading.Event()
        self._waiting_for: tuple[int, int] | None = None

    def begin_request(self, request_id: int, check: bool, cell: str = "") -> None:
        self.request_id, self.check, self.seq, self.cell = request_id, check, 0, cell_label(cell)
        self.suspect = False
        for observe in request_observers:
            observe(self.cell)

    def deliver(self, verdict: dict[str, Any]) -> None:
        """Called from the control thread when the kernel answers a pre-flight."""
        if self._waiting_for == (verdict.get("id"), verdict.get("seq")):
            self._verdict = verdict
            self._verdict_ready.set()

    def _preflight(self, entry: Entry, send_deferred: Callable[[str, Any], None],
                   splits: dict[str, list[int]] | None = None) -> None:
        self._verdict, self._waiting_for = None, (self.request_id, entry.seq)
        self._verdict_ready.clear()
        send_deferred(PREFLIGHT, {"id": self.request_id, "seq": entry.seq, "op": entry.op,
                                    "sig": entry.sig, "line": entry.line, "splits": splits})
        try:
            while not self._verdict_ready.wait(0.05):  # short waits keep Ctrl-C responsive
                pass
        finally:
            self._waiting_for = None
        verdict = self._verdict or {}
        if not verdict.get("ok"):
            raise CollectiveMismatchError(verdict.get("message", "collective mismatch"))

    def wrap(self, name: str, fn: Callable[..., Any], send_deferred: Callable[[str, Any], None]) -> Callable[..., Any]:
        bind = argument_binder(fn)
        params = inspect.signature(fn).parameters
        # only the argument names this function has, in the order a signature string lists them
        tensor_keys = [k for k in _TENSOR_ARGS if k in params]
        scalar_keys = [k for k in _SCALAR_ARGS if k in params]
        dist = sys.modules["torch.distributed"]
        checked = name in COLLECTIVES

        def wrapper(*args: Any, **kwargs: Any) -> Any:
            if not dist.is_initialized():
                return fn(*args, **kwargs)
            try:
                bound = bind(args, kwargs)
            except TypeError:
                return fn(*args, **kwargs)  # let torch produce its own message
            parts = [s for k in tensor_keys if k in bound and (s := tensor_spec(bound[k]))]
            if name in _UNEVEN:
                parts = [p.split("[")[0].split(" x ")[-1] for p in parts if "[" in p]  # dtypes only
            parts += [f"{k}={getattr(bound[k], 'name', bound[k])}" for k in scalar_keys if bound.get(k) is not None]
            group = bound.get("group")
            world = group is None or group is dist.GroupMember.WORLD
            # Only collectives every rank must call take a number: the pre-flight pairs the ranks'
            # calls by it, so a rank that made more sends (or subgroup calls) must not shift it.
            numbered = checked and world
            self.seq += numbered
            label, line = cell_line()
            entry = Entry(self.seq if numbered else 0, name, f"{name}({', '.join(parts)})", line,
                          cell=label or self.cell, request=self.cell)
            self.entries.append(entry)
            self.current = entry
            # One rank has nobody to disagree with: no round trip to the kernel (it cost 0.3 ms a call on
            # an H200 host, docs/gpu.md), so `--gpus 1` issues collectives as fast as plain torch.
            if numbered and self.check and self.request_id is not None and dist.get_world_size() > 1:
                entry.phase = "pre-flight"
                try:
                    self._preflight(entry, send_deferred, _splits(name, bound, dist.get_world_size())
                                    if name in _UNEVEN else None)
                except BaseException as e:
                    entry.error, entry.ended_s, self.current = describe_error(e), time.monotonic(), None
                    raise
                entry.phase = "inside"
            try:
                return fn(*args, **kwargs)
            except BaseException as e:  # an interrupt that lands inside gloo leaves the group unusable too
                entry.error = describe_error(e)
                # torch checks its arguments (TypeError, ValueError) before anything is sent: the group
                # is fine then, and a reset would needlessly cost every DDP model built on it
                self.suspect = self.suspect or not isinstance(e, (TypeError, ValueError))
                raise
            finally:
                entry.ended_s = time.monotonic()
                self.current = None
                for observe in observers:  # empty unless a profile runs (kit/rank/profile.py)
                    observe(entry)

        functools.update_wrapper(wrapper, fn)  # name, qualname, module, doc, __wrapped__ as torch's
        wrapper._kit_ledger = True  # type: ignore[attr-defined]
        return wrapper

    def tail(self, n: int = 8) -> list[str]:
        now = time.monotonic()
        lines = []
        for e in list(self.entries)[-n:]:
            if e.ended_s is None and e.phase == "issued":  # a functional collective's result (ledger_dtensor)
                state = f"issued {now - e.started_s:.1f} s ago, its result not waited for yet"
            elif e.ended_s is None:
                state = f"{e.phase}, for {now - e.started_s:.1f} s"
            elif e.error:
                first = e.error.splitlines()[0] if e.error else ""
                state = "failed: " + (first[:100] + "..." if len(first) > 100 else first)
            else:
                state = f"ok, {(e.ended_s - e.started_s) * 1e3:.1f} ms"
            number = f"#{e.seq} " if e.seq else ""
            lines.append(f"{_place(e)}: {number}{e.sig}: {state}")
        return lines


def _place(e: Entry) -> str:
    """Where an entry's collective was called from, as `%dist where` lists it."""
    if e.line:
        return f"{e.cell or '?'} line {e.line}"
    if e.cell == "<call>":  # a Cluster.call request runs kit code, not a cell: "<call> line ?" said nothing
        return "not from a cell: a function the kernel called (kit.experiments, the lab bench, Cluster.call)"
    return f"{e.cell or '?'} (no cell line)"


def describe_error(e: BaseException) -> str:
    """An entry's error: "TypeName: message" (at most 2000 characters of the message)."""
    return f"{type(e).__name__}: {safe_str(e)[:2000]}"  # safe: a str() that raises must not replace e


def install(ledger: Ledger, send_deferred: Callable[[str, Any], None]) -> None:
    """Replace torch.distributed's Python collectives with ledger-keeping wrappers."""
    dist = sys.modules["torch.distributed"]
    for name in COLLECTIVES + P2P:
        fn = getattr(dist, name, None)
        if fn is not None and not getattr(fn, "_kit_ledger", False):
            setattr(dist, name, ledger.wrap(name, fn, send_deferred))
