"""Kernel side: a cell that does not end, explained from the ranks' own `where` answers: who waits
where, who ignores or catches the interrupt, who holds the GIL in C, and ranks that wait inside a
collective torch issued for them (DDP's reducer, FSDP, a library) after others finished the cell."""
from __future__ import annotations

import re
import time
from typing import Any, Iterable

__all__ = ["TorchWaits", "apart_note", "names", "stuck_report", "uneven_note"]

# Modules whose C++ calls issue collectives the user never wrote (DDP's reducer during backward, its
# buffer broadcast in forward, FSDP): a rank sitting in them with no CPU time is waiting for its peers.
ISSUERS = ("torch.autograd", "torch._tensor", "torch.nn.parallel", "torch.distributed")
# Where tensor-parallel and pipeline code waits: DTensor's redistribution and functional collectives wait
# in an op called through torch._ops (wait_tensor); a P2POp or async request's `req.wait()` is a C call
# made from the cell's own line, so the innermost Python frame is the cell's.
OPS = "torch._ops"
_CELL_WAIT = re.compile(r"\.wait\(\s*(timeout\s*=[^)]*)?\)|\bwait_tensor\(")
IDLE_CPU_SHARE = 0.05  # under this share of one core between two answers, a rank is waiting, not computing
MIN_WINDOW_S = 1.0


def names(ranks: Iterable[int]) -> str:
    return ", ".join(map(str, sorted(ranks)))


class TorchWaits:
    """Ranks seen twice in a row, at the same place inside torch's collective issuers, having used
    (almost) no CPU in between: gloo waits for its peers without spinning, a backward computes."""

    def __init__(self) -> None:
        self._last: dict[int, tuple[float, float, str]] = {}  # rank -> (when, cpu_s, innermost)

    def waiting(self, reports: dict[int, dict[str, Any]]) -> dict[int, str]:
        now, out = time.monotonic(), {}
        for r, answer in reports.items():
            cpu_s, place = answer.get("cpu_s"), answer.get("innermost") or ""
            if not isinstance(cpu_s, (int, float)):
                continue
            before = self._last.get(r)
            self._last[r] = (now, float(cpu_s), place)
            if before is None or place != before[2] or not waits_for_peers(place, answer.get("text") or ""):
                continue
            window_s = now - before[0]
            if window_s >= MIN_WINDOW_S and cpu_s - before[1] < IDLE_CPU_SHARE * window_s:
                out[r] = place
        return out


def waits_for_peers(place: str, text: str) -> bool:
    """Whether a rank at this innermost frame, using no CPU, can only be waiting for its peers."""
    if place.startswith(ISSUERS + (OPS,)):
        return True
    first = text.splitlines()[0] if text else ""
    return place.startswith("__main__:") and _CELL_WAIT.search(first) is not None


def _what(places: Iterable[str]) -> str:
    kinds = []
    if any(p.startswith("__main__:") for p in places):
        kinds.append("a request's wait (isend/irecv, batch_isend_irecv's P2POps, async_op=True) that the "
                     "finished rank(s) never matched")
    if any(p.startswith((OPS, "torch.distributed")) for p in places):
        kinds.append("a collective DTensor or a functional collective (tensor or expert parallelism) issued, "
                     "which the finished rank(s) never call")
    if any(p.startswith(ISSUERS) and not p.startswith("torch.distributed") for p in places) or not kinds:
        kinds.append("a collective torch issued for you (DDP's gradient all-reduce in backward, FSDP, a library) "
                     "that the finished rank(s) never call")
    return "; or ".join(kinds)


