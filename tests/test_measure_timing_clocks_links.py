"""Device-true timing arithmetic, one clock for all ranks, the pipeline bubble, memory peaks,
bucket copies, link presets and the collective benchmark's range.

CPU only: the CUDA path is the same arithmetic fed by resolved events, so a fake clock whose
stamps are opaque tokens resolved after the step drives it here; tests/test_gpu.py checks the
real thing on a GPU.
"""
from __future__ import annotations

import pytest

from kit.experiments.theory.bubble import bubble_report, explain, predicted_bubble
from kit.experiments.benchmarks.collectives import DEFAULT_SIZES, make_records
from kit.experiments.config import ExperimentConfig
from kit.experiments.theory.links import LINKS, alpha_beta_allreduce_s, effective_gbps
from kit.experiments.harness.local import run_local
from kit.experiments.records import merge
from kit.experiments.measure.timing import StepClock, breakdown_ms

WALL_CLOCK_S = 600


# -- device-true timing: the arithmetic, driven by a fake device clock ---------------------------------------
class FakeDeviceStamps:
    """Like CUDA events: a stamp is an opaque token; its time is known only at resolve()."""

    def __init__(self) -> None:
        self.now_ms = 0.0
        self.times: dict[int, float] = {}

    def begin(self) -> None:
        pass

    def stamp(self) -> int:
        token = len(self.times)
        self.times[token] = self.now_ms
        return token

    def resolve(self, s: int) -> float:
        return self.times[s]


def test_overlap_and_exposed_from_a_fake_device_clock() -> None:
    """forward 0-10, backward 10-30 with the last gradient at 28, buckets on the wire 15-25 and
    27-40 (device times, known only after the step), optimizer 40-45."""
    st = FakeDeviceStamps()
    clock = StepClock(True, stamps=st)
    clock.begin()

    def at(t: float) -> None:
        st.now_ms = t
    with clock.phase("forward"):
        at(10.0)
    with clock.phase("backward"):
        at(15.0)
        launch0 = clock.now()
        at(25.0)
        done0 = clock.now()
        at(27.0)
        launch1 = clock.now()
        at(28.0)
        clock._last_grad = clock.now()  # what the post-accumulate-grad hook records
        at(40.0)  # backward() returns when DDP's last bucket is back
        done1 = clock.now()
    clock.comm_interval(launch0, done0)
    clock.comm_interval(launch1, done1)
    with clock.phase("optimizer"):
        at(45.0)
    row = clock.end(0, 0, 1.0, 8, keep=True)
    assert row["fwd_ms"] == 10.0 and row["opt_ms"] == 5.0 and row["step_ms"] == 45.0
    assert row["bwd_ms"] == 18.0                # compute ends at the last gradient, 28
    assert row["comm_ms"] == 10.0 + 13.0        # union of [15, 25] and [27, 40]
    assert row["comm_overlap_ms"] == 10.0 + 1.0  # inside [10, 28]
    assert row["comm_exposed_ms"] == 12.0       # 28..40: the step waited for the wire
    tl = clock.timeline(0)
    assert [e["name"] for e in tl if e["kind"] == "comm"] == ["all_reduce #0", "all_reduce #1"]


def test_optimizer_phase_cpu_time_is_the_work_not_the_wait() -> None:
    """opt_cpu_ms is the CPU time the rank's process spent inside the optimizer phase: a phase of 30 ms
    on the wall clock that used 10 ms of CPU (it waited 20 ms for a core) reads opt_ms 30, opt_cpu_ms 10;
    the CPU time of the other phases is not in it."""
    st, cpu = FakeDeviceStamps(), [5.0]
    clock = StepClock(True, stamps=st, cpu_s=lambda: cpu[0])
    for step in range(2):  # a fresh sum each step
        clock.begin()
        with clock.phase("forward"):
            st.now_ms += 10.0
            cpu[0] += 0.008
        with clock.phase("optimizer"):
            st.now_ms += 30.0
            cpu[0] += 0.010
        row = clock.end(step, 0, 1.0, 8, keep=True)
        assert row["opt_ms"] == 30.0 and row["opt_cpu_ms"] == pytest.approx(10.0)


