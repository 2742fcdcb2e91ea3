"""Lesson 07's figures (kit.plots.compression) on Agg, asserting on what was drawn: the busiest rank's
bytes and the formula beside them, each rank's bars, the bytes/step/loss panels and the break-even lines.
Records are built by hand: they are the plots' inputs, so a hand-made record tests the drawing exactly."""
from __future__ import annotations

from typing import Any

import matplotlib
import pytest

matplotlib.use("Agg")

from kit import plots  # noqa: E402
from kit.experiments.theory.links import LINKS, alpha_beta_allreduce_s  # noqa: E402
from test_plots import labelling_problems, text_problems  # noqa: E402

MIB = 2**20
S = 4 * MIB
# what lesson 07's hand-written algorithms send on 2, 3 and 4 of 4 ranks (the ring's chunks are S/N each)
SENT = {("ring", n): [2 * (n - 1) * S // n] * n for n in (2, 3, 4)}
SENT |= {("root", n): [(n - 1) * S] + [S] * (n - 1) for n in (2, 3, 4)}
BYTES = {"none": 13_688_872, "fp16": 6_844_436, "powersgd": 50_256}
LINK_MS = {"none": 273.8, "fp16": 136.9, "powersgd": 1.0}


def run_record(step_ms: float, nbytes: int, losses: list[float], emulated: bool) -> dict[str, Any]:
    steps = [{"rank": r, "step": s, "loss": loss + r * 0.1} for s, loss in enumerate(losses) for r in (0, 1)]
    return {"config": {"world_size": 2}, "emulated": emulated, "summary": {"bytes_per_step": nbytes},
            "spread": {"step_ms": {"median": step_ms}}, "steps": steps}


def records() -> dict[tuple[str, str], dict[str, Any]]:
    out = {}
    for c, loop_ms in (("none", 60.0), ("fp16", 70.0), ("powersgd", 80.0)):
        out["loopback", c] = run_record(loop_ms, BYTES[c], [1.0, 0.9], emulated=False)
        out["slow link", c] = run_record(loop_ms + LINK_MS[c] + 5, BYTES[c], [1.0, 0.8], emulated=True)
    return out


def test_bytes_per_rank_draws_the_busiest_rank_beside_the_formula_and_each_rank_at_the_largest_n():
    fig = plots.bytes_per_rank(SENT, S)
    ax, ax2 = fig.axes
    lines = {ln.get_label(): ln for ln in ax.get_lines()}
    assert list(lines["ring: measured (busiest rank)"].get_ydata()) == pytest.approx([4, 16 / 3, 6])
    assert list(lines["root: measured (busiest rank)"].get_ydata()) == pytest.approx([4, 8, 12])
    ring_formula = lines["ring: formula 2(N-1)/N·S (predicted)"]
    assert list(ring_formula.get_xdata()) == list(range(2, 9))
    assert ring_formula.get_ydata()[-1] == pytest.approx(2 * 7 / 8 * 4)   # below 2S at N = 8
    assert lines["root: formula (N-1)·S (predicted)"].get_ydata()[-1] == pytest.approx(7 * 4)
    heights = [round(p.get_height(), 3) for p in ax2.patches]
    assert heights == [6.0] * 4 + [12.0, 4.0, 4.0, 4.0]                  # ring spread evenly, root does it all
    assert [t.get_text() for t in ax2.get_xticklabels()] == [f"rank {r}" for r in range(4)]
    assert labelling_problems(fig) == [] and text_problems(fig) == []


def test_compression_runs_draws_bytes_steps_with_the_predicted_mark_and_the_mean_loss():
    recs = records()
    fig = plots.compression_runs(recs, BYTES, LINK_MS)
    a1, a2, a3 = fig.axes
    assert [p.get_height() for p in a1.patches] == [BYTES[c] for c in ("none", "fp16", "powersgd")] * 2
    assert a1.get_yscale() == "log"
    steps = [p.get_height() for p in a2.patches]
    assert steps[:3] == [60.0, 70.0, 80.0]                                # loopback
    assert steps[3:] == pytest.approx([60 + 273.8 + 5, 70 + 136.9 + 5, 80 + 1.0 + 5])
    assert all(p.get_hatch() == "//" for p in a2.patches[3:]) and not a2.patches[0].get_hatch()
    mark = next(ln for ln in a2.get_lines() if ln.get_label().startswith("predicted"))
    assert list(mark.get_ydata()) == pytest.approx([60 + 273.8, 70 + 136.9, 80 + 1.0])
    loss = {ln.get_label(): list(ln.get_ydata()) for ln in a3.get_lines()}
    assert loss["none"] == pytest.approx([1.05, 0.85])                   # the slow link's, mean of 2 ranks
    assert labelling_problems(fig) == [] and text_problems(fig) == []
    # JupyterLab fits a wider figure into a laptop's column (about 850 px at 1280 px) by shrinking it: at
    # 14 inches, three panels in a row, its text came out at 60% of its size
    assert fig.get_size_inches()[0] <= 10


def test_compression_runs_builds_its_two_rows_directly(monkeypatch):
    """Two panels above one that spans the row below, 9.6 inches wide, laid out by the kit's figure helper
    (`new_figure(mosaic=...)`): no axes is made only to be removed (it once made one, removed it, added a grid)."""
    from matplotlib.figure import Figure

    removed = []
    monkeypatch.setattr(Figure, "delaxes", lambda fig, ax: removed.append(ax))
    fig = plots.compression_runs(records(), BYTES, LINK_MS)
    assert removed == [] and list(fig.get_size_inches()) == [9.6, 7.0]
    cells = [(a.get_subplotspec().rowspan, a.get_subplotspec().colspan) for a in fig.axes]
    assert cells == [(range(0, 1), range(0, 1)), (range(0, 1), range(1, 2)), (range(1, 2), range(0, 2))]
    assert [a.get_title() for a in fig.axes] == ["Bytes per step", "Step time", "Loss per step (slow link)"]


def test_break_even_lines_are_the_loopback_step_plus_the_ring_time_and_cross_where_compression_pays():
    recs = records()
    fig = plots.break_even(recs, BYTES, alpha_us=20, slow_gbps=0.05)
    ax = fig.axes[0]
    lines = {ln.get_label(): ln for ln in ax.get_lines()}
    for c, loop_ms in (("none", 60.0), ("powersgd", 80.0)):
        pred = lines[f"{c}: predicted (loopback step + link)"]
        g, y = pred.get_xdata()[0], pred.get_ydata()[0]
        assert y == pytest.approx(loop_ms + 1e3 * alpha_beta_allreduce_s(BYTES[c], 2, 20, g))
        assert list(lines[f"{c}: measured, 0.05 GB/s (emulated)"].get_xdata()) == [0.05]
    none = lines["none: predicted (loopback step + link)"].get_ydata()
    psgd = lines["powersgd: predicted (loopback step + link)"].get_ydata()
    assert none[0] > psgd[0] and none[-1] < psgd[-1]                      # slow links: PowerSGD; fast: none
    # the links of lesson 07's break-even table, at the bandwidth it uses (NVLink 370 GB/s, not its 450 peak)
    dotted = sorted(ln.get_xdata()[0] for ln in ax.get_lines() if ln.get_linestyle() == ":")
    assert dotted == pytest.approx(sorted(LINKS[n].gbps * LINKS[n].efficiency
                                          for n in ("10gbe", "100gbe", "infiniband", "nvlink")))
    assert labelling_problems(fig) == [] and text_problems(fig) == []
