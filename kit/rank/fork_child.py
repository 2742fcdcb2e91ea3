"""What a rank forked from the rank template (kit/rank/template.py) does so that it is indistinguishable
from a fresh interpreter: the session marker and command line that ps, the watchdog and the reaper read
(/proc/PID/environ and cmdline), random generators seeded from the OS, its share of BLAS threads, and the
library pages the template's import of torch touched mapped again (a fork copies the page tables of
anonymous memory only). Runs in the forked child, before `kit.rank.worker.main`."""
from __future__ import annotations

import ctypes
import os
import re
import sys

from kit.protocol import SESSION_SLOT

__all__ = ["PLACEHOLDER", "find_entry", "overwrite", "become_rank_process", "reseed_like_a_fresh_interpreter",
           "set_blas_threads", "resident_file_pages", "map_like_the_template"]


def find_entry(which: str, old: bytes) -> int:
    """Address of the entry `old` in this process's original argv or environment block: what
    /proc/PID/cmdline and /proc/PID/environ show (ps, the watchdog and the stale-rank reaper read them)."""
    with open(f"/proc/self/{which}", "rb") as f:
        block = f.read()
    with open("/proc/self/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()  # index = field number - 3
    start = int(fields[45 if which == "cmdline" else 47])  # arg_start (field 48) or env_start (field 50)
    at = 0 if block.startswith(old + b"\0") else block.find(b"\0" + old + b"\0") + 1
    if at <= 0 and not block.startswith(old + b"\0"):
        raise OSError(f"{old[:20]!r}... is not in /proc/self/{which}")
    return start + at


def overwrite(which: str, old: bytes, new: bytes) -> None:
    """Replace an entry in place (a fork cannot exec a new argv or environment), padded with NULs."""
    if len(new) > len(old):
        raise OSError(f"{new!r} is longer than the {len(old)} bytes it replaces")
    where = find_entry(which, old)
    with open("/proc/self/mem", "r+b", buffering=0) as mem:
        mem.seek(where)
        mem.write(new + b"\0" * (len(old) - len(new)))


PLACEHOLDER = b"KIT_SESSION=" + b"?" * SESSION_SLOT


def become_rank_process(session: str) -> None:
    """Carry the cluster's `KIT_SESSION=<session>` in /proc/PID/environ like a fresh worker (the watchdog
    and a later kernel's reaper look for it), and show up in ps as `python -m kit.rank.worker`."""
    overwrite("environ", PLACEHOLDER, b"KIT_SESSION=" + session.encode())
    overwrite("cmdline", b"kit.rank.template", b"kit.rank.worker")


def reseed_like_a_fresh_interpreter() -> None:
    """A fork copies the template's random generators, so every rank (and every restart) would draw the
    same numbers. A fresh interpreter seeds each from the OS when it is created: torch's CPU generator
    at import, Python's `random` at import (CPython also re-seeds it after a fork), numpy's global
    generator at its import. Do the same here. CUDA's generators need nothing: the template never
    initialised CUDA, so a rank creates them itself, seeded as in a fresh interpreter."""
    import random

    random.seed()  # from os.urandom, as at import
    torch = sys.modules.get("torch")
    if torch is not None:
        torch.default_generator.seed()  # a non-deterministic seed, as the generator's creation at import
        if torch.cuda.is_initialized():  # never in a template (checked before the fork); kept for truth
            for i in range(torch.cuda.device_count()):
                torch.cuda.default_generators[i].seed()
    if "numpy.random" in sys.modules:
        sys.modules["numpy.random"].seed()


def set_blas_threads(n: int) -> None:
    """numpy's OpenBLAS was loaded with one thread (so the template has no pool); give the rank its share."""
    try:
        with open("/proc/self/maps") as f:
            paths = {line.split()[-1] for line in f if "openblas" in line.lower() and line.rstrip().endswith(".so")}
    except OSError:
        return
    for path in paths:
        lib = ctypes.CDLL(path)
        for name in ("openblas_set_num_threads", "scipy_openblas_set_num_threads64_", "openblas_set_num_threads64_"):
            if hasattr(lib, name):
                getattr(lib, name)(ctypes.c_int(n))
                break


_PAGE = os.sysconf("SC_PAGE_SIZE")
_MADV_POPULATE_READ = 22  # Linux 5.14+


def resident_file_pages() -> list[tuple[int, int]]:
    """(address, bytes) runs of file-backed pages (torch's libraries, mostly) mapped in this process now."""
    runs: list[tuple[int, int]] = []
    present = bytes(b >> 7 for b in range(256))  # top byte -> 1 when bit 63 of the entry (present) is set
    with open("/proc/self/maps") as maps, open("/proc/self/pagemap", "rb", buffering=0) as pagemap:
        for line in maps:
            parts = line.split()
            if len(parts) < 6 or not parts[5].startswith("/"):
                continue
            start, end = (int(x, 16) for x in parts[0].split("-"))
            pagemap.seek(start // _PAGE * 8)
            high = pagemap.read((end - start) // _PAGE * 8)[7::8]  # each little-endian entry's top byte
            for m in re.finditer(b"\x01+", high.translate(present)):
                runs.append((start + m.start() * _PAGE, (m.end() - m.start()) * _PAGE))
    return runs


def map_like_the_template(runs: list[tuple[int, int]]) -> None:
    """A fork copies the page tables of anonymous memory only: library pages the template touched while
    importing torch are not mapped in the child until touched again, so the rank's RSS would grow by them
    later, inside a user's memory measurement. Map them now, as a fresh interpreter's own import did."""
    madvise = ctypes.CDLL(None, use_errno=True).madvise
    madvise.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
    for address, length in runs:
        if madvise(address, length, _MADV_POPULATE_READ) != 0 and ctypes.get_errno() == 22:
            return  # EINVAL: a kernel before 5.14; RSS then grows as pages are touched
