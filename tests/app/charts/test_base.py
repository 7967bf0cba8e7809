"""A chart as drawn: its grid and its curves reach the pixels."""

from __future__ import annotations

import numpy as np
from PySide6.QtGui import QColor

from app.charts.base import GRID, Chart, steady_range
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
    assert steady_range(5.0, 5.0) == (5.0, 5.0)  # nothing to widen: pyqtgraph pads it
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
