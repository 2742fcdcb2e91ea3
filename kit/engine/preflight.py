"""Kernel side: compare the ranks' collective signatures before any rank enters gloo.

Each rank announces (request id, sequence number in the cell, signature) and waits. When
every rank running the cell has announced the same signature, all get "go". When they
differ, or a rank finished the cell, raised, or died without reaching that collective,
every waiting rank gets a message naming what each rank did.
"""
from __future__ import annotations

import threading
from typing import Any, Callable

from kit.messages import VERDICT

__all__ = ["Preflight"]


def _unpaired_splits(calls: dict[int, dict[str, Any]]) -> str | None:
    """For an all_to_all: each pair (i, j) where rank i sends another count than rank j expects from i."""
    splits = {r: c.get("splits") for r, c in calls.items()}
    if not splits or not all(isinstance(s, dict) for s in splits.values()):
        return None
    bad = [f"rank {i} sends {s['send'][j]} element(s) to rank {j}, but rank {j} expects {splits[j]['recv'][i]} "
           f"from rank {i}" for i, s in sorted(splits.items()) for j in sorted(splits)
           if j < len(s["send"]) and i < len(splits[j]["recv"]) and s["send"][j] != splits[j]["recv"][i]]
    return "; ".join(bad[:4]) + (f" (and {len(bad) - 4} more)" if len(bad) > 4 else "") if bad else None


class Preflight:
    def __init__(self, world_size: int, send: Callable[[int, str, Any], None]):
        self.world_size = world_size
        self._send = send  # send(rank, kind, body)
        self._lock = threading.Lock()
        self._request: int | None = None
        self._ranks: frozenset[int] = frozenset()
        self._calls: dict[int, dict[int, dict[str, Any]]] = {}  # seq -> rank -> announcement
        self._ended: dict[int, str] = {}  # rank -> how it left the cell

    def begin(self, request_id: int, ranks: frozenset[int]) -> None:
        with self._lock:
            self._request, self._ranks = request_id, ranks
            self._calls, self._ended = {}, {}

    def announce(self, rank: int, body: dict[str, Any]) -> None:
        with self._lock:
            if body.get("id") != self._request:
                return  # a stale announcement from an abandoned cell
            seq = body["seq"]
            if len(self._ranks) < self.world_size:
                on = ", ".join(map(str, sorted(self._ranks)))
                self._verdict(seq, [rank], False,
                              f"{body['sig']} at line {body.get('line')} needs all {self.world_size} ranks of the group, "
                              f"but this cell runs on rank(s) {on} only; run it on every rank (drop --ranks)")
                return
            calls = self._calls.setdefault(seq, {})
            calls[rank] = body
            self._decide(seq)

    def rank_ended(self, rank: int, how: str) -> None:
        """A rank finished the cell, raised, or died: nobody may wait for it any more."""
        with self._lock:
            self._ended[rank] = how
            for seq in list(self._calls):
                self._decide(seq)

    def _decide(self, seq: int) -> None:
        calls = self._calls[seq]
        missing = [r for r in sorted(self._ranks) if r not in calls]
        waiting = sorted(calls)
        if not missing:
            sigs = {c["sig"] for c in calls.values()}
            unpaired = _unpaired_splits(calls) if len(sigs) == 1 else None
            if unpaired:
                self._verdict(seq, waiting, False,
                              f"{calls[waiting[0]]['sig']} (collective #{seq} of this cell) would not match: "
                              f"{unpaired}. Each rank's input_split_sizes[j] must equal rank j's "
                              f"output_split_sizes[i] (rows of the same size). Nothing was sent; the process group "
                              f"is still usable.")
            elif len(sigs) == 1:
                self._verdict(seq, waiting, True, "")
            else:
                detail = "; ".join(f"rank {r} called {c['sig']} at line {c.get('line')}" for r, c in sorted(calls.items()))
                self._verdict(seq, waiting, False,
                              f"collective #{seq} of this cell differs across ranks: {detail}. Every rank must call the "
                              f"same collectives in the same order with the same shapes and dtypes. Nothing was sent; "
                              f"the process group is still usable.")
            del self._calls[seq]
            return
        gone = [r for r in missing if r in self._ended]
        if gone:
            what = calls[waiting[0]]
            detail = "; ".join(f"rank {r} {self._ended[r]}" for r in gone)
            after = ("the group lost a member, so run `%dist restart` (or Cluster.restart()) for fresh ranks"
                     if any(self._ended[r].startswith("died") for r in gone) else "the process group is still usable")
            self._verdict(seq, waiting, False,
                          f"rank(s) {', '.join(map(str, waiting))} reached {what['sig']} at line {what.get('line')} "
                          f"(collective #{seq} of the cell), but {detail} without calling it, so it could never "
                          f"complete. The kit released the waiting rank(s) instead of letting them hang; nothing was "
                          f"sent and {after}.")
            del self._calls[seq]

    def _verdict(self, seq: int, ranks: list[int], ok: bool, message: str) -> None:
        for r in ranks:
            try:
                self._send(r, VERDICT, {"id": self._request, "seq": seq, "ok": ok, "message": message})
            except OSError:
                pass  # that rank is gone; the death report says so
