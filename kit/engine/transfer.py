"""Kernel side: copying objects into the ranks' namespaces (push, all ranks or none) and out of them (pull).

`Cluster.push` and `Cluster.pull` are these functions; they use only the Cluster's one-request path,
handed to them as `request`. Both are transactions in the kernel as well: `pull_whole` (what `%dist pull` uses) gives every value
whole or raises, and every error is raised from a frame that no longer holds the values or their
pickles (IPython keeps the last traceback: a frame in it would keep a pushed array alive).
"""
from __future__ import annotations

import pickle
from typing import Any, Callable, Iterable

from kit.engine.output import CellResult, print_line
from kit.engine.requests import unpack_pull
from kit.engine.stuck import names as rank_names
from kit.engine.whole_frames import sigint_held
from kit.errors import TransferError
from kit.messages import PULL, PUSH, PUSH_COMMIT, names_not_defined
from kit.payload import FrameTooBig, frame_limit_bytes, pickle_for_ranks
from kit.units import MIB

__all__ = ["push", "pull", "pull_whole"]

Emit = Callable[[int, str, str], None]
# Cluster._request: (kind, body, ranks, on_output, timeout_s, check) -> the request's CellResult
Request = Callable[[str, dict[str, Any], Iterable[int] | None, Emit | None, float | None, bool | None], CellResult]
_OVERHEAD_BYTES = 1 << 16  # the push message around the values: names, ids, the pickle's own opcodes
# A commit moves values a rank already holds into its namespace: milliseconds. It holds Ctrl-C, so it must end
# on its own even if a rank never answers (the kit never hangs silently).
_COMMIT_TIMEOUT_S = 60.0


def _pack(values: dict[str, Any]) -> dict[str, bytes] | BaseException:
    """The values pickled, or the error that stopped it (raised by the caller from a frame without them)."""
    names = ", ".join(values)
    try:
        packed = {name: pickle_for_ranks(name, value) for name, value in dict(values).items()}
    except KeyboardInterrupt:
        return KeyboardInterrupt(f"push of {names} interrupted while pickling it in the kernel; "
                                 f"no rank has {names}")
    except FrameTooBig as e:
        return TransferError(f"push of {names} refused: {e}; nothing was sent, no rank has {names}")
    except TypeError as e:
        return TypeError(str(e))
    total = sum(len(p) for p in packed.values()) + _OVERHEAD_BYTES
    if total > frame_limit_bytes():
        del packed
        return TransferError(f"push of {names} refused: "
                             f"{FrameTooBig(f'together they are {int(total // MIB)} MiB', frame_limit_bytes())}; "
                             f"push them one by one; nothing was sent, no rank has {names}")
    return packed


def push(request: Request, values: dict[str, Any], ranks: Iterable[int] | None = None) -> None:
    """See Cluster.push: stage on every chosen rank, then commit everywhere or drop everywhere.

    A rank keeps staged values apart until the PUSH_COMMIT request that follows, and drops them at any
    other request. So who has the values is settled by the commit alone: it goes out holding the user's
    Ctrl-C (`sigint_held`, as frame sends do), and `outcome` is set exactly when it went. An interrupt
    anywhere in here is then told from `outcome`, in one line that says which ranks have the values."""
    names = ", ".join(values)
    packed: dict[str, bytes] | BaseException = {}
    staged: CellResult | None = None
    outcome: tuple[bool, CellResult | None] | None = None  # (keep was sent, the commit's result): it went out
    why: BaseException | None = None
    try:
        packed = _pack(values)
        values = {}  # this frame no longer holds the user's objects (a traceback may keep it)
        if isinstance(packed, BaseException):
            why = packed
        else:
            staged = request(PUSH, {"values": packed}, ranks, None, None, False)
            packed = {}  # the kernel's copies go now (a traceback keeps this frame)
            with sigint_held():
                outcome = _commit(request, staged)
            why = _who_has(names, staged, outcome, interrupted=False)
    except KeyboardInterrupt:  # landed outside the requests' own handling, or held until the commit went
        why = _who_has(names, staged, outcome, interrupted=True)
    packed = values = {}
    if why is not None:
        raise why


def _commit(request: Request, staged: CellResult) -> tuple[bool, CellResult | None]:
    """Tell the ranks that staged the values to keep them (every chosen rank staged them) or drop them."""
    got = sorted(r for r, rep in staged.replies.items() if rep.get("ok"))
    keep = staged.ok and not staged.interrupted
    kept = request(PUSH_COMMIT, {"push": staged.request_id, "keep": keep}, got, None, _COMMIT_TIMEOUT_S,
                   False) if got else None
    return keep, kept


