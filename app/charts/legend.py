"""A chart's legend under its plot, never over it: one row of entries (more rows when they do
not fit the width), between the x axis and the chart's bottom edge, so no curve, point or
note runs under it. Clicking an entry hides or shows its curve (pyqtgraph's own)."""

from __future__ import annotations

import pyqtgraph as pg

LEGEND_ROW = 4
"""The row of the plot item's grid the legend takes: pyqtgraph puts the title in row 0, the
top axis in 1, the view box in 2 and the bottom axis in 3."""
ENTRY_GAP = 14.0
SAMPLE_W = 20.0
"""The width of an entry's sample (pyqtgraph's ItemSample draws in 20 x 20)."""
"""Pixels between one entry and the next in a row."""


class BelowLegend(pg.LegendItem):
    """pyqtgraph's legend, laid out in its plot item's grid under the x axis instead of
    floating over the view box. Its columns follow the plot's width (:meth:`reflow`)."""

    def __init__(self, plot: pg.PlotItem) -> None:
        super().__init__(offset=None, horSpacing=4, verSpacing=0, labelTextSize="8pt",
                         colCount=1)
        self.plot = plot
        self.wanted = True
        """Shown once its chart has a curve (False: never, e.g. Compare's, whose caption names
        the runs)."""
        self._shape: tuple[int, int, float, float] | None = None  # as last laid out
        plot.legend = self  # pyqtgraph adds each named item to plot.legend
        plot.layout.addItem(self, LEGEND_ROW, 1)
        self._placed = True  # in the plot's grid (it leaves it while hidden)
        plot.vb.sigResized.connect(self.reflow)
        self.show_entries(False)

    def show_entries(self, on: bool) -> None:
        """Show the legend, or hide it and give its height back to the plot: hidden, it leaves
        the plot's grid (a hidden item still holds its row at its entries' height)."""
        on = on and self.wanted
        if on and not self._placed:
            self.plot.layout.addItem(self, LEGEND_ROW, 1)
        elif not on and self._placed:
            self.plot.layout.removeItem(self)
        self._placed = on
        self.setVisible(on)
        if on:
            self.reflow()
        else:
            self._shape = None
            self.plot.layout.setRowFixedHeight(LEGEND_ROW, 0.0)

    def addItem(self, item, name):  # noqa: ANN001, ANN201, N802 (pyqtgraph's)
        super().addItem(item, name)
        self.reflow()

    def removeItem(self, item):  # noqa: ANN001, ANN201, N802 (pyqtgraph's)
        super().removeItem(item)
        self.reflow()

    def reflow(self, *_: object) -> None:
        """As many columns as the widest entry allows across the view box's width, and the
        row's height fitted to the rows that makes."""
        if not self.items or not self.isVisible():
            return
        label_w = max(label.item.boundingRect().width() for _sample, label in self.items)
        entry = SAMPLE_W + label_w + ENTRY_GAP
        width = self.plot.vb.width() or 400.0
        columns = max(1, min(len(self.items), int(width // entry)))
        rows = -(-len(self.items) // columns)
        height = rows * max(label.item.boundingRect().height() for _sample, label in self.items)
        shape = (len(self.items), columns, label_w, height)
        if shape == self._shape:  # a new layout resizes the view box: no loop
            return
        self._shape = shape
        self.setColumnCount(columns)
        for col in range(0, 2 * columns, 2):  # the same width for every entry: columns align
            self.layout.setColumnFixedWidth(col, SAMPLE_W)
            self.layout.setColumnFixedWidth(col + 1, label_w + ENTRY_GAP)
        self.plot.layout.setRowFixedHeight(LEGEND_ROW, shape[3])
        self.updateSize()