def uneven_note(finished: list[int], waits: dict[int, str], reports: dict[int, dict[str, Any]],
                pg_timeout_s: float) -> str:
    """The finished ranks never call the collective the others wait in: say who, where, and the fix."""
    waiting = "; ".join(f"rank {r} waits inside {place}, called from {reports[r]['text'].splitlines()[0]}"
                        .replace("called from running ", "called from ") for r, place in sorted(waits.items()))
    return (f"rank(s) {names(finished)} finished the cell; {waiting}, using no CPU: {_what(waits.values())}, "
            f"so it would wait out the {pg_timeout_s:g} s process-group timeout. Usually a branch on the rank "
            f"(`if rank == 0:`) around communication, or uneven inputs: the "
            f"ranks ran different numbers of steps. Fix: the same communication on every rank; for DDP the same "
            f"number of batches on every rank "
            f"(DistributedSampler(..., drop_last=True)), the loop inside `with ddp.join():` (or "
            f"torch.distributed.algorithms.Join), or the extra steps under `with ddp.no_sync():`. The kit closes "
            f"rank(s) {names(finished)}'s connections of the group (as their exit would under torchrun), so the wait "
            f"ends now; it re-creates the group after the "
            f"cell and your variables are kept (rebuild DDP models on the new group).")


def stuck_report(reports: dict[int, dict[str, Any]], pg_timeout_s: float, interrupted: bool = False,
                 finished: Iterable[int] = ()) -> list[str]:
    """What the busy ranks' `where` answers say, in words, and what the user can do (`finished`: the
    other ranks, done with the cell)."""
    report = {r: a["text"] for r, a in reports.items()}
    lines = [f"rank {r} is {text.splitlines()[0]}" for r, text in report.items()]
    if any(text.startswith("blocked inside") for text in report.values()):
        lines += apart_note(report, pg_timeout_s)
        lines.append(f"gloo cannot be interrupted inside a collective: it raises when the process-group timeout "
                     f"({pg_timeout_s:g} s, counted from when the rank entered) expires; then the "
                     f"kit re-creates the group and keeps your variables. Interrupt again to see every rank's stack, "
                     f"a third time to stop waiting (the next cell then waits for the ranks first).")
    elif interrupted:
        lines += _interrupt_report(reports, sorted(finished))
    else:
        lines.append("Press interrupt to stop the cell on every rank (variables are kept); `%dist where` shows "
                     "every rank's stack.")
    return lines


_BLOCKED = re.compile(r"blocked inside (?P<sig>.+?)(?: at line \d+[^(]*)? \(collective #(?P<seq>\d+) of .*"
                      r", for (?P<for_s>[\d.]+) s$")
APART_MIN_S = 2.0  # a snapshot of a healthy loop may catch one rank a collective ahead for a few ms; not 2 s


def apart_note(report: dict[int, str], pg_timeout_s: float) -> list[str]:
    """Ranks blocked in collectives that cannot match (another op, shape or number: the pre-flight check,
    off under --no-check, would have refused them before sending): say so, or nothing."""
    blocked = {r: m for r, text in report.items() if (m := _BLOCKED.match(text.splitlines()[0] if text else ""))
               and float(m["for_s"]) >= APART_MIN_S}
    if len(blocked) < 2 or len({(m["sig"], m["seq"]) for m in blocked.values()}) < 2:
        return []
    each = "; ".join(f"rank {r} in {m['sig']} (collective #{m['seq']})" for r, m in sorted(blocked.items()))
    return [f"the ranks wait in collectives that can never match: {each}. Each waits out the {pg_timeout_s:g} s "
            f"process-group timeout. Every rank must call the same collectives in the same order with the same "
            f"shapes (look for a branch on `rank` around communication); the kit's pre-flight check, off under "
            f"--no-check, names such a mismatch before anything is sent."]


