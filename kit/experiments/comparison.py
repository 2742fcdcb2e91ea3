"""`compare(a, b)`: is B faster or slower than A on this machine, or the same within noise?

Kernel side, no torch. (Named comparison.py, not compare.py: a submodule named like the
function would replace `kit.experiments.compare` with the module on first import.) A comparison
is a verdict, not two means (docs/measuring.md): A and B run interleaved with repeats, each repeat of A is paired with the repeat
of B next to it, and the answer carries a confidence interval.

The statistic, and why it keeps false alarms rare:
- Per run: the *median* step time over its measured steps. A shared 2-core machine throws
  occasional 2-3x steps (another process's burst); the median ignores them, a mean does not.
- Per pair: the ratio B/A of two runs made back to back. Slow drift in machine load (the
  dominant noise here: whole runs land on busy or quiet spells) hits both halves of a pair
  alike and cancels in the ratio; rotating who runs first each round cancels any
  first/second-position effect too.
- Across pairs: the median ratio, with a 95% percentile bootstrap interval over the pairs
  (seeded, so a lesson prints the same line for the same measurements), widened where needed
  to the exact order-statistic interval of the median (stats.ratio_ci: at 6-9 pairs the
  bootstrap alone undercovers). With 5-8 pairs the interval is [min, max] of the pair ratios,
  so "slower" needs every pair to agree: the sign test, 2/2^n false alarms at worst (5 pairs:
  6.25%, over the 1-in-20 budget; 6 pairs, the default: 3.1%; 7: 1.6%; 9: [x2, x8], 3.9%).
- Minimum effect: the median ratio must also differ from 1 by `min_effect` (2%). A null
  comparison whose pairs all happen to lean one way rarely leans by 2% at the median too, so
  this brings the false-alarm rate under the 1-in-20 the lessons need, and no lesson states
  an ordering for a difference too small to reproduce on another machine. Simulated with 5
  lognormal pair ratios: per-pair noise 2% -> 1.2% false alarms, 3% -> 3.5%, 5% -> 5.2%,
  10% or more -> the 6.25% floor; a real 15% slowdown is called "slower" 100% of the time at
  3% noise, 99% at 5%, 65% at 10%. So the rule meets 19/20 both ways while the pair noise
  stays under about 5%. Hence 6 pairs by default: the floor drops to 3.1% (simulated, noise
  20%: 2.4% false alarms), and the time stays within 30 s for the MLP on 2 CPU ranks on a
  quiet machine. bench/bench_compare.py measures the real rates on a real machine.
"""
from __future__ import annotations

import threading
import time
from statistics import median
from typing import Any, Callable, Mapping

from kit.experiments.config import ExperimentConfig
from kit.experiments.records import combine_repeats
from kit.experiments.run_record import ComparisonResult
from kit.experiments.stats import VERDICTS, interleave, min_pairs, range_level, ratio_ci, verdict
from kit.keywords import names_unknown_keywords

__all__ = ["compare", "conclude", "paired_verdict", "run_median_ms", "DEFAULT_REPEATS", "DEFAULT_MIN_EFFECT"]

DEFAULT_REPEATS = 6  # the fewest pairs whose verdict keeps false alarms under 1 in 20 at any noise
NO_VERDICT = "none, too few pairs"  # what conclude shows for a compare cut below min_pairs()
DEFAULT_MIN_EFFECT = 0.02  # 2%: smaller differences are reported as "same within noise"

Runner = Callable[..., Mapping[str, Any]]


def run_median_ms(record: Mapping[str, Any]) -> float:
    """The run's median step time (ms), from its spread (kit.run/2) or its step rows (/1)."""
    st = (record.get("spread") or {}).get("step_ms")
    if st:
        return float(st["median"])
    by_step: dict[int, float] = {}
    for row in record.get("steps") or []:
        by_step[row["step"]] = max(by_step.get(row["step"], 0.0), float(row["step_ms"]))
    if not by_step:
        raise ValueError(f"record {record.get('label')!r} has no measured steps to compare")
    return float(median(by_step.values()))


