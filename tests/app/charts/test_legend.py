"""Legends under the plot, never over a point; captions cut only with an ellipsis and the whole
text in the tooltip."""

from __future__ import annotations

import numpy as np
import pyqtgraph as pg
import pytest
from PySide6.QtCore import QPointF
from PySide6.QtWidgets import QLabel, QWidget

from app.charts.base import Chart, color
from app.charts.caption import ELLIPSIS, ElidedLabel
from app.dashboard import Dashboard
from app.metric_store import MetricStore
from tests.app.conftest import rank_rows, shown_chart


def covered_points(chart: Chart) -> list[tuple[str, float, float]]:
    """The plotted points (every curve's, as drawn) that lie under the legend's box."""
    legend = chart.legend
    if not legend.isVisible():
        return []
    box = legend.sceneBoundingRect()
    hidden = []
    for name, curve in chart.curves.items():
        xs, ys = curve.getData()
        for x, y in zip(xs, ys, strict=True):
            if np.isfinite(x) and np.isfinite(y) and box.contains(
                    chart.view.mapViewToScene(QPointF(float(x), float(y)))):
                hidden.append((name, float(x), float(y)))
    return hidden


@pytest.mark.parametrize("width,height,curves", [(500, 300, 2), (300, 200, 4), (260, 180, 9)])
def test_no_plotted_point_lies_under_the_legend(qtbot, width: int, height: int,
                                                curves: int) -> None:
    chart = shown_chart(qtbot, width, height)
    x = np.arange(0.0, 200.0)
    for i in range(curves):  # lines across the whole plot, corners included: nowhere is free
        chart.set_data(f"rank {i} exposed", x, np.linspace(i, 100.0 - i, len(x)), color(i))
        chart.set_data(f"rank {i}", x, np.linspace(100.0 - i, i, len(x)), color(i), dashed=True)
    chart.settle()
    qtbot.wait(50)  # the layout places the legend's rows
    assert chart.legend.isVisible() and len(chart.legend.items) == 2 * curves
    assert covered_points(chart) == []
    # All of the legend is inside the chart: rows wrapped rather than cut off.
    inside = chart.getPlotItem().sceneBoundingRect().adjusted(-1, -1, 1, 1)
    assert inside.contains(chart.legend.sceneBoundingRect())
    assert chart.legend.columnCount < 2 * curves or width >= 500


def test_the_old_floating_legend_would_have_been_caught(qtbot) -> None:
    """The check above fails where a legend is over the data, as pyqtgraph's own is."""
    chart = shown_chart(qtbot)
    x = np.arange(0.0, 200.0)
    chart.set_data("rank 0", x, np.linspace(0, 100.0, len(x)), color(0))
    chart.set_data("rank 1", x, np.full(len(x), 97.0), color(1))  # along the top edge
    floating = pg.LegendItem(offset=(-10, 10))  # pyqtgraph's: top right, over the view
    floating.setParentItem(chart.view)
    floating.addItem(chart.curves["rank 0"], "rank 0")
    chart.legend = floating  # what covered_points looks at
    chart.settle()
    qtbot.wait(50)
    assert covered_points(chart)


def test_a_legend_not_shown_takes_no_height_from_its_plot(qtbot) -> None:
    """Compare's charts name their runs in a caption (wanted = False): five named curves in
    a hidden legend once held a row five entries tall under the x axis, half the chart."""
    charts = [shown_chart(qtbot, 500, 300) for _ in range(2)]
    charts[1].legend.wanted = False
    x = np.arange(0.0, 50.0)
    for chart in charts:
        for i in range(5):
            chart.set_data(f"run {i}", x, x * (i + 1), color(i))
        chart.settle()
    qtbot.wait(50)
    shown, hidden = (c.legend for c in charts)
    assert shown.isVisible() and not hidden.isVisible() and len(hidden.items) == 5
    views = [c.view.sceneBoundingRect().height() for c in charts]
    assert views[1] >= views[0] + shown.sceneBoundingRect().height() - 1
    charts[0].legend.show_entries(False)  # a shown legend hidden again gives its row back
    qtbot.wait(50)
    assert abs(charts[0].view.sceneBoundingRect().height() - views[1]) <= 1


def cut_labels(root: QWidget) -> list[str]:
    """The visible, non-wrapping labels whose text is wider than the label and that do not
    hold the whole text in their tooltip."""
    cut = []
    for label in root.findChildren(QLabel):
        if not label.isVisible() or label.wordWrap() or not label.text():
            continue
        metrics = label.fontMetrics()
        room = label.contentsRect().width() + 1
        for line in label.text().split("\n"):
            if metrics.horizontalAdvance(line) > room:
                cut.append(f"{label.objectName() or type(label).__name__}: {line!r}")
            elif line.endswith(ELLIPSIS) and label.toolTip() == "":
                cut.append(f"{label.objectName()}: elided with no tooltip: {line!r}")
    return cut


def test_a_caption_too_long_ends_in_an_ellipsis_and_says_it_all_in_its_tooltip(qtbot) -> None:
    holder = QWidget()
    qtbot.addWidget(holder)
    label = ElidedLabel("short\n" + "a long line of the breakdown " * 8)
    label.setParent(holder)
    label.resize(200, 60)
    holder.show()
    qtbot.waitExposed(holder)
    assert label.elided() and label.text().split("\n")[1].endswith(ELLIPSIS)
    assert label.text().split("\n")[0] == "short"
    assert label.toolTip() == label.full_text()
    assert cut_labels(holder) == []
    label.setToolTip("")  # an ellipsis with no tooltip is a cut caption: the check sees it
    assert cut_labels(holder)
    label.resize(4000, 60)  # room for all: nothing elided, no tooltip
    assert not label.elided() and label.toolTip() == ""
    plain = QLabel("a long line of the breakdown " * 8, holder)  # cut by Qt, no tooltip
    plain.resize(200, 20)
    plain.show()
    assert len(cut_labels(holder)) == 1


@pytest.mark.parametrize("width,height", [(1000, 700), (700, 500)])
def test_the_dashboards_legends_and_captions_cover_and_cut_nothing(qtbot, width: int,
                                                                   height: int) -> None:
    dash = Dashboard(MetricStore())
    dash.timer.stop()
    dash.show_welcome(False)  # a run is shown (the window does this)
    qtbot.addWidget(dash)
    dash.resize(width, height)
    dash.show()
    qtbot.waitExposed(dash)
    for step in range(10, 210, 10):
        rows = rank_rows(4, step)
        for row in rows:
            row["logged"] = {"lr": 0.001}
        dash.store.add({"type": "metrics", "time": float(step), "step": step, "epoch": 0,
                        "total_steps": 1000, "ranks": rows})
    dash.redraw(budget_s=None)
    qtbot.wait(100)
    for chart in dash.charts:
        chart.settle()
        assert covered_points(chart) == [], chart.getPlotItem().titleLabel.text
    assert dash.sync.caption.full_text().count("\n") >= 3  # four ranks' breakdowns and more
    assert cut_labels(dash) == []
