"""Worker side: the end-of-request markers on the rank's stdout/stderr pipes, robust to the cell.

The kernel knows a request's output is complete when it has read a marker on both pipes. A cell
may close fd 1 or point it elsewhere (`os.close(1)`, `os.dup2(devnull, 1)`); writing the marker
to fd 1 would then lose it and every later cell would wait forever. So the worker keeps private
duplicates of the original pipe ends (non-inheritable: a cell's children never hold them open)
and writes markers there; when fd 1 or 2 no longer is the pipe, the rank says so once, on the
private stderr, with the line that restores it.
"""
from __future__ import annotations

import ctypes
import os
import sys

__all__ = ["Streams"]

_NAMES = {1: "stdout", 2: "stderr"}


def _identity(fd: int) -> tuple[int, int] | None:
    try:
        st = os.fstat(fd)
    except OSError:
        return None
    return st.st_dev, st.st_ino


class Streams:
    def __init__(self, marker: bytes):
        self.marker = marker
        self.saved = {fd: os.dup(fd) for fd in (1, 2)}  # os.dup: non-inheritable since Python 3.4
        self._pipes = {fd: _identity(fd) for fd in (1, 2)}
        self._reported: set[tuple[int, tuple[int, int] | None]] = set()

    def redirected(self) -> list[str]:
        """Notes for fds 1/2 that no longer lead to the kernel (each reported once per change)."""
        notes = []
        for fd, pipe in self._pipes.items():
            now = _identity(fd)
            if now == pipe or (fd, now) in self._reported:
                continue
            self._reported.add((fd, now))
            how = "closed" if now is None else "redirected away from the kernel's pipe"
            notes.append(f"[kit] fd {fd} ({_NAMES[fd]}) of this rank was {how} by the cell: what the rank writes "
                         f"there from now on is lost (the cell itself is fine). To restore it, run "
                         f"`os.dup2({self.saved[fd]}, {fd})` in a cell ({self.saved[fd]} is the kit's private copy "
                         f"of the original pipe).")
        for fd, pipe in self._pipes.items():  # restored by the user: report a later change again
            if _identity(fd) == pipe:
                self._reported = {r for r in self._reported if r[0] != fd}
        return notes

    def note(self, text: str) -> None:
        """A line on the rank's real stderr pipe, whatever the cell did to fd 2."""
        self._write(2, (text.rstrip("\n") + "\n").encode(errors="replace"))

    def end_request(self, request_id: int, extra: list[str] | None = None) -> list[str]:
        """Flush every buffer, say `extra` notes and report redirects, then write the markers. Returns the notes."""
        for stream in (sys.stdout, sys.stderr):
            try:
                stream.flush()
            except Exception:  # a closed or replaced sys.stdout must not stop the marker
                pass
        try:
            ctypes.CDLL(None).fflush(None)  # C stdio buffers: printf output from extensions
        except Exception:
            pass
        notes = list(extra or []) + self.redirected()
        for text in notes:
            self.note(text)
        mark = self.marker + str(request_id).encode() + b"\n"
        for fd in (1, 2):
            self._write(fd, mark)
        return notes

    def _write(self, fd: int, data: bytes) -> None:
        target = self.saved[fd]
        try:
            while data:
                data = data[os.write(target, data):]
        except OSError:
            pass