def test_only_the_optimizer_phase_reads_the_cpu_clock() -> None:
    """The CPU clock costs a system call per read; only the optimizer phase's CPU time is reported, so
    forward, backward and comm phases read the wall clock alone: two CPU reads per optimizer phase
    (micro-batched optimizer phases add up), none elsewhere, none when instrumentation is off."""
    st, calls = FakeDeviceStamps(), []

    def cpu_s() -> float:
        calls.append(st.now_ms)
        return len(calls) * 0.001

    clock = StepClock(True, stamps=st, cpu_s=cpu_s)
    clock.begin()
    for name, kind in [("forward", "compute"), ("backward", "compute"), ("all_reduce grads", "comm"),
                       ("pp recv", "idle")]:
        with clock.phase(name, kind):
            st.now_ms += 5.0
    assert calls == []
    for _ in range(2):
        with clock.phase("optimizer"):
            st.now_ms += 5.0
    assert len(calls) == 4
    assert clock.end(0, 0, 1.0, 8, keep=False)["opt_cpu_ms"] == pytest.approx(2.0)  # (2-1) + (4-3) ms
    off = StepClock(False, stamps=FakeDeviceStamps(), cpu_s=cpu_s)
    off.begin()
    with off.phase("optimizer"):
        pass
    assert len(calls) == 4 and off.end(0, 0, 1.0, 8, keep=False)["opt_cpu_ms"] == 0.0


def test_breakdown_grows_exposed_by_an_injected_delay() -> None:
    """The GPU test's prediction, on the arithmetic: delaying the last bucket's completion by
    d ms after compute ended grows exposed comm by exactly d."""
    events = [("forward", "compute", 0.0, 5.0), ("backward", "compute", 5.0, 30.0)]
    base = breakdown_ms(events, [(10.0, 12.0), (19.0, 21.0)], last_grad_ms=20.0)
    slow = breakdown_ms(events, [(10.0, 12.0), (19.0, 21.0 + 7.5)], last_grad_ms=20.0)
    assert slow["comm_exposed_ms"] - base["comm_exposed_ms"] == pytest.approx(7.5)
    assert slow["comm_overlap_ms"] == base["comm_overlap_ms"]


# -- link presets: the ring formula, published points, the virtual link, sources -----------------------------
def test_ring_latency_is_charged_per_step() -> None:
    one = alpha_beta_allreduce_s(0, 2, alpha_us=10.0, gbps=1.0)
    eight = alpha_beta_allreduce_s(0, 8, alpha_us=10.0, gbps=1.0)
    assert one == pytest.approx(2 * 1 * 10e-6) and eight == pytest.approx(2 * 7 * 10e-6)


def test_nvlink_preset_matches_its_published_points() -> None:
    nv = LINKS["nvlink"]
    t = lambda n, p: alpha_beta_allreduce_s(n, p, nv.hop_us, nv.gbps, nv.base_us, nv.efficiency,  # noqa: E731
                                            nv.chunk_half_bytes)
    busbw = lambda n, p: 2 * (p - 1) / p * n / t(n, p) / 1e9  # noqa: E731
    assert busbw(58e6, 8) == pytest.approx(150.0, rel=0.05)   # 8xH100, 58 MB (docs/hardware.md)
    assert busbw(10e9, 8) == pytest.approx(370.0, rel=0.05)   # 8xH100, ~10 GB
    # A 13 MiB DDP bucket on 2 GPUs: the peak-only model was 2-4x too fast; now it is not.
    bucket = 13 * 2**20
    peak_only = bucket / 450e9
    assert 2.0 <= t(bucket, 2) / peak_only <= 4.0
    assert effective_gbps(1e12, 2, 450.0, nv.efficiency, nv.chunk_half_bytes) < 450.0


def test_virtual_link_charges_what_the_preset_predicts() -> None:
    from kit.experiments.measure.interconnect import VirtualLink
    from kit.experiments.theory.links import link_allreduce_s
    cfg = ExperimentConfig(interconnect="nvlink")
    link = VirtualLink(*cfg.link, 2, LINKS["nvlink"])
    try:
        assert link.cost_s(13 * 2**20) == pytest.approx(link_allreduce_s("nvlink", 13 * 2**20, 2))
    finally:
        link.close()


def test_every_preset_names_its_source() -> None:
    for name, link in LINKS.items():
        assert link.source, name
    assert ExperimentConfig(interconnect="nvlink").link == (LINKS["nvlink"].hop_us, LINKS["nvlink"].gbps)


# -- the collective benchmark: its sizes, fit and residuals --------------------------------------------------
def test_collective_sizes_reach_64_mib_and_fit_keeps_residuals() -> None:
    assert max(DEFAULT_SIZES) == 64 * 2**20
    pts = [(s, 0.05 + s / 2e9 * 1e3 * (1.3 if s == 2**20 else 1.0)) for s in (2**10, 2**14, 2**20, 2**26)]
    (rec,) = make_records({"all_reduce": pts}, 4, "gloo", "cpu")
    fit = rec["fit"]
    assert len(fit["residuals_pct"]) == 4 and fit["max_abs_residual_pct"] > 5
    assert fit["latency_steps"] == 6 and fit["alpha_per_step_us"] == pytest.approx(fit["alpha_us"] / 6)


