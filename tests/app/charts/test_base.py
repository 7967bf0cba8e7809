"""A chart as drawn: its grid and its curves reach the pixels."""

from __future__ import annotations

import numpy as np
import pytest
from PySide6.QtCore import QPointF
from PySide6.QtGui import QColor

from app.charts.base import GRID, Chart, lone_points, peak_thin, steady_range
from tests.app.conftest import shown_chart


def _pixels(chart: Chart) -> dict[int, int]:
    """Colour (0xRRGGBB) -> how many pixels of the chart's rendered image have it."""
    image = chart.grab().toImage()
    counts: dict[int, int] = {}
    for y in range(image.height()):
        for x in range(0, image.width(), 2):
            rgb = image.pixel(x, y) & 0xFFFFFF
            counts[rgb] = counts.get(rgb, 0) + 1
    return counts


def test_the_grid_is_drawn_opaque_and_the_curve_over_it(qtbot) -> None:
    chart = shown_chart(qtbot)
    x = np.arange(1000.0)
    chart.set_data("rank 0", x, np.sin(x / 50), "#1f77b4")
    counts = _pixels(chart)
    grid = QColor(GRID).rgb() & 0xFFFFFF
    curve = QColor("#1f77b4").rgb() & 0xFFFFFF
    # grid lines in both directions, in exactly the grid colour (no blending with the white)
    assert counts.get(grid, 0) > 500, sorted(counts.items(), key=lambda kv: -kv[1])[:5]
    assert counts.get(curve, 0) > 100


def test_a_steady_range_snaps_outward_to_round_steps() -> None:
    assert steady_range(0.0, 1503.0) == (0.0, 1600.0)  # steps of 200 for a span of 1503
    assert steady_range(0.0, 1599.0) == (0.0, 1600.0)  # growing within a step: no change
    assert steady_range(0.0, 1601.0) == (0.0, 2000.0)  # past it: span/8 > 200, steps of 500
    assert steady_range(0.0123, 2.31) == (0.0, 2.5)  # steps of 0.5
    lo, hi = steady_range(-7.2, -3.1)
    assert lo <= -7.2 and hi >= -3.1 and (hi - lo) < 1.5 * 4.1
    lo, hi = steady_range(5.0, 5.0)  # no span: a tenth of the value either side, snapped
    assert lo == pytest.approx(4.4) and hi == pytest.approx(5.6)
    assert steady_range(0.0, 0.0) == (-1.0, 1.0)
    assert all(np.isnan(steady_range(float("nan"), 1.0)[:1]))


def _paints(chart: Chart, qtbot) -> int:
    """Paint events the chart's viewport gets until the event loop has nothing left to do."""
    from PySide6.QtCore import QEvent, QObject

    class Count(QObject):
        n = 0

        def eventFilter(self, _obj, event) -> bool:  # noqa: N802
            if event.type() == QEvent.Type.Paint:
                Count.n += 1
            return False

    counter = Count()
    chart.viewport().installEventFilter(counter)
    try:
        qtbot.wait(200)
    finally:
        chart.viewport().removeEventFilter(counter)
    return Count.n


def test_a_growing_curve_keeps_the_range_until_it_crosses_a_step_and_paints_once(qtbot) -> None:
    chart = shown_chart(qtbot)
    x = np.arange(1, 1504.0)
    chart.set_data("rank 0", x, 2 - x / 1000, "#1f77b4")
    chart.settle()
    _paints(chart, qtbot)
    (x0, x1), (y0, y1) = chart.getViewBox().viewRange()
    assert x0 <= 1 and 1600 <= x1 < 1700 and y0 <= 0.5 and y1 >= 2.0  # all of it, rounded out
    axis = chart.getAxis("bottom")
    assert axis.picture is not None  # the axis drawn and cached
    x = np.arange(1, 1590.0)  # more points, within the step
    chart.set_data("rank 0", x, 2 - x / 1000, "#1f77b4")
    chart.settle()
    assert chart.getViewBox().viewRange()[0] == [x0, x1]
    assert axis.picture is not None  # the axis is not regenerated
    assert _paints(chart, qtbot) == 1  # the new data drawn in one paint
    x = np.arange(1, 1700.0)  # past the step: the range grows
    chart.set_data("rank 0", x, 2 - x / 1000, "#1f77b4")
    chart.settle()
    assert chart.getViewBox().viewRange()[0][1] >= 1699
    assert _paints(chart, qtbot) == 1


