"""One plot with named curves, drawn the fast way (pen width 1, peak downsampling, clipping)."""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pyqtgraph as pg
from PySide6.QtCore import Qt

from app.export import export_chart

PALETTE = ["#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2",
           "#7f7f7f", "#bcbd22", "#17becf"]
GRID = "#ececec"


def color(i: int) -> str:
    return PALETTE[i % len(PALETTE)]


def steady_range(lo: float, hi: float, parts: int = 8) -> tuple[float, float]:
    """``[lo, hi]`` widened to multiples of a round step (1, 2 or 5 times a power of ten) of
    about a ``parts``-th of its span: as data grows the range changes only when it crosses a
    step, not on every new point."""
    span = hi - lo
    if not (np.isfinite(span) and span > 0):
        return lo, hi
    magnitude = 10.0 ** np.floor(np.log10(span / parts))
    step = next(m * magnitude for m in (1, 2, 5, 10) if m * magnitude >= span / parts)
    return float(np.floor(lo / step) * step), float(np.ceil(hi / step) * step)


class SteadyViewBox(pg.ViewBox):
    """A view box whose auto-range snaps to :func:`steady_range`. A live chart's range would
    otherwise move with every point: each move regenerates the axes (their tick text is the
    dearest part of a paint), recomputes the curves' clipped and downsampled data, and then
    asks for another auto-range pass; with steady ranges a redraw mostly just draws."""

    def childrenBounds(self, frac=None, orthoRange=(None, None), items=None):  # noqa: ANN001, ANN201, N802
        bounds = super().childrenBounds(frac=frac, orthoRange=orthoRange, items=items)
        return [None if b is None else list(steady_range(*b)) for b in bounds]


class Chart(pg.PlotWidget):
    """A plot whose curves are created once by name and then only fed new arrays."""

    def __init__(self, title: str, y_label: str, x_label: str = "step") -> None:
        super().__init__(viewBox=SteadyViewBox())
        self.setBackground("w")
        self.setTitle(title, color="#333", size="10pt")
        self.setLabel("left", y_label)
        self.getAxis("left").enableAutoSIPrefix(False)  # the label already names the unit
        self.setLabel("bottom", x_label)
        self.showGrid(x=True, y=True)
        for side in ("left", "bottom"):
            # An opaque light grid of major and minor ticks: the same look as pyqtgraph's
            # translucent grid (alpha 0.2) at a third of the paint time (docs/BENCHMARKS.md).
            axis = self.getAxis(side)
            axis.setStyle(tickAlpha=255, maxTickLevel=1)
            axis.setTickPen(pg.mkPen(GRID))
        self.legend = self.addLegend(offset=(-10, 10))
        self.curves: dict[str, pg.PlotDataItem] = {}
        self.setClipToView(True)
        menu = self.getPlotItem().getViewBox().menu
        menu.addSeparator()
        menu.addAction("Save chart as PNG or SVG...").triggered.connect(self._save_dialog)

    def curve(self, name: str, color_hex: str, dashed: bool = False,
              faint: bool = False) -> pg.PlotDataItem:
        if name not in self.curves:
            style = (Qt.PenStyle.DotLine if faint else Qt.PenStyle.DashLine if dashed
                     else Qt.PenStyle.SolidLine)
            pen = pg.mkPen(color_hex + ("90" if faint else ""), width=1, style=style)
            item = self.plot([], [], name=name, pen=pen)
            item.setDownsampling(auto=True, method="peak")
            item.setClipToView(True)
            self.curves[name] = item
        return self.curves[name]

    def set_data(self, name: str, x: np.ndarray, y: np.ndarray, color_hex: str,
                 dashed: bool = False, faint: bool = False) -> None:
        self.curve(name, color_hex, dashed, faint).setData(x, y, connect="finite")

    def set_spread(self, name: str, x: np.ndarray, lo: np.ndarray, mid: np.ndarray,
                   hi: np.ndarray, color_hex: str) -> None:
        """A value across many ranks: its median as a line, its min and max as faint ones
        (curves "NAME median", "NAME min", "NAME max")."""
        self.set_data(f"{name} median", x, mid, color_hex)
        self.set_data(f"{name} min", x, lo, color_hex, faint=True)
        self.set_data(f"{name} max", x, hi, color_hex, faint=True)

    def settle(self) -> None:
        """Fit the auto-ranged axes to the data set since the last paint, now rather than at
        the start of the paint: pyqtgraph does it there (prepareForPaint), and the range change
        then asks for a second paint of the whole chart."""
        self.scene().prepareForPaint()

    def points(self, name: str) -> int:
        """How many points curve ``name`` holds (tests use it to see data arrived)."""
        item = self.curves.get(name)
        if item is None or item.xData is None:
            return 0
        return len(item.xData)

    def _save_dialog(self) -> None:
        from PySide6.QtWidgets import QFileDialog, QMessageBox

        title = self.getPlotItem().titleLabel.text or "chart"
        name = "".join(c if c.isalnum() else "_" for c in title).strip("_").lower() or "chart"
        path, chosen = QFileDialog.getSaveFileName(self, "Save chart", f"{name}.png",
                                                   "PNG (*.png);;SVG (*.svg)")
        if not path:
            return
        if Path(path).suffix.lower() not in (".png", ".svg"):  # the filter chosen decides
            path += ".svg" if chosen.startswith("SVG") else ".png"
        try:
            self.export(path)
        except (OSError, ValueError) as e:
            QMessageBox.warning(self, "Chart not saved", str(e))

    def export(self, path: str | os.PathLike[str], width: int | None = None) -> Path:
        """Save this chart as PNG or SVG, by the suffix of ``path`` (see app.export)."""
        return export_chart(self, path, width=width)