def test_bandwidth_plot_draws_the_residuals() -> None:
    import matplotlib
    matplotlib.use("Agg")
    from kit import plots
    pts = [(s, 0.05 + s / 2e9 * 1e3 * (1.3 if s == 2**20 else 1.0)) for s in (2**10, 2**14, 2**20, 2**26)]
    (rec,) = make_records({"all_reduce": pts}, 2, "gloo", "cpu")
    fig = plots.bandwidth([rec])
    rax = fig.axes[1]
    (line,) = [ln for ln in rax.get_lines() if len(ln.get_xdata()) == 4]
    assert list(line.get_ydata()) == pytest.approx(rec["fit"]["residuals_pct"])
    assert "residual" in rax.get_ylabel()
    assert "residuals up to" in fig.axes[0].get_lines()[1].get_label()


# -- the pipeline bubble's arithmetic and stage balance ------------------------------------------------------
def test_bubble_report_splits_the_difference() -> None:
    # p=2, m=4: balanced stages of 8 ms and no overhead -> span 8 * 5/4 = 10 ms, the formula.
    rep = bubble_report([[8.0, 8.0]], [10.0], 4)
    assert rep["measured"] == pytest.approx(predicted_bubble(2, 4)) and rep["overhead"] == pytest.approx(0.0)
    # Unequal stages 6/8 ms, m=4: micro-batches of 1.5 and 2 ms; with no overhead stage 1 ends at
    # 1.5 + 4 x 2 = 9.5 ms = (14 + 3 x 8) / 4. That ideal schedule has overhead 0, not negative
    # (charging every slot 8/4 ms made it 10 ms and lesson 05 print "overhead -3%").
    rep = bubble_report([[6.0, 8.0]], [9.5], 4)
    assert rep["overhead"] == pytest.approx(0.0) and rep["overhead_ms_per_slot"] == pytest.approx(0.0)
    assert rep["imbalance"] == pytest.approx(1 - 14 / 19 - 0.2) and rep["imbalance"] > 0
    # The same stages and 1 ms extra per slot (5 slots): span 9.5 + 5.
    rep = bubble_report([[6.0, 8.0]], [14.5], 4)
    assert rep["measured"] == pytest.approx(1 - 14 / 29)
    assert rep["formula"] + rep["imbalance"] + rep["overhead"] == pytest.approx(rep["measured"])
    assert rep["overhead_ms_per_slot"] == pytest.approx(1.0)
    assert "per-micro-batch overhead" in explain(rep)


def test_split_balances_the_small_mlp() -> None:
    from kit.experiments.measure.workloads import build_workload, split_stages
    wl = build_workload("mlp", "small", n_samples=8)
    wl.dataset.close()
    stages = split_stages(wl.model, 2)
    params = [sum(p.numel() for i in st for p in wl.model[i].parameters()) for st in stages]
    assert max(params) < 2.2e6  # greedy filling gave 2.36 M / 1.06 M; min-max gives 2.1 M / 1.3 M
    assert split_stages(wl.model, 2, costs=[1.0, 1.0, 1.0, 1.0, 4.0]) == [[0, 1, 2, 3], [4]]


# -- on 2 gloo ranks (one spawn): one clock for all ranks, the bubble measured, memory peaks, bucket copies ---
# 3 timed steps: the bubble tests check the report's own arithmetic and labels, which hold for any step count.
PIPE = dict(strategy="pipeline", steps=3, warmup_steps=1, batch_size=32)
RUNS = {f"m{m}": ExperimentConfig(**PIPE, micro_batches=m) for m in (2, 4, 8)}
RUNS["mp"] = ExperimentConfig(strategy="model_parallel", steps=2, warmup_steps=1)
RUNS["ddp_plain"] = ExperimentConfig(steps=2, warmup_steps=1, instrument=False)


@pytest.fixture(scope="module")
def ranks(run_once) -> dict[str, dict[int, dict]]:
    return run_once(2, RUNS)  # m4 is test_run_record's pipeline run: run once per session


