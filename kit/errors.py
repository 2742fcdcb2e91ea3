"""Every error the kit raises: what went wrong, on which rank, and what to do next."""
from __future__ import annotations

import re
from dataclasses import dataclass

__all__ = [
    "KitError",
    "ConfigError",
    "WorkerStartError",
    "CellError",
    "interrupted_note",
    "TransferError",
    "ClusterStateError",
    "CollectiveMismatchError",
    "AuthenticationError",
    "RankFailure",
    "DecodeError",
    "StoppedWaiting",
    "cell_label",
]


_NATIVE_PREFIX = re.compile(r"^\[[^\]\s]+\.(?:cc|cpp|h|hpp):\d+\] ")
_CELL_FRAME = re.compile(r'File "<cell ([^"]*)>", line (\d+)')


def cell_label(filename: str) -> str:
    """What the user calls the cell a code object came from: `<cell In [7]>` -> "In [7]", `<cell 5>` -> "cell 5"."""
    inner = filename[len("<cell "):-1] if filename.startswith("<cell ") and filename.endswith(">") else filename
    return f"cell {inner}" if inner.isdigit() else inner


class KitError(Exception):
    """Base class of the kit's errors."""


class ConfigError(KitError, ValueError):
    """A bad argument: the message names the value, the allowed range and the fix."""


class AuthenticationError(KitError):
    """A control frame failed its signature check; the channel is closed."""


class DecodeError(KitError):
    """A signed message arrived intact but its body could not be unpickled (an object the
    receiving process cannot rebuild). Only that request fails; the rank lives on."""


class TransferError(KitError):
    """A push or pull refused or undone as a whole (too big, a value that cannot travel): one line."""


class ClusterStateError(KitError):
    """The cluster cannot do this now (not started, broken, busy)."""


class CollectiveMismatchError(KitError, RuntimeError):
    """Raised on a rank when the ranks called different collectives (checked before entry)."""


@dataclass
class RankFailure:
    """What one rank reported: an exception with its traceback, or its death."""

    rank: int
    ename: str
    evalue: str
    traceback: str = ""
    line: int | None = None  # line in the cell, when known
    died: bool = False
    time_s: float = 0.0  # when it was observed (monotonic), to order root causes
    cell: str | None = None  # the cell the line is in ("In [7]"): a function may live in an earlier cell

    def location(self) -> str:
        """" at line 4 of In [7]": the cell is the one whose code raised, read from the innermost cell
        frame of the traceback when the rank did not say. A dead rank's stderr tail holds faulthandler's
        dump (innermost frame first), which names the line even when the kernel found none."""
        frames = _CELL_FRAME.findall(self.traceback or "")
        line, cell = self.line, self.cell
        if self.died and frames and line is None:
            (cell_name, number), cell = frames[0], None
            line, frames = int(number), [(cell_name, number)]
        if not line:
            return ""
        if cell is None and frames and frames[-1][1] == str(line):
            cell = cell_label(f"<cell {frames[-1][0]}>")
        return f" at line {line}" + (f" of {cell}" if cell else "")

    def summary(self) -> str:
        where = self.location()
        text = _NATIVE_PREFIX.sub("", self.evalue)  # "[/__w/pytorch/.../pair.cc:553] " helps nobody
        if self.died:  # "rank 1 died WorkerDied: ..." named the kit's label for a death, not an exception
            return f"rank {self.rank} died{where}: {text}".rstrip(": ")
        return f"rank {self.rank} raised {self.ename}{where}: {text}".rstrip(": ")


class WorkerStartError(KitError):
    """The ranks did not come up; carries the failing rank's stderr tail."""


def _without_repeat(traceback: str, message: str) -> str:
    """A long message (a collective mismatch names every rank's call) already stands in the headline;
    the traceback's last line repeating it word for word says it twice, so it points up instead."""
    if len(message) > 100 and traceback.endswith(": " + message):
        return traceback[: -len(message)] + "(the message above)"
    return traceback


