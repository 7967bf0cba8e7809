"""The dashboard's frames: within a budget the stalest charts draw first; all catch up; the
labels take new text a few times a second."""

from __future__ import annotations

from app.charts.base import Chart
from app.dashboard import Dashboard
from app.metric_store import MetricStore
from tests.app.conftest import rank_rows


def _report(store: MetricStore, step: int, ranks: int = 4) -> None:
    store.add({"type": "metrics", "time": float(step), "step": step,
               "ranks": rank_rows(ranks, step)})


def _dashboard(qtbot) -> Dashboard:
    dash = Dashboard(MetricStore())
    dash.timer.stop()  # frames are drawn here, one at a time
    qtbot.addWidget(dash)
    dash.resize(1000, 700)
    dash.show()
    qtbot.waitExposed(dash)
    return dash


def test_a_frame_draws_what_fits_its_budget_stalest_first_and_all_catch_up(qtbot) -> None:
    dash = _dashboard(qtbot)
    store = dash.store
    for step in range(1, 6):
        _report(store, step)
    dash.redraw(budget_s=None)  # everything, at once: each chart measures its cost
    assert dash.drawn_version == store.version
    assert all(cost > 0 for cost in dash.cost_s.values())
    assert dash.loss.chart.points("rank 3") == 5

    _report(store, 6)
    order: list[Chart] = []
    for _frame in range(len(dash.charts)):
        assert dash.has_work()
        before = set(dash.behind())
        dash.redraw(budget_s=1e-9)  # a budget nothing fits in: one chart per frame
        after = set(dash.behind())
        assert len(before - after) == 1, "exactly one chart drew"
        order.extend(before - after)
        if after:
            assert dash.drawn_version < store.version
    assert dash.drawn_version == store.version and not dash.has_work()
    assert order == list(dash.charts)  # ties in staleness: in the dashboard's order
    assert dash.loss.chart.points("rank 3") == 6

    # New data while three charts still show step 6: those draw first when step 8 comes.
    _report(store, 7)
    for _frame in range(3):
        dash.redraw(budget_s=1e-9)
    assert dash.behind() == list(dash.charts[3:])
    _report(store, 8)
    dash.redraw(budget_s=1e-9)
    assert dash.behind() == [*dash.charts[:3], *dash.charts[4:]]  # the stalest drew
    dash.redraw(budget_s=None)
    assert dash.drawn_version == store.version
    assert dash.sync.share.points("rank 0") == 8


def test_the_timer_keeps_drawing_until_every_chart_is_current(qtbot) -> None:
    dash = _dashboard(qtbot)
    store = dash.store
    for step in range(1, 200):
        _report(store, step, ranks=8)
    dash.timer.start()
    qtbot.waitUntil(lambda: dash.drawn_version == store.version, timeout=10_000)
    assert not dash.has_work()
    assert dash.throughput.chart.points("rank 7") == 199


def test_the_labels_take_new_text_every_labels_s_and_catch_up(qtbot) -> None:
    dash = _dashboard(qtbot)
    store = dash.store
    _report(store, 1)
    dash.redraw()  # the first frame with data: the labels too
    assert dash.labels_version == store.version
    assert dash.progress_label.text().startswith("step 1/")
    assert dash.sync.caption.text().startswith("rank 0 step 10.0 ms")

    dash.labels_s = 3600.0  # within the hour, frames draw the charts but not the labels
    _report(store, 2)
    dash.redraw(budget_s=1.0)
    assert dash.drawn_version == store.version and dash.labels_version < store.version
    assert dash.progress_label.text().startswith("step 1/")
    dash.redraw(budget_s=None)  # everything at once: the labels too
    assert dash.labels_version == store.version
    assert dash.progress_label.text().startswith("step 2/")

    dash.labels_s = 0.05  # on the timer, the labels catch up with the last report
    for step in range(3, 30):
        _report(store, step)
    dash.timer.start()
    qtbot.waitUntil(lambda: dash.labels_version == store.version, timeout=10_000)
    assert dash.progress_label.text().startswith("step 29/")


def test_evaluation_time_is_said_in_the_progress_line_and_the_step_breakdown(qtbot) -> None:
    dash = _dashboard(qtbot)
    store = dash.store
    _report(store, 1, ranks=1)
    dash.redraw(budget_s=None)
    assert "last eval" not in dash.progress_label.text()
    assert " eval " not in dash.sync.caption.text()  # no evaluation in the interval: not named
    store.add({"type": "event", "kind": "eval", "time": 2.0, "step": 2, "val_loss": 0.5,
               "eval_s": 1.25})
    rows = rank_rows(1, 3)
    rows[0]["eval_s"] = 0.004  # the evaluation's time per step of the interval it fell in
    store.add({"type": "metrics", "time": 3.0, "step": 3, "ranks": rows})
    dash.redraw(budget_s=None)
    assert dash.progress_label.text().endswith("last eval (step 2) took 1.2 s")
    store.add({"type": "event", "kind": "eval", "time": 4.0, "step": 4, "val_loss": 0.4,
               "eval_s": 0.031})
    dash.redraw(budget_s=None)
    assert dash.progress_label.text().endswith("last eval (step 4) took 31 ms")
    assert dash.sync.caption.text().endswith("opt 1.0, eval 4.0")


def test_a_small_window_stacks_the_panels_and_scrolls_instead_of_squeezing_them(qtbot) -> None:
    """Issue 18 item 10: at 1000x700 the charts were 80 px tall. Now a panel keeps its
    minimum height; a narrow dashboard stands the panels in one column, a wide one in two."""
    from app.dashboard import PANEL_MIN_HEIGHT, TWO_COLUMNS_MIN_WIDTH

    dash = _dashboard(qtbot)
    dash.resize(TWO_COLUMNS_MIN_WIDTH - 200, 450)  # the dashboard beside the docks at 1000x700
    qtbot.waitUntil(lambda: dash.columns == 1, timeout=2000)
    qtbot.waitUntil(lambda: all(p.height() >= PANEL_MIN_HEIGHT for p in dash.panels),
                    timeout=2000)
    assert dash.scroll.verticalScrollBar().maximum() > 0  # the rest is a scroll away
    assert dash.grid.getItemPosition(dash.grid.indexOf(dash.devices))[:2] == (3, 0)
    dash.resize(TWO_COLUMNS_MIN_WIDTH + 300, 900)
    qtbot.waitUntil(lambda: dash.columns == 2, timeout=2000)
    assert dash.grid.getItemPosition(dash.grid.indexOf(dash.devices))[:2] == (1, 1)


def test_every_step_chart_follows_the_loss_charts_x_axis(qtbot) -> None:
    dash = _dashboard(qtbot)
    for step in range(1, 40):
        _report(dash.store, step * 10)
    dash.redraw(budget_s=None)
    dash.loss.chart.view.setXRange(100.0, 200.0, padding=0)  # a zoom on the loss chart
    for chart in dash.charts[1:]:
        assert chart.x_master is dash.loss.chart
        assert chart.view.viewRange()[0] == [100.0, 200.0], chart