def _interrupt_report(reports: dict[int, dict[str, Any]], finished: list[int]) -> list[str]:
    # Each rank that answers says who handles SIGINT on it now, so "ignores" is a fact, not a guess. A rank
    # that answers with the kit's handler runs Python (the interpreter hands the GIL over every few ms), so
    # the interrupt was delivered and the cell caught it. No answer means C code holds the GIL: the
    # interrupt lands when that call returns.
    # A rank whose Python never ran the kit's handler (`sigints` 0) sits in one C call that released the GIL
    # (a long torch op): it has caught nothing; the interrupt runs when the call returns.
    report = {r: a["text"] for r, a in reports.items()}
    python = [r for r, text in report.items() if text.startswith("running ")]
    ignoring = [r for r in python if reports[r]["sigint"] == "ignored"]
    own = [r for r in python if reports[r]["sigint"] in ("user", "default")]
    in_call = [r for r in python if r not in ignoring and r not in own and reports[r].get("sigints") == 0]
    caught = [r for r in python if r not in ignoring and r not in own and r not in in_call]
    # a function the kernel called (kit.experiments' run, the lab bench, Cluster.call), no cell line on its stack:
    # nothing says it caught the interrupt; most often it is still in its clean-up (a DDP run's `finally`, the
    # reply), which under load outlasts the 0.5 s grace. Before, "the cell catches the interrupt ... Only `%dist
    # restart` ends such a cell" was said of such ranks, and the run then ended a second later by itself.
    calling = [r for r in caught if report[r].startswith("running a 'call' request")]
    catching = [r for r in caught if r not in calling]
    in_c = [r for r, text in report.items() if text.startswith("no answer")]
    after = ("Interrupt again to see every rank's stack; a third time to stop waiting. Only `%dist restart` "
             "ends such a cell (variables are lost); the kit restores its handler after the cell.")
    lines = []
    if ignoring:
        lines.append(f"rank(s) {names(ignoring)} ignore SIGINT: the cell called signal.signal(SIGINT, SIG_IGN). "
                     + after)
    if own:
        lines.append(f"rank(s) {names(own)} run Python with the cell's own SIGINT handler "
                     f"(signal.signal(SIGINT, ...)), which did not stop the cell. " + after)
    if catching:
        lines.append(f"rank(s) {names(catching)} run Python but did not stop: the cell catches the interrupt "
                     f"(`except KeyboardInterrupt`, or a bare `except:` in a loop). Interrupt again to see every "
                     f"rank's stack; a third time to stop waiting. Only `%dist restart` ends such a cell "
                     f"(variables are lost).")
    if calling:
        lines.append(f"rank(s) {names(calling)} received the interrupt and still run the function the kernel called "
                     f"(kit.experiments' run, the lab bench, Cluster.call), outside any line of a cell: usually its "
                     f"clean-up after the interrupt, which ends by itself; a function that catches KeyboardInterrupt "
                     f"would not. Interrupt again to see every rank's stack; a third time to stop waiting.")
    if in_call:
        lines.append(f"rank(s) {names(in_call)} run C code called from the cell (a long torch op releases the GIL, "
                     f"so the rank still answers): the interrupt has not reached Python yet and nothing caught it; "
                     f"it lands when that call returns. Interrupt again to see every rank's stack, a third time to "
                     f"stop waiting.")
    if in_c and finished:  # silent while its peers are done: the call may never return
        lines.append(f"rank(s) {names(in_c)} do not answer while rank(s) {names(finished)} finished the cell: C "
                     f"code holds the GIL, and the interrupt lands only when that call returns. If it stays silent "
                     f"this is likely a deadlock inside torch (for example a DDP model freed when a function returns "
                     f"while gloo's threads wait for the GIL; it happens under torchrun too), and only `%dist "
                     f"restart` ends it (variables are lost). Interrupt again to see every rank's stack, a third "
                     f"time to stop waiting.")
    elif in_c:
        lines.append(f"rank(s) {names(in_c)} do not answer: C code holds the GIL, and the interrupt lands when "
                     f"that call returns. Interrupt again to see every rank's stack, a third time to stop waiting.")
    if not python and not in_c:
        lines.append("the interrupt has not landed yet; interrupt again to see every rank's stack, a third time "
                     "to stop waiting.")
    return lines