def paired_verdict(a_ms: list[float], b_ms: list[float], min_effect: float = DEFAULT_MIN_EFFECT,
                   seed: int = 0) -> dict[str, Any]:
    """The verdict from paired per-run step times (ms): a_ms[i] ran next to b_ms[i]."""
    n = min(len(a_ms), len(b_ms))
    if n == 0:
        raise ValueError("no complete pairs to compare (was the comparison stopped?)")
    ratios = [b / a for a, b in zip(a_ms[:n], b_ms[:n])]
    ratio = float(median(ratios))
    lo, hi = ratio_ci(ratios, seed=seed)
    # Below min_pairs() even the range of the ratios holds the median less than 95% of the time (2 pairs: 50%):
    # "B is 1.10x slower (95% CI ...)" from 2 pairs was a coin toss called 95%. No ordering from so few.
    too_few = n < min_pairs()
    return {"ratio": ratio, "ci_low": lo, "ci_high": hi,
            "verdict": "same within noise" if too_few else verdict(ratio, lo, hi, min_effect), "min_effect": min_effect,
            "too_few_pairs": too_few,
            "pairs": [{"a_ms": a, "b_ms": b, "ratio": r} for a, b, r in zip(a_ms, b_ms, ratios)]}


def _name(cfg: ExperimentConfig, other: ExperimentConfig) -> str:
    """What to call a side in the summary: the knobs that differ, else its label."""
    da, db = cfg.to_dict(), other.to_dict()
    diff = [k for k in da if da[k] != db[k]]
    if diff == ["strategy"]:
        return cfg.strategy
    if 0 < len(diff) <= 2:
        return ", ".join(f"{k}={da[k]}" for k in diff)
    return cfg.label()


def summary_line(out: Mapping[str, Any], name_a: str, name_b: str) -> str:
    """e.g. "ddp is 1.21x slower than dp (95% CI 1.12-1.30, 6 interleaved pairs) on this machine"."""
    r, lo, hi, n = out["ratio"], out["ci_low"], out["ci_high"], len(out["pairs"])
    pairs = f"{n} interleaved pair{'s' if n != 1 else ''}"
    if out.get("too_few_pairs"):
        return (f"{name_b} and {name_a}: no ordering claimed from {pairs} (step time ratio {r:.2f}, range "
                f"{lo:.2f}-{hi:.2f}, which holds the median only {range_level(n):.0%} of the time); {min_pairs()} pairs "
                f"or more give a 95% CI: compare(..., repeats={min_pairs()}), the default")
    ci = f"95% CI {lo:.2f}-{hi:.2f}, {pairs}"
    if out["verdict"] == "slower":
        return f"{name_b} is {r:.2f}x slower than {name_a} ({ci}) on this machine"
    if out["verdict"] == "faster":
        # the CI bounds the ratio, so it follows the ratio: "2.05x faster (95% CI 0.27-0.67...)" read as a
        # speed-up between 0.27x and 0.67x
        return f"{name_b} is {1 / r:.2f}x faster than {name_a} (step time ratio {r:.2f}, {ci}) on this machine"
    return (f"{name_b} and {name_a}: same within noise on this machine (step time ratio {r:.2f}, {ci}; "
            f"no ordering claimed below a {100 * out['min_effect']:g}% difference or when the CI spans 1)")