def test_thinning_keeps_each_columns_min_and_max_and_what_was_drawn_stays_put() -> None:
    rng = np.random.default_rng(0)
    x = np.arange(100_000.0)
    y = np.cumsum(rng.normal(size=len(x)))
    y[5000:5100] = np.nan  # a gap the width of whole blocks stays a gap
    y[7000] = np.nan  # one missing point does not
    tx, ty = peak_thin(x, y, 400)
    assert 400 <= len(tx) <= 2 * 400
    assert np.nanmin(ty) == np.nanmin(y) and np.nanmax(ty) == np.nanmax(y)
    assert np.isnan(ty[(tx > 5000) & (tx < 5090)]).all()
    assert np.isfinite(ty[(tx > 6990) & (tx < 7010)]).all()
    for lo, hi, mn, mx in zip(tx[0::2], tx[1::2], ty[0::2], ty[1::2], strict=True):
        part = y[int(lo):int(hi) + 1]
        if np.isfinite(part).any():
            assert (mn, mx) == (np.nanmin(part), np.nanmax(part))
    more_x, more_y = peak_thin(np.arange(100_500.0), np.append(y, np.zeros(500)), 400)
    same = len(tx) - 2  # the blocks before the last, partial one: unchanged by new points
    assert np.array_equal(more_x[:same], tx[:same])
    assert np.array_equal(more_y[:same], ty[:same], equal_nan=True)
    assert len(peak_thin(x[:800], y[:800], 400)[0]) == 800  # few points: all of them


def test_a_zoomed_chart_thins_what_it_shows_and_fits_all_again_after(qtbot) -> None:
    chart = shown_chart(qtbot)
    x = np.arange(200_000.0)
    chart.set_data("rank 0", x, np.sin(x / 3000), "#1f77b4")
    chart.settle()
    assert chart.points("rank 0") == 200_000
    shown_x, _ = chart.curves["rank 0"].getData()
    assert len(shown_x) <= 2 * chart.view.width()
    chart.view.setXRange(1000, 2000, padding=0)  # the user zooms in: the detail comes back
    zoomed_x, _ = chart.curves["rank 0"].getData()
    assert zoomed_x[0] <= 1000 and zoomed_x[-1] >= 2000 and len(zoomed_x) < 3000
    assert np.count_nonzero((zoomed_x >= 1000) & (zoomed_x <= 2000)) > 0.5 * len(zoomed_x)
    chart.view.enableAutoRange()  # back to all of it
    chart.settle()
    again_x, _ = chart.curves["rank 0"].getData()
    assert again_x[0] == 0 and again_x[-1] == 199_999


def test_a_curve_along_a_grid_line_stays_visible(qtbot) -> None:
    """A loss near 0 runs along the y=0 grid line: the curve must be drawn over the grid."""
    chart = shown_chart(qtbot)
    x = np.arange(1000.0)
    y = np.where(x < 500, 1.0, 0.0)  # a step from 1 down to exactly 0: the grid line at y=0
    chart.set_data("rank 0", x, y, "#d62728")
    chart.settle()
    image = chart.grab().toImage()
    at = chart.mapFromScene(chart.view.mapViewToScene(QPointF(750.0, 0.0)))
    line = {image.pixel(at.x(), yy) & 0xFFFFFF for yy in range(at.y() - 1, at.y() + 2)}
    assert QColor("#d62728").rgb() & 0xFFFFFF in line, [hex(c) for c in line]


def test_a_reset_forgets_the_zoom_of_the_last_run(qtbot) -> None:
    chart = shown_chart(qtbot)
    chart.set_data("rank 0", np.arange(100.0), np.ones(100), "#1f77b4")
    chart.view.setXRange(10.0, 20.0)  # as a mouse-wheel zoom does: auto-range off
    assert not chart.view.autoRangeEnabled()[0]
    chart.reset()
    assert chart.view.viewRange()[0] == [0.0, 1.0]  # nothing of the last run's axes
    chart.set_data("rank 0", np.arange(5000.0), np.ones(5000), "#1f77b4")
    chart.settle()
    lo, hi = chart.view.viewRange()[0]
    assert lo <= 0.0 and hi >= 4999.0, (lo, hi)  # the new run is shown whole


