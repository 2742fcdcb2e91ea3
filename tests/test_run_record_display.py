"""What `run(cfg)` returns shows itself in a notebook as a short summary, every number labelled
measured or predicted, and stays the plain dict code reads (==, json, pickle, repr, print, results files).
Before: a cell ending in `run(cfg)` printed the whole record (every step row, timeline event and
memory breakdown: about 400 lines for a 2-rank DDP run of 4 steps). The ranks are stand-ins."""
from __future__ import annotations

import json
import pickle
from typing import Any

from IPython.testing.globalipapp import start_ipython

from kit.experiments import ExperimentConfig, run
from kit.experiments.records import load_jsonl
from kit.experiments.run_record import RunRecord, record_text

CFG = ExperimentConfig(steps=4, warmup_steps=1)


class _Ranks:
    """Stands in for kit.Cluster: each rank answers `call` as run_rank would (steps of 10-13 ms)."""

    world_size = 2

    def call(self, fn: str, config: dict[str, Any], stoppable: bool, on_progress: Any = None, stop: Any = None):
        base = {"fwd_ms": 1.0, "bwd_ms": 2.0, "opt_ms": 0.5, "comm_ms": 1.0, "comm_overlap_ms": 0.5,
                "comm_exposed_ms": 0.5, "loss": 2.0, "samples": 32}
        return {r: {"rank": r, "steps": [{**base, "step": i, "rank": r, "step_ms": 10.0 + i} for i in range(4)],
                    "memory": {}, "timeline": [], "buckets": [], "param_bytes": 0, "notes": ["a note"],
                    "emulated": False, "env": {"backend": "gloo", "device_name": "cpu"}, "stopped": False}
                for r in (0, 1)}


def _shown(value: Any) -> str:
    shell = start_ipython() or __import__("IPython").get_ipython()
    data, _ = shell.display_formatter.format(value)
    return data["text/plain"]


def test_a_cell_ending_in_run_shows_a_short_labelled_summary():
    record = run(CFG, cluster=_Ranks())
    # steps of 10, 11, 12, 13 ms: median 11.5, quartiles 10.75 and 12.25; 64 samples per step; 0.5 ms exposed
    assert _shown(record).splitlines() == [
        "run record: ddp mlp bs32 fp32 bucket25MiB, 2 rank(s), gloo on cpu (complete)",
        "measured on this machine (medians over the measured steps):",
        "  step time         11.5 ms (IQR 10.8-12.2 over 4 steps)",
        "  exposed comm      4.4 % of the step",
        "  throughput        5576 samples/s",
        "  final loss        2",
        '1 note(s) in record["notes"]. A dict: read ["summary"], ["spread"], ["steps"], ["notes"]; '
        "print(record) shows all of it"]


def test_the_record_stays_the_dict_code_reads(tmp_path):
    path = tmp_path / "runs.jsonl"
    record = run(CFG, cluster=_Ranks(), results_path=str(path))
    plain = dict(record)
    assert isinstance(record, dict) and record == plain and plain == record
    assert repr(record) == repr(plain) and str(record) == str(plain)  # print(record): the whole dict
    assert json.dumps(record, sort_keys=True) == json.dumps(plain, sort_keys=True)
    assert load_jsonl(path) == [json.loads(json.dumps(plain))]
    back = pickle.loads(pickle.dumps(record))
    assert back == plain and type(back) is RunRecord and _shown(back) == _shown(record)
    assert record.get("no_such_key", "dflt") == "dflt" and "no_such_key" not in record
    assert _shown([record]).count("run record:") == 1  # a list of records (sweep's) shows each short
    assert len(_shown(plain).splitlines()) > 50  # what a cell showed before


def test_repeats_a_pipeline_the_check_and_an_emulated_link_are_labelled():
    record = dict(run(CFG, cluster=_Ranks(), repeats=3), emulated=True, complete=False)
    record["pipeline"] = {"measured": 0.65, "formula": 0.2, "formula_text": "(p-1)/(m+p-1)"}
    record["comm"] = {"report": {"check_vs_one_process": {"max_abs_diff": 1.19e-7, "weights_moved": 0.0062}}}
    lines = record_text(record).splitlines()
    assert lines[0].endswith("(stopped early: fewer measured steps than configured)")
    assert lines[1] == "measured on this machine, on an emulated link (medians over the repeats):"
    assert lines[2] == "  step time         11.5 ms (min-max 11.5-11.5 over 3 repeats' medians)"
    assert "  pipeline bubble   65 % of the step (predicted by (p-1)/(m+p-1): 20 %)" in lines
    assert "  vs one process    max |difference| 1.19e-07 (training moved the weights by 0.0062)" in lines


def test_a_run_of_repeats_the_interrupt_ended_says_so_not_that_steps_were_missing(capsys):
    """Every repeat that finished measured all its steps: before, the summary said "stopped early: fewer
    measured steps than configured" of a run the interrupt ended after 2 of 4 repeats."""
    from kit.errors import CellError, RankFailure

    class Interrupted(_Ranks):
        calls = 0

        def call(self, *args: Any, **kw: Any):
            self.calls += 1
            if self.calls == 3:
                raise CellError({r: RankFailure(r, "KeyboardInterrupt", "") for r in (0, 1)}, interrupted=True)
            return super().call(*args, **kw)

    first = _shown(run(CFG, cluster=Interrupted(), repeats=4)).splitlines()[0]
    assert first.endswith("(interrupted: 2 of the 4 repeats asked for)"), first


def test_a_sweep_of_repeats_shows_each_record_short_as_run_does():
    """sweep(..., repeats=2) combined each point's repeats into a plain dict: a cell ending in it printed every
    step row of every point, where repeats=1 (run's records) showed each in a few lines."""
    from kit.experiments import sweep

    for repeats in (1, 2):
        recs = sweep(CFG, "bucket_cap_mb", [1.0, 5.0], cluster=_Ranks(), repeats=repeats)
        assert _shown(recs).count("run record:") == 2, repeats


def test_a_cell_ending_in_compare_shows_its_verdict_and_both_sides_times_not_their_records():
    """A cell ending in `compare(a, b)` shows the verdict and both sides' times, not both sides' whole records
    (thousands of lines)."""
    from kit.experiments import compare

    result = compare(CFG, CFG.replace(bucket_cap_mb=1), repeats=6, runner=lambda cfg, **_: run(cfg, cluster=_Ranks()))
    shown = _shown(result)
    lines = shown.splitlines()
    assert lines[0] == f"comparison: {result['summary']}" and "same within noise" in lines[0], shown
    assert "measured on this machine, 6 interleaved pair(s): A = bucket_cap_mb=25.0, B = bucket_cap_mb=1" in shown
    assert "A 11.5 ms, B 11.5 ms" in shown and "B/A per pair               1.00-1.00 (median 1.00)" in shown
    assert len(lines) <= 6 and "print(result) shows all of it" in lines[-1], shown
    assert json.loads(json.dumps(result)) == result and pickle.loads(pickle.dumps(result)) == result
    assert repr(result) == repr(dict(result))  # code that logs it gets all of it, as before
