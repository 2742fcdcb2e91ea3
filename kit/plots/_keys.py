"""A key for several runs: what their labels share said once, each run named by the rest.

Why: 6 runs that differ only in the bucket size keyed as "ddp mlp bs32 fp32 bucketNMiB tiny" six times, the
one word that differs lost among the 30 characters that do not. Every figure that keys several runs
(step_breakdown, memory_breakdown, comm_vs_knob by label, bytes_by_collective, expert_load, ring_balance)
takes its names from `run_keys`: the plain labels split first, then marked stopped and numbered (`run_labels`).
"""
from __future__ import annotations

from typing import Any, Mapping, Sequence

from kit.experiments.record_readers import is_complete

__all__ = ["split_labels", "run_keys", "run_labels", "plain_label"]


def _common_words(a: list[str], b: list[str]) -> list[str]:
    """The longest run of words both have in the same order (not necessarily adjacent)."""
    n, m = len(a), len(b)
    best = [[0] * (m + 1) for _ in range(n + 1)]
    for i in range(n - 1, -1, -1):
        for j in range(m - 1, -1, -1):
            best[i][j] = best[i + 1][j + 1] + 1 if a[i] == b[j] else max(best[i + 1][j], best[i][j + 1])
    out, i, j = [], 0, 0
    while i < n and j < m:
        if a[i] == b[j]:
            out.append(a[i])
            i, j = i + 1, j + 1
        elif best[i + 1][j] >= best[i][j + 1]:
            i += 1
        else:
            j += 1
    return out


def split_labels(labels: Sequence[str]) -> tuple[str, list[str]]:
    """What several run labels share, to be said once, and what each says of its own.

    ["ddp mlp bs32 fp32 bucket25MiB tiny", "ddp mlp bs32 fp32 bucket1MiB tiny"] ->
    ("ddp mlp bs32 fp32 tiny", ["bucket25MiB", "bucket1MiB"]): a key of 6 bucket sizes read the same 30
    characters six times and the one that differs last. Labels stay whole ("", labels) for one run, for
    labels that share fewer than two words or differ in none, and for labels written by hand with their
    own line breaks or brackets ("1 bucket\\n(cap 25 MiB)": its shared "(cap MiB)" would say nothing), or
    where a bare number would be left of a label ("bucket 1 MiB", "bucket 25 MiB": "1" and "25"), or where
    a label is all shared part ("ddp mlp" beside "ddp mlp ckpt": a key entry of nothing, or a stand-in
    such as "(nothing else)", reads worse than the whole labels).
    """
    labels = [str(lb) for lb in labels]
    if len(labels) < 2 or any(c in lb for lb in labels for c in "\n()"):
        return "", labels
    words = [lb.split() for lb in labels]
    shared = words[0]
    for w in words[1:]:
        shared = _common_words(shared, w)
    own = []
    for w in words:
        rest, k = [], 0
        for word in w:  # the shared words, first match in order, are taken out
            if k < len(shared) and word == shared[k]:
                k += 1
            else:
                rest.append(word)
        own.append(" ".join(rest))
    # a bare number left on its own ("1" of "bucket 1 MiB") says nothing without the words it stood between
    if len(shared) < 2 or not all(own) or any(w.replace(".", "").isdigit() for o in own for w in o.split()):
        return "", labels
    return " ".join(shared), own


def plain_label(rec: Mapping[str, Any], i: int) -> str:
    """A run's label as its record names it: its label, else its run id, else "run i"."""
    return str(rec.get("label") or rec.get("run_id") or f"run {i}")


def run_labels(records: Sequence[Mapping[str, Any]], names: Sequence[str] | None = None) -> list[str]:
    """Each run's name (`names`, else its plain label), marked " (stopped)" when it stopped mid-way and, when
    the same name comes again, numbered " #2", " #3", so bars never merge silently."""
    seen: dict[str, int] = {}
    labels = []
    for i, rec in enumerate(records):
        base = (names[i] if names is not None else plain_label(rec, i)) + ("" if is_complete(rec) else " (stopped)")
        seen[base] = seen.get(base, 0) + 1
        labels.append(base if seen[base] == 1 else f"{base} #{seen[base]}")
    return labels


def run_keys(records: Sequence[Mapping[str, Any]], names: Sequence[str] | None = None) -> tuple[str, list[str]]:
    """A figure's key for several runs: the heading that says once what all runs share ("all runs: ddp mlp
    bs32 fp32 tiny", "" when nothing is shared or there is one run) and each run's own part, then marked
    stopped and numbered by `run_labels` (a single run keeps its whole label). The plain labels are split
    before they are marked, so one stopped run's " (stopped)" never keeps the others whole. `names` stand for
    the plain labels of results that have none (the load plots' checks: "capacity factor 1")."""
    bases = [str(n) for n in names] if names is not None else [plain_label(r, i) for i, r in enumerate(records)]
    shared, own = split_labels(bases)
    return (f"all runs: {shared}" if shared else ""), run_labels(records, own)