def test_a_from_zero_chart_keeps_0_in_view(qtbot) -> None:
    chart = Chart("Memory", "GiB", from_zero=True)
    qtbot.addWidget(chart)
    chart.set_data("rank 0", np.arange(50.0), 0.388 + np.arange(50.0) * 1e-5, "#1f77b4")
    chart.settle()
    lo, hi = chart.view.viewRange()[1]
    assert lo <= 0.0 and hi >= 0.3885  # a 0.1% change is not drawn as a cliff


def test_a_count_axis_ticks_only_whole_numbers(qtbot) -> None:
    chart = Chart("Throughput", "samples/s", x_label="devices", x_counts=True)
    qtbot.addWidget(chart)
    for lo, hi in ((1.0, 2.0), (0.8, 8.2), (1.0, 64.0)):
        levels = chart.getAxis("bottom").tickValues(lo, hi, 400)
        values = [v for _spacing, vs in levels for v in vs]
        assert values and all(float(v).is_integer() for v in values), (lo, hi, levels)


def test_a_zoomed_chart_shows_its_reset_button_and_it_shows_all_again(qtbot) -> None:
    chart = shown_chart(qtbot)
    chart.set_data("rank 0", np.arange(100.0), np.ones(100), "#1f77b4")
    button = chart.getPlotItem().autoBtn
    assert not button.isVisible()
    chart.view.setXRange(10.0, 20.0)  # a zoom: auto-range off
    assert button.isVisible()  # without the mouse over the chart
    button.clicked.emit(button)  # as a click does
    assert all(chart.view.autoRangeEnabled()) and not button.isVisible()


def test_a_log_axis_draws_log10_and_leaves_out_what_is_not_positive(qtbot) -> None:
    chart = shown_chart(qtbot)
    chart.set_data("rank 0", np.arange(4.0), np.array([100.0, 10.0, 0.0, 1.0]), "#1f77b4")
    chart.set_log_y(True)
    y = chart.curves["rank 0"].getData()[1]
    assert y[0] == 2.0 and y[1] == 1.0 and np.isnan(y[2]) and y[3] == 0.0
    chart.set_log_y(False)
    assert list(chart.curves["rank 0"].getData()[1]) == [100.0, 10.0, 0.0, 1.0]


def test_linked_step_charts_zoom_together_and_either_reset_button_shows_all(qtbot) -> None:
    """Issue 18 item 2: the step charts share their x axis. A zoom in one is a zoom in both;
    the reset button of the follower fits the leader to all the data again (the follower's
    own x auto-range would otherwise fight the leader's)."""
    leader, follower = shown_chart(qtbot), shown_chart(qtbot)
    follower.link_x(leader)
    for chart in (leader, follower):
        chart.set_data("rank 0", np.arange(0.0, 1000.0, 10.0), np.ones(100), "#1f77b4")
    leader.settle()
    follower.settle()
    assert not follower.getPlotItem().autoBtn.isVisible()  # following is not a zoom
    follower.view.setXRange(200.0, 400.0, padding=0)  # a zoom in the follower
    assert leader.view.viewRange()[0] == [200.0, 400.0]
    assert leader.getPlotItem().autoBtn.isVisible()
    assert follower.getPlotItem().autoBtn.isVisible()
    button = follower.getPlotItem().autoBtn
    button.clicked.emit(button)
    for chart in (leader, follower):
        chart.set_data("rank 0", np.arange(0.0, 3000.0, 10.0), np.ones(300), "#1f77b4")
    leader.settle()
    follower.settle()
    for chart in (leader, follower):
        lo, hi = chart.view.viewRange()[0]
        assert lo <= 0.0 and hi >= 2990.0, (lo, hi)  # all of it, the new data too
        assert not chart.getPlotItem().autoBtn.isVisible()


def test_an_empty_chart_shows_no_empty_legend_box(qtbot) -> None:
    chart = shown_chart(qtbot)
    assert not chart.legend.isVisible()  # a fresh window: no empty boxes on its charts
    chart.set_data("all ranks", np.array([]), np.array([]), "#000000")
    assert not chart.legend.isVisible()  # a curve with nothing to draw: no legend of it yet
    chart.set_data("rank 0", np.arange(10.0), np.ones(10), "#1f77b4")
    assert chart.legend.isVisible()
    chart.reset()
    assert not chart.legend.isVisible()
    chart.legend.wanted = False  # Compare names its runs in a caption instead
    chart.set_data("rank 0", np.arange(10.0), np.ones(10), "#1f77b4")
    assert not chart.legend.isVisible()


