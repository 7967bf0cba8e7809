"""The charts' numeric helpers: smoothing, whole and incremental."""

from __future__ import annotations

import time

import numpy as np
import pytest

from app.charts.panels import Smoother, smooth
from app.metric_store import Series
from tests.app.conftest import rank_rows


def _reference(y: np.ndarray, weight: float) -> np.ndarray:
    """TensorBoard's smoothing, written as the plain loop it is."""
    out = np.empty_like(y)
    last, n = 0.0, 0
    for i, v in enumerate(y):
        if np.isfinite(v):
            last = last * weight + (1 - weight) * v
            n += 1
            out[i] = last / (1 - weight ** n)
        else:
            out[i] = np.nan
    return out


@pytest.mark.parametrize("weight", [0.01, 0.3, 0.6, 0.9, 0.99])
def test_the_vectorized_smoothing_is_the_loop(weight: float) -> None:
    rng = np.random.default_rng(0)
    y = 2.3 * np.exp(-np.arange(50_000) / 5_000) + rng.normal(0, 0.1, 50_000)
    y[rng.integers(0, len(y), 500)] = np.nan  # gaps: passed over, left empty
    got, want = smooth(y, weight), _reference(y, weight)
    assert np.array_equal(np.isnan(got), np.isnan(want))
    np.testing.assert_allclose(got[np.isfinite(got)], want[np.isfinite(want)], rtol=1e-9)


def test_the_smoother_extends_and_restarts_when_the_series_is_thinned() -> None:
    series = Series(capacity=1_000)
    smoother = Smoother()
    rng = np.random.default_rng(1)
    for i in range(3_500):  # thinned at 1,000, 2,000 (stride 2) and 4,000 (stride 4) appends
        series.append(float(i), float(rng.normal()) if i % 97 else None)
        if i % 37 == 0 or i == 3_499:
            np.testing.assert_allclose(smoother(series, 0.6), _reference(series.y, 0.6),
                                       rtol=1e-9)
    assert series.generation == 2
    np.testing.assert_allclose(smoother(series, 0.9), _reference(series.y, 0.9), rtol=1e-9)
    assert np.array_equal(smoother(series, 0.0), series.y, equal_nan=True)  # 0: unsmoothed


@pytest.mark.parametrize("ranks", [4, 64])
def test_many_ranks_are_drawn_as_a_spread_few_as_lines(qtbot, ranks: int) -> None:
    from app.dashboard import Dashboard
    from app.metric_store import MetricStore

    store = MetricStore()
    dash = Dashboard(store)
    qtbot.addWidget(dash)
    for step in range(10, 60, 10):
        store.add({"type": "metrics", "time": float(step), "step": step, "ranks":
                   rank_rows(ranks, step)})
    dash.redraw(budget_s=None)
    loss, sync = dash.loss.chart, dash.sync.sync
    if ranks <= 10:  # a line and a toggle per rank, as ever
        assert loss.points("rank 3") == 5 and len(dash.loss.toggles) == ranks
        assert len(dash.sync.caption.full_text().splitlines()) == ranks
        return
    assert not any(name.startswith("rank ") for name in loss.curves)  # 3 curves, not 64
    assert sorted(loss.curves) == ["64 ranks max", "64 ranks median", "64 ranks min"]
    assert dash.loss.toggles == {}
    _, hi = loss.curves["64 ranks max"].getData()
    _, lo = loss.curves["64 ranks min"].getData()
    assert np.all(hi > lo)  # smoothed, but still apart by the ranks' spread
    _, share = dash.sync.share.curves["64 ranks max"].getData()
    assert share[-1] == pytest.approx(100 * 0.003 / 0.010)  # rank 0: shortest step
    assert set(sync.curves) == {"64 ranks median", "64 ranks min", "64 ranks max",
                                "exposed median"}
    caption = dash.sync.caption.full_text().splitlines()
    assert len(caption) == 2 and caption[1].startswith("slowest, rank 63 step 73.0 ms")
    devices = dash.devices.caption.full_text()
    assert devices.startswith("64 GPUs: utilization median 93.2%") and "power total 32000.0 W" \
        in devices
    _, mem = dash.devices.mem.curves["64 GPUs median"].getData()
    assert mem[-1] == 16.0


def test_memory_is_drawn_in_mib_below_a_gib_and_in_gib_above(qtbot) -> None:
    from app.dashboard import Dashboard
    from app.metric_store import MetricStore

    store = MetricStore()
    dash = Dashboard(store)
    qtbot.addWidget(dash)
    rows = [{"rank": 0, "loss": 1.0, "rss_bytes": 400 * 2**20, "cpu_pct": 50.0,
             "device": "cpu"}]
    store.add({"type": "metrics", "time": 1.0, "step": 10, "ranks": rows})
    dash.redraw(budget_s=None)
    mem = dash.devices.mem
    assert mem.getAxis("left").labelText == "MiB"
    assert mem.curves["rank 0 (cpu)"].getData()[1][-1] == 400.0
    rows[0]["rss_bytes"] = 3 * 2**30
    store.add({"type": "metrics", "time": 2.0, "step": 20, "ranks": rows})
    dash.redraw(budget_s=None)
    assert mem.getAxis("left").labelText == "GiB"
    assert mem.curves["rank 0 (cpu)"].getData()[1][-1] == 3.0