class CellError(KitError):
    """A cell failed on one or more ranks. Root cause first, the other ranks summarised.

    `failures` is keyed by rank. IPython shows `_render_traceback_` instead of a kernel-side
    traceback, so the user reads the worker's traceback with the cell's own line numbers.
    `interrupted`: the request was interrupted (the user, or --timeout; CellResult.interrupted), so a
    rank's failure may be the interrupt's consequence (a peer released from a collective) and not a fault.
    """

    def __init__(self, failures: dict[int, RankFailure], notes: list[str] | None = None,
                 interrupted: bool = False):
        self.failures = dict(sorted(failures.items()))
        self.notes = list(notes or [])
        self.interrupted = interrupted
        from kit.diagnose import is_consequence  # pure text; kept lazy so errors.py stays import-light

        # The root cause is the first failure that is not merely an echo of another rank's (a released
        # pre-flight wait, a peer that vanished mid-collective, a gloo timeout).
        self.root = min(self.failures.values(), key=lambda f: (is_consequence(f), f.time_s, f.rank)) \
            if failures else None
        super().__init__(self._headline())

    def _headline(self) -> str:
        if self.root is None:
            return "cell failed"
        others = [f for r, f in self.failures.items() if r != self.root.rank]
        text = self.root.summary()
        if others:
            text += "; also " + "; ".join(f.summary() for f in others)
        return text

    def _render_traceback_(self) -> list[str]:
        assert self.root is not None
        root = self.root
        # Every rank interrupted (the user, or --timeout): nothing failed first, and the notes say who interrupted.
        interrupted = all(f.ename == "KeyboardInterrupt" for f in self.failures.values())
        same = [f for f in self.failures.values() if f is not root and f.ename == root.ename and f.evalue == root.evalue]
        rest = [f for f in self.failures.values() if f is not root and f not in same]
        # "root cause" only says something when other ranks failed otherwise (released, timed out): why this
        # one comes first. A lone failure, or one every rank raised alike (a SyntaxError), is just the error.
        out = [f"CellError: {root.summary()}" + ("  (root cause: first failure observed)" if rest and not interrupted
                                                  else "")]
        if root.traceback:
            out.append(f"----- rank {root.rank} traceback -----")
            out.append(_without_repeat(root.traceback.rstrip(), _NATIVE_PREFIX.sub("", root.evalue)))
        from kit.diagnose import hint

        root_hint = hint(root)
        if root_hint:
            out.append("hint: " + root_hint)
        for where in dict.fromkeys(f.location() for f in same):  # the root's place first, unsaid; others named
            ranks = [f.rank for f in same if f.location() == where]
            out.append(f"{'rank' if len(ranks) == 1 else 'ranks'} {', '.join(map(str, ranks))}: "
                       + ("died the same way" if root.died else f"the same {root.ename}")
                       + (where if where != root.location() else ""))
        for f in rest:
            out.append("also " + f.summary())
            extra = hint(f)
            if extra and extra != root_hint:
                out.append("  hint: " + extra)
        out.extend(self.notes)
        return out

    def hints(self) -> list[str]:
        """Plain-words hints (kit.diagnose) for the root cause first, then other ranks' distinct ones."""
        from kit.diagnose import hint

        seen: list[str] = []
        for f in sorted(self.failures.values(), key=lambda f: f is not self.root):
            text = hint(f)
            if text and text not in seen:
                seen.append(text)
        return seen

    def __str__(self) -> str:
        return "\n".join(self._render_traceback_()) if self.root else "cell failed"


def interrupted_note(failures: dict[int, RankFailure], ranks: tuple[int, ...] | list[int]) -> str:
    """The note under a cell the user interrupted. The ranks stop independently: where they stopped at
    different lines, or one had finished the cell, what a loop changes may differ between them now."""
    note = "[kit] interrupted at your request; every rank and its variables are kept"
    lines = {r: failures[r].line for r in ranks if r in failures}
    finished = [r for r in ranks if r not in failures]
    if len(set(lines.values())) < 2 and not (finished and lines):
        return note + "."
    said = [f"rank {r} at line {line}" if line else f"rank {r} outside the cell's lines" for r, line in lines.items()]
    said += [f"rank {r} had finished the cell" for r in finished]
    return (f"{note}, each as it was where it stopped: {', '.join(said)}. What the cell changes (a step count, "
            f"weights after opt.step()) may now differ between the ranks: print it on each to check, or rerun "
            f"the cells that set it up.")


class StoppedWaiting(KeyboardInterrupt):
    """The third interrupt: the kit stops waiting for ranks that are still busy. Still a KeyboardInterrupt
    (scripts stop as on Ctrl-C), but IPython shows this message instead of a traceback through the kit."""

    def __init__(self, ranks: list[int], rid: int):
        self.ranks, self.request_id = ranks, rid
        names = ", ".join(map(str, sorted(ranks)))
        super().__init__(f"stopped waiting after three interrupts; rank(s) {names} are still running the "
                         f"cell. The next cell first asks them to stop and waits briefly, saying for what; run "
                         f"`%dist restart` to start fresh ranks now (their variables are lost).")

    def _render_traceback_(self) -> list[str]:
        return [f"KeyboardInterrupt: {self}"]
