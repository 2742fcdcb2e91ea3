"""What fits in one frame: the size limit of a message between the kernel and a rank, and the pickling
that keeps to it (a pushed value pickled by value, refused with the reason before any copy when too big
or when the ranks could not rebuild it). kit.protocol signs and carries the bytes made here."""
from __future__ import annotations

import os
import pickle
import types
from typing import Any

__all__ = ["MAX_FRAME_BYTES", "LIMIT_ENV", "frame_limit_bytes", "FrameTooBig", "Parts", "size_hint",
           "pickle_for_ranks"]

MAX_FRAME_BYTES = 1 << 30  # 1 GiB by default: larger messages are refused on the sending side
LIMIT_ENV = "KIT_MAX_FRAME_MIB"  # raises it; read when a channel or a message is made (ranks: at start)


def frame_limit_bytes() -> int:
    """The largest message either end sends or accepts: KIT_MAX_FRAME_MIB (MiB), else 1 GiB."""
    try:
        mib = int(os.environ.get(LIMIT_ENV, ""))
    except ValueError:
        return MAX_FRAME_BYTES
    return mib << 20 if mib > 0 else MAX_FRAME_BYTES


class FrameTooBig(ValueError):
    """A message would pass the limit: raised while it is being built, before it grows past it."""

    def __init__(self, what: str, limit: int):
        self.limit_mib = limit >> 20
        super().__init__(f"{what} passes the {self.limit_mib} MiB limit of one message between the kernel and a "
                         f"rank (raise it with %env {LIMIT_ENV}=<MiB>, then %dist restart)")


class Parts:
    """A write-only file for a Pickler: small writes are gathered, large ones (a pickled value's bytes)
    are kept by reference, never copied; stops with FrameTooBig as soon as the total passes `limit`."""

    def __init__(self, limit: int, what: str):
        self.parts: list[Any] = []
        self.small = bytearray()
        self.size, self.limit, self.what = 0, limit, what

    def write(self, data: Any) -> int:
        n = memoryview(data).nbytes
        self.size += n
        if self.size > self.limit:
            raise FrameTooBig(f"{self.what} ({self.size >> 20} MiB so far)", self.limit)
        if n < 1 << 16:
            self.small += data
        else:
            self.done()
            self.parts.append(data)
        return n

    def done(self) -> list[Any]:
        if self.small:
            self.parts.append(bytes(self.small))
            self.small = bytearray()
        return self.parts


class _RefusingPickler(pickle.Pickler):
    """Notes every function or class pickled by reference to the kernel's `__main__`: a rank's
    `__main__` is its own namespace, so such a reference fails there or, worse, finds a different
    object of the same name that a cell defined."""

    def __init__(self, file: Any) -> None:
        super().__init__(file, protocol=pickle.HIGHEST_PROTOCOL)
        self.from_main: list[str] = []

    def reducer_override(self, obj: Any) -> Any:
        if isinstance(obj, (type, types.FunctionType)) and getattr(obj, "__module__", None) == "__main__":
            self.from_main.append(getattr(obj, "__qualname__", "?"))
        return NotImplemented


def size_hint(value: Any) -> int:
    """Bytes a value's pickle will at least take, known without pickling it: arrays, tensors, bytes,
    and those one level inside a list, tuple or dict (so a refusal comes before any copy)."""
    def own(v: Any) -> int:
        if isinstance(v, (bytes, bytearray, memoryview)):
            return memoryview(v).nbytes
        n = getattr(v, "nbytes", None)  # numpy arrays, torch tensors
        if isinstance(n, int) and getattr(v, "device", None) is not None and str(v.device) == "meta":
            return 0
        return n if isinstance(n, int) and n >= 0 else 0
    inner = value.values() if isinstance(value, dict) else value if isinstance(value, (list, tuple)) else ()
    return own(value) + sum(own(v) for v in inner)


def pickle_for_ranks(name: str, value: Any) -> bytes:
    """Pickle one pushed value in the kernel, by value where possible; raise TypeError naming the
    object (and what to do) when the ranks could not rebuild it, FrameTooBig before any copy when it
    is over the message limit (from its size, or as soon as its pickle passes it)."""
    limit = frame_limit_bytes()
    hint = size_hint(value)
    if hint > limit:
        raise FrameTooBig(f"{name} ({-(-hint >> 20)} MiB)", limit)
    try:
        import cloudpickle  # optional: pickles notebook-defined functions and classes by value
    except ImportError:
        cloudpickle = None
    out = Parts(limit, name)
    pickler: _RefusingPickler | None = None
    try:
        if cloudpickle is not None:
            cloudpickle.dump(value, out, protocol=pickle.HIGHEST_PROTOCOL)
        else:
            pickler = _RefusingPickler(out)
            pickler.dump(value)
    except FrameTooBig:
        raise
    except Exception as e:
        raise TypeError(f"cannot push {name!r}: it cannot be pickled ({type(e).__name__}: {e}). Create it on the "
                        f"ranks instead, in a %%distributed cell") from None
    if pickler is not None and pickler.from_main:
        what = ", ".join(dict.fromkeys(pickler.from_main))
        raise TypeError(f"cannot push {name!r}: it is or uses {what}, defined in the notebook's kernel, which the "
                        f"ranks cannot import. Define it in a %%distributed cell, or put it in a module the ranks "
                        f"can import (installing cloudpickle lets the kit send such functions by value)")
    return b"".join(out.done())  # the one copy: large parts are views of the value's own buffers