def test_the_loss_panel_has_a_log_scale_toggle(qtbot) -> None:
    from app.charts.panels import LossPanel

    panel = LossPanel()
    qtbot.addWidget(panel)
    panel.log.setChecked(True)
    assert panel.chart.log_y and panel.chart.getAxis("left").logMode
    panel.log.setChecked(False)
    assert not panel.chart.log_y


def test_a_loss_spike_warning_marks_its_step_on_the_loss_chart_and_says_it(qtbot) -> None:
    from app.dashboard import Dashboard
    from app.metric_store import MetricStore

    store = MetricStore()
    dash = Dashboard(store)
    dash.timer.stop()  # frames are drawn here
    qtbot.addWidget(dash)
    t0 = time.time() - 10  # reports of a live run: no "looks hung" alert
    for step in range(10, 90, 10):
        store.add({"type": "metrics", "time": t0 + step / 10, "step": step,
                   "ranks": rank_rows(2, step)})
    message = ("loss 12 at step 80 is far above its recent median 1.6 (threshold 2.1, 3 "
               "reports in a row): the run may be diverging")
    store.add({"type": "event", "time": t0 + 8, "kind": "warning", "step": 80, "message": message,
               "cause": "loss_spike", "loss": 12.0, "losses": [12.0, 12.0], "median": 1.6,
               "threshold": 2.1, "reports": 3, "since_step": 60})
    dash.redraw(budget_s=None)
    chart = dash.loss.chart
    assert [m.value() for m in chart.marks] == [80]
    mark = chart.marks[0]
    assert mark in chart.getPlotItem().items and mark.toolTip() == message
    assert mark.label.format == "loss spike"
    assert dash.alert.text() == f"warning: {message}"

    store.add({"type": "metrics", "time": t0 + 9, "step": 90, "ranks": rank_rows(2, 90)})
    store.add({"type": "event", "time": t0 + 9, "kind": "warning", "step": 90,
               "message": "non-finite loss at step 90", "cause": "nonfinite_loss"})
    dash.redraw(budget_s=None)
    dash._alerts()
    assert chart.marks == [mark] and mark in chart.getPlotItem().items  # kept, none added
    assert dash.alert.text() == "warning: non-finite loss at step 90 (1 earlier warning)"

    dash.reset()  # another run opened: its own marks only
    assert chart.marks == [] and mark not in chart.getPlotItem().items
    assert dash.alert.text() == ""
    store.add_many([{"type": "metrics", "time": 1.0, "step": 5, "ranks": rank_rows(2, 5)},
                    {"type": "event", "time": 1.0, "kind": "warning", "step": 5,
                     "message": "m", "cause": "loss_spike"}])
    dash.redraw(budget_s=None)
    assert [m.value() for m in chart.marks] == [5]


def test_a_logged_panel_draws_each_rank_that_logged_or_the_spread_of_many(qtbot) -> None:
    from app.charts.panels import LoggedPanel
    from app.metric_store import MetricStore

    store = MetricStore()
    for step in (10, 20, 30):
        rows = rank_rows(2, step)
        rows[0]["logged"] = {"acc": step / 100}
        if step != 20:  # rank 1 skipped a report: its curve joins the two it has
            rows[1]["logged"] = {"acc": step / 50}
        store.add({"type": "metrics", "time": float(step), "step": step, "ranks": rows})
    panel = LoggedPanel("acc")
    qtbot.addWidget(panel)
    panel.redraw(store)
    assert panel.chart.getPlotItem().titleLabel.text == "acc: 0.3 (rank 0, latest)"
    x, y = panel.chart.curves["rank 1"].getData()
    assert list(x) == [10.0, 30.0] and list(y) == pytest.approx([0.2, 0.6])
    assert list(panel.chart.curves["rank 0"].getData()[1]) == pytest.approx([0.1, 0.2, 0.3])

    many = MetricStore()
    rows = rank_rows(12, 10)
    for r, row in enumerate(rows):
        row["logged"] = {"acc": float(r)}
    many.add({"type": "metrics", "time": 1.0, "step": 10, "ranks": rows})
    spread = LoggedPanel("acc")
    qtbot.addWidget(spread)
    spread.redraw(many)
    assert sorted(spread.chart.curves) == ["12 ranks max", "12 ranks median", "12 ranks min"]
    assert [float(spread.chart.curves[f"12 ranks {s}"].getData()[1][0])
            for s in ("min", "median", "max")] == [0.0, 5.5, 11.0]
    assert spread.title == "acc: 5.5 (median, latest)"
    empty = LoggedPanel("acc")
    qtbot.addWidget(empty)
    empty.redraw(MetricStore())
    assert empty.title == "acc"  # nothing logged yet: the name alone