def test_ranks_share_one_clock_and_sends_precede_receives(ranks: dict) -> None:
    for name in ("m4", "mp"):
        parts = ranks[name]
        assert {p["clock"]["method"] for p in parts.values()} == {"shared monotonic clock"}
        tl = [e for p in parts.values() for e in p["timeline"]]
        assert not any(e["name"].startswith("all_reduce") for e in tl), "p2p is labelled send/recv"
        pairs = 0
        for src, dst in ((0, 1), (1, 0)):
            sends = sorted((e for e in tl if e["rank"] == src and e["name"] == f"send to {dst}"),
                           key=lambda e: e["start_ms"])
            recvs = sorted((e for e in tl if e["rank"] == dst and e["name"] == f"recv from {src}"),
                           key=lambda e: e["start_ms"])
            assert len(sends) == len(recvs) > 0
            for s, r in zip(sends, recvs):  # point-to-point is FIFO per pair: k-th send <-> k-th recv
                assert r["end_ms"] >= s["start_ms"], (name, s, r)
                pairs += 1
        assert pairs >= 2


def test_clock_offset_estimate_brackets_zero_on_one_host() -> None:
    res = run_local("kit.experiments.measure.clocks:selftest_ping_pong", 2)
    for r, sync in res.items():
        assert sync["method"] == "ping-pong"
        assert abs(sync["offset_ms"]) <= sync["error_ms"] + 1e-6, sync  # true offset is 0 here
    assert abs(res[0]["origin_ms"] - res[1]["origin_ms"]) <= res[1]["error_ms"] + 1e-6


def test_pipeline_bubble_against_the_formula(ranks: dict) -> None:
    for m in (2, 4, 8):
        cfg = RUNS[f"m{m}"]
        parts = ranks[f"m{m}"]
        rep = parts[0]["bubble"]
        assert rep == parts[1]["bubble"]  # computed from the same all-gathered table on each rank
        assert rep["formula"] == pytest.approx(1 / (m + 1))
        rec = merge(parts, cfg)
        # merge's mean over stages of 1 - busy/span with the global span is 1 - sum busy / (p span)
        assert rec["summary"]["bubble_pct"] == pytest.approx(100 * rep["measured"], rel=1e-9)
        assert rec["pipeline"] == rep  # the record keeps the breakdown, and each rank's clock
        assert set(rec["clock"]) == {0, 1} and rec["clock"][1]["method"] == "shared monotonic clock"
        parts_sum = rep["formula"] + rep["imbalance"] + rep["overhead"]
        assert parts_sum == pytest.approx(rep["measured"])
        if abs(rep["measured"] - rep["formula"]) > 0.10:
            # the record says what the difference is made of
            assert any(n.startswith("bubble measured") and "overhead" in n for n in rec["notes"])
            assert rep["imbalance"] >= -1e-9  # the slowest stage sets the pace
        print(f"m={m}: measured {rep['measured']:.3f} formula {rep['formula']:.3f} "
              f"imbalance {rep['imbalance']:+.3f} overhead {rep['overhead']:+.3f} "
              f"({rep['overhead_ms_per_slot']:.2f} ms/slot) stage busy {rep['stage_busy_ms']} "
              f"quietest {rep['quietest_step']}")


def test_uninstrumented_ddp_counts_its_bucket_copy(ranks: dict) -> None:
    rec = merge(ranks["ddp_plain"], RUNS["ddp_plain"])
    for mem in rec["memory"]:
        assert mem["grads_mib"] == pytest.approx(2 * mem["params_mib"])  # .grad + DDP's flat buckets


def test_peak_is_reset_at_the_start_of_every_run(monkeypatch) -> None:
    from kit.experiments import runner
    calls: list[str] = []
    monkeypatch.setattr(runner, "reset_peak", lambda device_type: calls.append(device_type) or False)
    cfg = ExperimentConfig(strategy="single", world_size=1, model_size="tiny", steps=1, warmup_steps=0)
    runner.run_rank(cfg.to_dict())
    runner.run_rank(cfg.to_dict())
    assert calls == ["cpu", "cpu"]


def test_pipeline_timeline_plot_lines_ranks_up_and_shows_the_formula(ranks: dict) -> None:
    import matplotlib
    matplotlib.use("Agg")
    from kit import plots
    rec = merge(ranks["m4"], RUNS["m4"])
    fig = plots.step_timeline(rec)
    title = fig._suptitle.get_text()
    assert "bubble measured" in title and "(p-1)/(m+p-1) = 20%" in title
    ax = fig.axes[0]
    assert ax.get_xlim()[1] < 10_000  # one step of both ranks on one axis, not two far-apart origins
    fig.savefig(__import__("pathlib").Path(__file__).parent / "artifacts" / "plot_pipeline_timeline.png") \
        if (__import__("pathlib").Path(__file__).parent / "artifacts").is_dir() else None