def _who_has(names: str, staged: CellResult | None, outcome: tuple[bool, CellResult | None] | None,
             interrupted: bool) -> BaseException | None:
    """The push's one line: who has the values, from the commit that went out (or did not)."""
    if staged is None or outcome is None:  # no commit went out: a rank drops what it holds apart
        return KeyboardInterrupt(f"push of {names} interrupted; no rank has {names}")
    keep, kept = outcome
    if not keep:
        received = [r for r in staged.ranks if r not in staged.unsent]
        said = f"rank(s) {rank_names(received)} had received it and dropped it" if received else \
            "no rank had received it"
        if staged.interrupted or interrupted:
            return KeyboardInterrupt(f"push of {names} interrupted; no rank has {names} ({said})")
        staged.raise_for_error()  # a rank could not rebuild a value: its own error, with its traceback
    if kept is not None and kept.failures:  # the commit went out holding Ctrl-C: it timed out, or a rank died
        have = sorted(r for r, rep in staged.replies.items() if rep.get("ok") and r not in kept.failures)
        return TransferError(f"push of {names} half done: the commit failed on rank(s) {rank_names(kept.failures)} "
                             f"({'; '.join(f.summary() for f in kept.failures.values())}), so rank(s) "
                             f"{rank_names(have) or 'none'} have {names} and rank(s) {rank_names(kept.failures)} do "
                             f"not; push it again (`%dist status` shows whether every rank is alive)")
    if interrupted:  # the whole push happened first; the interrupt still stops Run All, and says so
        have = sorted(r for r, rep in staged.replies.items() if rep.get("ok"))
        late = KeyboardInterrupt(f"pushed {names}: the interrupt came as the ranks kept it; rank(s) "
                                 f"{rank_names(have)} have {names}")
        late.kept_everywhere = True  # type: ignore[attr-defined]  # %dist push records it for export, as a push
        return late
    return None


def pull(request: Request, names: str | Iterable[str], ranks: Iterable[int] | None = None,
         on_output: Emit | None = None) -> dict[int, dict[str, Any]]:
    """See Cluster.pull: {rank: {name: value}}, a value that cannot travel as its repr (said on `on_output`)."""
    names = [names] if isinstance(names, str) else list(names)
    result = request(PULL, {"names": names}, ranks, on_output, None, False).raise_for_error()
    return unpack_pull(result, names, on_output or print_line)


def pull_whole(request: Request, names: list[str], ranks: Iterable[int] | None = None,
               on_output: Emit | None = None) -> dict[int, dict[str, Any]]:
    """Every value whole, or TransferError / KeyboardInterrupt (one line each, naming what stays as it
    was): an interrupt anywhere, a value that could not travel, or one that does not unpickle here."""
    unchanged = f"{', '.join(names)} in the kernel {'is' if len(names) == 1 else 'are'} unchanged"
    result = _pull_result(request, names, ranks, on_output)
    if isinstance(result, BaseException):
        raise type(result)(f"{result}; {unchanged}")
    lacking = _not_defined(result, names)
    if lacking:
        result = None
        raise TransferError(f"pull of {', '.join(names)} refused: {lacking}; {unchanged}. Assign "
                            f"{'it' if len(names) == 1 else 'them'} in a %%distributed cell first (variables of the "
                            "kernel's own cells are not on the ranks: %dist push copies one there), then pull again")
    got = _unpickle(result, names)
    result = None
    if isinstance(got, BaseException):
        raise type(got)(f"{got}; {unchanged}")
    return got


def _pull_result(request: Request, names: list[str], ranks: Iterable[int] | None,
                 on_output: Emit | None) -> CellResult | BaseException:
    try:
        result = request(PULL, {"names": names}, ranks, on_output, None, False)
    except KeyboardInterrupt:
        return KeyboardInterrupt(f"pull of {', '.join(names)} interrupted")
    if result.interrupted:
        return KeyboardInterrupt(f"pull of {', '.join(names)} interrupted")
    return result


def _not_defined(result: CellResult, names: list[str]) -> str | None:
    """"rank 0 has no variable x; ranks 0, 1 have no variable y" when every failure is a name the rank
    lacks (its NameError's traceback is the kit's own frames: it tells a learner nothing), else None."""
    lacking: dict[str, list[int]] = {}
    for r, failure in result.failures.items():
        missing = None if failure.died or failure.ename != "NameError" else names_not_defined(failure.evalue, names)
        if not missing:
            return None  # a genuine error (a dead rank, a bad request): its own report, traceback and all
        for n in missing:
            lacking.setdefault(n, []).append(r)
    # in the order the learner named them (replies arrive in any order)
    return "; ".join(f"rank {lacking[n][0]} has no variable {n}" if len(lacking[n]) == 1 else
                     f"ranks {rank_names(lacking[n])} have no variable {n}" for n in names if n in lacking) or None


def _unpickle(result: CellResult, names: list[str]) -> dict[int, dict[str, Any]] | BaseException:
    result.raise_for_error()  # a rank's own error (not a missing name: pull_whole said those) keeps its traceback
    out: dict[int, dict[str, Any]] = {}
    try:
        for r, rep in sorted(result.replies.items()):
            items = (rep.get("value") or {}).get("items") or {}
            out[r] = {}
            for n in names:
                packed = items.get(n) or {"pickle": None, "note": "nothing came back for it"}
                if packed.get("pickle") is None:
                    shown = str(packed.get("repr") or "")  # the rank's note ends "showing its repr": show it
                    shown = shown if len(shown) <= 200 else shown[:200] + "..."
                    return TransferError(f"pull of {', '.join(names)} refused: rank {r}'s {n} cannot travel "
                                         f"({packed.get('note')}: {shown}); pull a value made from it that "
                                         "pickles (a tensor, a number, a dict of them)")
                try:
                    out[r][n] = pickle.loads(packed["pickle"])
                except Exception as e:  # a class defined in a cell exists only on the ranks
                    return TransferError(f"pull of {', '.join(names)} refused: rank {r}'s {n} could not be "
                                         f"rebuilt in the kernel ({type(e).__name__}: {e})")
    except KeyboardInterrupt:
        return KeyboardInterrupt(f"pull of {', '.join(names)} interrupted while unpickling in the kernel")
    return out