@names_unknown_keywords  # compare(a, b, repeat=6): names repeats=
def compare(a: ExperimentConfig | Mapping[str, Any], b: ExperimentConfig | Mapping[str, Any],
            repeats: int = DEFAULT_REPEATS, cluster: Any = None, *, steps: int | None = None,
            warmup_steps: int | None = None, min_effect: float = DEFAULT_MIN_EFFECT, seed: int = 0,
            progress: Callable[[int, int], None] | None = None, stop: threading.Event | None = None,
            device: str = "cpu", runner: Runner | None = None) -> dict[str, Any]:
    """Run A and B interleaved `repeats` times each (A B, B A, A B, ...) and judge B against A.

    Returns a JSON-serialisable dict: `ratio` (B/A step time, the median of the per-pair ratios
    of per-run median step times), `ci_low`/`ci_high` (95% bootstrap over pairs), `verdict`
    ("faster", "slower" or "same within noise": what B is), `summary` (one line to print),
    `pairs` ({a_ms, b_ms, ratio} per pair, in run order), `a`/`b` (each side's record with all
    its repeats), `order` (the run order, "A"/"B"), `elapsed_s`. The statistic is explained in
    this module's docstring. `steps`/`warmup_steps` override both configs' values.
    """
    ca = a if isinstance(a, ExperimentConfig) else ExperimentConfig.from_dict(dict(a))
    cb = b if isinstance(b, ExperimentConfig) else ExperimentConfig.from_dict(dict(b))
    over = {k: v for k, v in (("steps", steps), ("warmup_steps", warmup_steps)) if v is not None}
    ca, cb = ca.replace(**over), cb.replace(**over)
    if isinstance(repeats, bool) or not isinstance(repeats, int) or repeats < 2:
        raise ValueError(f"repeats={repeats!r}: a comparison needs at least 2 pairs, and {min_pairs()} (the default) "
                         "for a verdict that can claim an ordering at 95%")
    if runner is None:
        from kit.experiments import api
        runner = api.run
        # One set of ranks for both sides: the wider config's (a one-process strategy runs on
        # rank 0 of it), so alternating A and B never restarts processes between runs.
        for cfg in (ca, cb):
            api.check_backend_for(cfg, cluster, device)  # before any rank starts
        cluster = api.cluster_for(max(api.ranks_needed(ca), api.ranks_needed(cb)), cluster, device)
    t0 = time.perf_counter()
    order = interleave(2, repeats)
    rounds: list[dict[int, dict[str, Any]]] = [{} for _ in range(repeats)]
    for k, side in enumerate(order):
        if stop is not None and stop.is_set():
            break
        if progress:
            progress(k, len(order))
        try:
            rec = dict(runner((ca, cb)[side], cluster=cluster, stop=stop, device=device))
        except BaseException as e:  # the interrupt ends the comparison as `stop` does: the finished pairs count
            from kit.experiments.api import interrupted
            done = sum(len(r) == 2 for r in rounds)
            if not interrupted(e) or not done:
                raise
            print(f"[kit] compare interrupted: judging the {done} of {repeats} pair(s) that finished (the run "
                  "in progress was dropped). Every rank is kept; the cell goes on with them, and a Run All with the "
                  "cells after it.")
            break
        if rec.get("complete", True):  # a stopped run would pair a short run with a full one
            rounds[k // 2][side] = rec
    if progress:
        progress(sum(map(len, rounds)), len(order))
    paired = [r for r in rounds if len(r) == 2]  # pairs are the two runs of one round
    out = paired_verdict([run_median_ms(r[0]) for r in paired], [run_median_ms(r[1]) for r in paired],
                         min_effect, seed)
    name_a, name_b = _name(ca, cb), _name(cb, ca)
    if ca == cb:  # a config against itself (the false-alarm check): say which run is which
        name_a, name_b = f"A ({ca.label()})", "B (the same config)"
    out.update({"summary": summary_line(out, name_a, name_b), "name_a": name_a, "name_b": name_b,
                "a": combine_repeats([r[0] for r in paired]), "b": combine_repeats([r[1] for r in paired]),
                "order": ["AB"[s] for s in order], "repeats": repeats, "seed": seed,
                "elapsed_s": time.perf_counter() - t0,
                "complete": len(paired) == repeats})
    return ComparisonResult(out)  # a dict that a notebook shows as its verdict line and the two sides' times



def conclude(result: Mapping[str, Any], *, faster: str | None = None, slower: str | None = None,
             same: str | None = None) -> str:
    """The sentence a lesson may state, chosen by the verdict this machine gave; printed and returned.

    A lesson states an ordering only where a verdict backs it: the prose for each possible
    outcome is written beforehand and the measurement picks one, so text and numbers can never
    disagree. The first line, `[verdict: slower] <summary>`, is what tests/test_lessons.py reads
    in cells tagged `verdict:<word>` (orderings a lesson states unconditionally in its markdown).
    """
    word = result["verdict"]
    if word not in VERDICTS:
        raise ValueError(f"unknown verdict {word!r}; expected one of {VERDICTS}")
    sentence = {"faster": faster, "slower": slower, "same within noise": same}[word]
    if result.get("too_few_pairs"):  # an interrupted compare: "same" would claim what the pairs cannot back
        n = len(result.get("pairs") or [])
        sentence = (f"Only {n} pair(s) finished: too few to back any of this cell's sentences; run it again for "
                    f"a verdict.")
        # shown as no verdict: "[verdict: same within noise]" above a 1.66x ratio read as a claim the pairs
        # contradict (lesson 01, interrupted); result["verdict"] stays "same within noise" for code
        word = NO_VERDICT
    text = f"[verdict: {word}] {result['summary']}" + (f"\n{sentence}" if sentence else "")
    print(text)
    return _Printed(text)


class _Printed(str):
    """Text `conclude` already printed: a cell ending in `conclude(...)` shows it once, not a second
    time as the cell's Out[] value (Jupyter calls `_ipython_display_` instead of showing the repr)."""

    def _ipython_display_(self) -> None:
        pass
