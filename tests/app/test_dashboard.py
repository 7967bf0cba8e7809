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