def test_an_unlinked_chart_no_longer_follows_its_leader(qtbot) -> None:
    leader, follower = shown_chart(qtbot), shown_chart(qtbot)
    follower.link_x(leader)
    leader.view.setXRange(10.0, 20.0, padding=0)
    assert follower.view.viewRange()[0] == [10.0, 20.0]
    follower.unlink_x()
    assert follower.x_master is None
    leader.view.setXRange(30.0, 40.0, padding=0)
    assert follower.view.viewRange()[0] == [10.0, 20.0]
    follower.unlink_x()  # twice: nothing to undo


def test_a_note_says_why_a_chart_is_empty_inside_the_plot_and_is_no_data(qtbot) -> None:
    chart = shown_chart(qtbot, 400, 300)
    assert chart.note() == ""
    chart.set_note("Not measured for this script: a reason long enough to wrap over the "
                   "width of a small chart, twice or more")
    assert chart.note().startswith("Not measured for this script: a reason")
    note = chart._note
    assert note is not None and note.isVisible()
    view = chart.view.rect()
    assert note.x() > 0 and note.x() + note.boundingRect().width() <= view.width()  # wrapped
    assert 0 < note.y() < view.height() / 2
    chart.set_data("rank 0", np.arange(10.0), np.arange(10.0) + 100, "#1f77b4")
    assert not chart.legend.isVisible()  # it would lie over the note
    chart.settle()
    (x_lo, x_hi), (lo, hi) = chart.view.viewRange()
    assert x_lo > -1 and x_hi < 11 and lo > 98 and hi < 112  # the note is not in the range
    chart.resize(800, 300)
    qtbot.waitUntil(lambda: chart.view.rect().width() > 600, timeout=2000)
    assert note.boundingRect().width() > 500  # wrapped to the new width
    chart.set_note("")
    assert chart.note() == "" and not note.isVisible() and chart.legend.isVisible()


def test_a_constant_series_is_drawn_inside_its_own_range_not_on_the_zero_line(qtbot) -> None:
    """Issue 30 item 6: "lr: 0.001" was drawn on the 0 line of a +-0.5 axis."""
    chart = shown_chart(qtbot)
    chart.set_data("lr", np.arange(10.0) * 10, np.full(10, 0.001), "#1f77b4")
    chart.settle()
    lo, hi = chart.view.viewRange()[1]
    assert 0.0 < lo < 0.001 < hi < 0.002, (lo, hi)


def test_a_point_with_no_neighbour_is_drawn_as_a_dot(qtbot) -> None:
    """Issue 30 item 6: a chart with one report showed its axes and no point; a line cannot
    draw a point alone."""
    chart = shown_chart(qtbot)
    chart.set_data("rank 0", np.array([10.0]), np.array([2.5]), "#d62728")
    chart.settle()
    assert chart.lone_dots("rank 0") == 1
    (xlo, xhi), (ylo, yhi) = chart.view.viewRange()
    assert xlo < 10.0 < xhi and ylo < 2.5 < yhi
    image = chart.grab().toImage()
    at = chart.mapFromScene(chart.view.mapViewToScene(QPointF(10.0, 2.5)))
    near = {image.pixel(at.x() + dx, at.y() + dy) & 0xFFFFFF
            for dx in (-1, 0, 1) for dy in (-1, 0, 1)}
    assert QColor("#d62728").rgb() & 0xFFFFFF in near, [hex(c) for c in near]
    chart.set_data("rank 0", np.array([10.0, 20.0]), np.array([2.5, 2.0]), "#d62728")
    assert chart.lone_dots("rank 0") == 0  # a line now: no dot
    chart.curves["rank 0"].setVisible(False)  # hidden with its curve
    chart.set_data("rank 0", np.array([10.0]), np.array([2.5]), "#d62728")
    assert not chart._dots[chart.curves["rank 0"]].isVisible()


def test_lone_points_are_those_without_a_finite_neighbour() -> None:
    x = np.arange(7.0)
    y = np.array([1.0, np.nan, 2.0, 3.0, np.nan, 4.0, np.nan])
    lx, ly = lone_points(x, y)
    assert list(lx) == [0.0, 5.0] and list(ly) == [1.0, 4.0]
    assert len(lone_points(x, np.ones(7))[0]) == 0
