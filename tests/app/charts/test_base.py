"""A chart as drawn: its grid and its curves reach the pixels."""

from __future__ import annotations

import numpy as np
from PySide6.QtGui import QColor

from app.charts.base import GRID, Chart


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
    chart = Chart("loss", "loss")
    qtbot.addWidget(chart)
    chart.resize(500, 300)
    chart.show()
    x = np.arange(1000.0)
    chart.set_data("rank 0", x, np.sin(x / 50), "#1f77b4")
    counts = _pixels(chart)
    grid = QColor(GRID).rgb() & 0xFFFFFF
    curve = QColor("#1f77b4").rgb() & 0xFFFFFF
    # grid lines in both directions, in exactly the grid colour (no blending with the white)
    assert counts.get(grid, 0) > 500, sorted(counts.items(), key=lambda kv: -kv[1])[:5]
    assert counts.get(curve, 0) > 100
