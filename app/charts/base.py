"""One plot with named curves, drawn the fast way: pen width 1, and each curve thinned to about
two points per pixel column (its min and max there) before pyqtgraph sees it."""

from __future__ import annotations

import contextlib
import os
import time
from pathlib import Path

import numpy as np
import pyqtgraph as pg
from PySide6.QtCore import Qt
from PySide6.QtGui import QColor
from PySide6.QtWidgets import QGraphicsTextItem

from app.charts.legend import BelowLegend
from app.export import export_chart

PALETTE = ["#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2",
           "#7f7f7f", "#bcbd22", "#17becf"]
GRID = "#ececec"
NOTE = "#6b6b6b"  # a chart's note: muted, as a caption


def color(i: int) -> str:
    return PALETTE[i % len(PALETTE)]


def steady_range(lo: float, hi: float, parts: int = 8) -> tuple[float, float]:
    """``[lo, hi]`` widened to multiples of a round step (1, 2 or 5 times a power of ten) of
    about a ``parts``-th of its span: as data grows the range changes only when it crosses a
    step, not on every new point."""
    span = hi - lo
    if span == 0:  # a constant or one point: a tenth either side (pyqtgraph's +-0.5 drew 0.001
        pad = abs(lo) / 10 or 1.0  # on the 0 line)
        return steady_range(lo - pad, hi + pad, parts)
    if not (np.isfinite(span) and span > 0):
        return lo, hi
    magnitude = 10.0 ** np.floor(np.log10(span / parts))
    step = next(m * magnitude for m in (1, 2, 5, 10) if m * magnitude >= span / parts)
    return float(np.floor(lo / step) * step), float(np.ceil(hi / step) * step)


def peak_thin(x: np.ndarray, y: np.ndarray, blocks: int,
              view: tuple[float, float] | None = None) -> tuple[np.ndarray, np.ndarray]:
    """``x, y`` (x ascending) reduced to at most about ``2 * blocks`` points that draw the same
    picture at ``blocks`` pixel columns: consecutive points in blocks, each block's min and max
    (NaN only where the whole block is). Block sizes are powers of two and blocks start at
    multiples of the size, so as data grows the points drawn so far stay put. With ``view``
    (an x range) only the points in it are kept, and one block either side."""
    lo, hi = 0, len(x)
    if hi <= 2 * blocks:
        return x, y
    if view is not None:
        lo = max(int(np.searchsorted(x, view[0])) - 1, 0)
        hi = min(int(np.searchsorted(x, view[1], side="right")) + 1, hi)
    n = hi - lo
    if n <= 2 * blocks:
        return x[lo:hi], y[lo:hi]
    size = 1 << int(np.ceil(np.log2(n / blocks)))
    if view is not None:
        lo = max(lo // size * size - size, 0)
        hi = min(hi + size, len(x))
    count = -(-(hi - lo) // size)  # the last block may be partial: the newest points
    padded = np.full(count * size, np.nan)
    padded[:hi - lo] = y[lo:hi]
    yb = padded.reshape(count, size)
    starts = np.arange(lo, hi, size)
    out_x = np.empty((count, 2))
    out_x[:, 0] = x[starts]
    out_x[:, 1] = x[np.minimum(starts + size, hi) - 1]
    out_y = np.empty((count, 2))
    out_y[:, 0] = np.fmin.reduce(yb, axis=1)
    out_y[:, 1] = np.fmax.reduce(yb, axis=1)
    return out_x.ravel(), out_y.ravel()


Bounds = tuple[float, float, float, float] | None
"""A curve's x min, x max, y min, y max over its finite points (None: it has none)."""


def lone_points(x: np.ndarray, y: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The finite points a line (``connect="finite"``) cannot draw: those without a finite
    neighbour, such as the only report so far, or one between gaps."""
    ok = np.isfinite(x) & np.isfinite(y)
    before = np.concatenate(([False], ok[:-1]))
    after = np.concatenate((ok[1:], [False]))
    lone = ok & ~before & ~after
    return x[lone], y[lone]


def finite_bounds(x: np.ndarray, y: np.ndarray) -> Bounds:
    keep = np.isfinite(x) & np.isfinite(y)
    if not keep.any():
        return None
    x, y = x[keep], y[keep]
    return float(x.min()), float(x.max()), float(y.min()), float(y.max())


class SteadyViewBox(pg.ViewBox):
    """A view box whose auto-range snaps to :func:`steady_range`. A live chart's range would
    otherwise move with every point: each move regenerates the axes (their tick text is the
    dearest part of a paint), recomputes the curves' clipped and downsampled data, and then
    asks for another auto-range pass; with steady ranges a redraw mostly just draws.

    ``known`` holds the bounds of the items whose data its chart set (computed once then, from
    the thinned points): the auto-range takes those instead of asking each item for them,
    which pyqtgraph does for every axis on every pass."""

    def __init__(self, from_zero: bool = False) -> None:
        super().__init__()
        self.known: dict[pg.GraphicsObject, Bounds] = {}
        self.from_zero = from_zero
        """The y range always reaches down to 0 (memory, utilization: a 0.1% change is not a
        cliff)."""

    def childrenBounds(self, frac=None, orthoRange=(None, None), items=None):  # noqa: ANN001, ANN201, N802
        items = self.addedItems if items is None else items
        others = [item for item in items if item not in self.known]
        bounds = super().childrenBounds(frac=frac, orthoRange=orthoRange, items=others) \
            if others else [None, None]
        for item in items:
            b = self.known.get(item)
            if b is None or not item.isVisible():
                continue
            for axis, (lo, hi) in enumerate((b[:2], b[2:])):
                was = bounds[axis]
                bounds[axis] = [lo, hi] if was is None else [min(was[0], lo), max(was[1], hi)]
        if self.from_zero and bounds[1] is not None:
            bounds[1] = [min(0.0, bounds[1][0]), max(0.0, bounds[1][1])]
        return [None if b is None else list(steady_range(*b)) for b in bounds]

    def linkedViewChanged(self, view, axis):  # noqa: ANN001, ANN201, N802 (pyqtgraph's)
        """Show the same x range as the linked chart. pyqtgraph lines linked views up by their
        place on the screen where they overlap: a half-width chart under the loss chart would
        show only the steps drawn above it."""
        if axis != pg.ViewBox.XAxis:
            return super().linkedViewChanged(view, axis)
        if self.linksBlocked or view is None:
            return None
        view.blockLink(True)
        try:
            self.enableAutoRange(pg.ViewBox.XAxis, False)
            self.setXRange(*view.viewRange()[0], padding=0)
        finally:
            view.blockLink(False)
        return None


class IntegerAxis(pg.AxisItem):
    """An axis of counts (devices): ticks only at whole numbers."""

    def tickValues(self, minVal, maxVal, size):  # noqa: ANN001, ANN201, N802 (pyqtgraph's)
        levels = []
        for spacing, values in super().tickValues(minVal, maxVal, size):
            whole = [v for v in values if float(v).is_integer()]
            if spacing >= 1 and whole:
                levels.append((spacing, whole))
        if not levels:  # a narrow range: every whole number in it
            levels = [(1.0, [float(v) for v in range(int(np.ceil(minVal)),
                                                      int(np.floor(maxVal)) + 1)])]
        return levels


class Chart(pg.PlotWidget):
    """A plot whose curves are created once by name and then only fed new arrays."""

    def __init__(self, title: str, y_label: str, x_label: str = "step", *,
                 from_zero: bool = False, x_counts: bool = False) -> None:
        self.view = SteadyViewBox(from_zero)
        super().__init__(viewBox=self.view,
                         axisItems={"bottom": IntegerAxis("bottom")} if x_counts else None)
        self.setBackground("w")
        self.setFocusPolicy(Qt.FocusPolicy.NoFocus)  # nothing to do by keys: Tab passes over
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
            # Behind the view box: pyqtgraph draws an axis's grid lines with the axis, over
            # the data, so a loss near 0 or a flat 1.0 would vanish along a grid line.
            axis.setZValue(-1)
        self.legend = BelowLegend(self.getPlotItem())  # under the x axis: it covers nothing
        self.curves: dict[str, pg.PlotCurveItem | pg.PlotDataItem] = {}
        self._data: dict[str, tuple[np.ndarray, np.ndarray]] = {}  # as given, before thinning
        self._dots: dict[pg.GraphicsObject, pg.ScatterPlotItem] = {}  # a curve's lone points
        self.marks: list[pg.InfiniteLine] = []  # vertical lines at events, until reset()
        self._thinned_for: tuple[int, tuple[float, float] | None] = (0, None)
        self.paint_s = 0.0  # how long its last paint took (the dashboard budgets frames)
        self.log_y = False
        self.x_master: Chart | None = None  # the chart whose x range this one follows
        self._follow_master: object = None  # the slot link_x connected to the master's view
        self._note: QGraphicsTextItem | None = None
        # pyqtgraph's "A" (auto-range) button, in the corner, whenever the view is zoomed or
        # panned, not only while the mouse is over the chart: one click shows all the data.
        item = self.getPlotItem()
        item.updateButtons = self._update_reset_button  # type: ignore[method-assign]
        item.autoBtn.setToolTip("reset the view: show all the data")
        self.view.sigXRangeChanged.connect(self._rethin)  # zoomed, panned, or auto-ranged
        self.view.sigResized.connect(self._rethin)
        menu = self.view.menu
        menu.addSeparator()
        menu.addAction("Save chart as PNG or SVG...").triggered.connect(self._save_dialog)

    def curve(self, name: str, color_hex: str, dashed: bool = False, faint: bool = False,
              symbol: str | None = None) -> pg.PlotCurveItem | pg.PlotDataItem:
        """Curve ``name``, made on first use: a bare line (pyqtgraph's PlotCurveItem, the
        cheapest item that draws one), or, with ``symbol``, a line with a marker per point."""
        if name not in self.curves:
            style = (Qt.PenStyle.DotLine if faint else Qt.PenStyle.DashLine if dashed
                     else Qt.PenStyle.SolidLine)
            pen = pg.mkPen(color_hex + ("90" if faint else ""), width=1, style=style)
            item: pg.PlotCurveItem | pg.PlotDataItem
            if symbol is None:
                item = pg.PlotCurveItem(name=name, pen=pen)
            else:
                item = pg.PlotDataItem(name=name, pen=pen, symbol=symbol, symbolPen=color_hex,
                                       symbolBrush=color_hex)
            self.addItem(item)
            self.curves[name] = item
        return self.curves[name]

    def set_data(self, name: str, x: np.ndarray, y: np.ndarray, color_hex: str,
                 dashed: bool = False, faint: bool = False, symbol: str | None = None) -> None:
        """Give curve ``name`` these points (x ascending); it draws them thinned to the chart's
        width (:func:`peak_thin`), and thins them again when the x range or the size changes."""
        self._data[name] = (x, y)
        self._show(self.curve(name, color_hex, dashed, faint, symbol), x, y)
        if not self.legend.isVisible() and len(x) and not self.note():
            self.legend.show_entries(True)  # once a curve has a point: no legend of nothing

    def paintEvent(self, event) -> None:  # noqa: ANN001, N802
        t0 = time.perf_counter()
        super().paintEvent(event)
        self.paint_s = time.perf_counter() - t0

    def link_x(self, master: Chart) -> None:
        """Show the x range of ``master`` (a step chart beside it): zooming or panning either
        moves both, and the reset button of either shows all of both again. The x axis is
        fitted to the data by the master alone; this chart's own y axis stays its own."""
        self.x_master = master
        self.setXLink(master)
        self.view.disableAutoRange(pg.ViewBox.XAxis)
        self._follow_master = lambda _v: self._update_reset_button()
        master.view.sigStateChanged.connect(self._follow_master)
        self.getPlotItem().autoBtn.clicked.connect(self._reset_linked_view)

    def unlink_x(self) -> None:
        """Undo :meth:`link_x` (a chart about to be deleted: the master keeps no slot of it)."""
        if self.x_master is None:
            return
        self.x_master.view.sigStateChanged.disconnect(self._follow_master)
        self.getPlotItem().autoBtn.clicked.disconnect(self._reset_linked_view)
        self.setXLink(None)
        self.x_master = self._follow_master = None

    def set_note(self, text: str) -> None:
        """A muted note over the plot, wrapped to its width ("" removes it): why the chart
        shows nothing, e.g. a value a user's script cannot give. It is no data (no range), and
        the legend (of curves with nothing drawn) stays hidden while it is shown."""
        if self._note is None:
            if not text:
                return
            self._note = QGraphicsTextItem(self.view)  # in the view box's pixels, not data's
            self._note.setDefaultTextColor(QColor(NOTE))
            self._note.setZValue(1e6)  # over the curves
            self.view.sigResized.connect(self._place_note)
        self._note.setPlainText(text)
        self._note.setVisible(bool(text))
        self._place_note()
        self.legend.show_entries(any(len(x) for x, _y in self._data.values()) and not text)

    def note(self) -> str:
        """The note shown over the plot ("" for none)."""
        note = self._note
        return note.toPlainText() if note is not None and note.isVisible() else ""

    def _place_note(self) -> None:
        """The note across the view, a margin either side, halfway down."""
        if self._note is None:
            return
        rect = self.view.rect()
        self._note.setTextWidth(max(rect.width() - 20, 60.0))
        self._note.setPos(10, max((rect.height() - self._note.boundingRect().height()) / 2, 0))

    def x_auto(self) -> bool:
        """Whether the x axis fits the data (a linked chart's: whether its master's does)."""
        view = self.view if self.x_master is None else self.x_master.view
        return bool(view.autoRangeEnabled()[0])

    def _reset_linked_view(self) -> None:
        """After pyqtgraph's own reset (this chart's x and y auto-ranged): x goes back to
        following the master, and the master shows all its data."""
        assert self.x_master is not None
        self.view.disableAutoRange(pg.ViewBox.XAxis)
        self.x_master.view.enableAutoRange(pg.ViewBox.XAxis)

    def _update_reset_button(self) -> None:
        with contextlib.suppress(RuntimeError):  # the chart is being deleted
            fitted = self.x_auto() and bool(self.view.autoRangeEnabled()[1])
            self.getPlotItem().autoBtn.setVisible(not fitted)

    def set_log_y(self, on: bool) -> None:
        """A logarithmic y axis (values <= 0 are left out), or back to linear; shows all."""
        if on == self.log_y:
            return
        self.log_y = on
        self.getAxis("left").setLogMode(on)
        for name, (x, y) in self._data.items():
            self._show(self.curves[name], x, y)
        self.view.enableAutoRange()

    def _show(self, item: pg.PlotCurveItem | pg.PlotDataItem, x: np.ndarray,
              y: np.ndarray) -> None:
        if self.log_y:
            with np.errstate(divide="ignore", invalid="ignore"):
                y = np.where(y > 0, np.log10(np.where(y > 0, y, 1.0)), np.nan)
        x, y = self._thin(x, y)
        self.view.known[item] = finite_bounds(x, y)
        item.setData(x, y, connect="finite")
        self._show_lone_points(item, x, y)

    def _show_lone_points(self, item: pg.PlotCurveItem | pg.PlotDataItem, x: np.ndarray,
                          y: np.ndarray) -> None:
        """A dot at each point the line cannot draw (see :func:`lone_points`), in the line's
        colour and shown with it; none for a curve with markers of its own."""
        if isinstance(item, pg.PlotDataItem) and item.opts.get("symbol") is not None:
            return
        lx, ly = lone_points(x, y)
        dots = self._dots.get(item)
        if dots is None:
            if not len(lx):
                return
            pen = pg.mkPen(item.opts["pen"])
            dots = pg.ScatterPlotItem(size=6, pen=pen, brush=pg.mkBrush(pen.color()))
            self.addItem(dots)  # no name: not in the legend
            self._dots[item] = dots
            dots.setVisible(item.isVisible())
            item.visibleChanged.connect(lambda: dots.setVisible(item.isVisible()))
        self.view.known[dots] = finite_bounds(lx, ly)
        dots.setData(lx, ly)

    def lone_dots(self, name: str) -> int:
        """How many lone points curve ``name`` draws as dots (tests)."""
        dots = self._dots.get(self.curves.get(name))
        return 0 if dots is None else len(dots.data)

    def _thin(self, x: np.ndarray, y: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        self._thinned_for = self._thinning()
        return peak_thin(x, y, *self._thinned_for)

    def _thinning(self) -> tuple[int, tuple[float, float] | None]:
        """The pixel columns to thin to, and the x range to clip to (None while the x axis
        fits all the data)."""
        view = self.view
        width = int(view.width()) or 1000  # not laid out yet: a wide window's worth
        if self.x_auto():
            return width, None
        lo, hi = view.viewRange()[0]
        return width, (float(lo), float(hi))

    def _rethin(self) -> None:
        """Thin again from the data as given if the width or the zoom changed (an auto-ranged
        x axis that moves on with the data changes nothing: all of it is thinned anyway)."""
        if self._thinning() == self._thinned_for:
            return
        for name, (x, y) in self._data.items():
            self._show(self.curves[name], x, y)

    def mark(self, x: float, label: str, color_hex: str, tooltip: str = "") -> pg.InfiniteLine:
        """A dashed vertical line at ``x`` with ``label`` near its top and ``tooltip`` on it,
        kept through redraws until :meth:`reset`. It takes no part in the auto-range."""
        line = pg.InfiniteLine(
            pos=x, angle=90, pen=pg.mkPen(color_hex, width=1, style=Qt.PenStyle.DashLine),
            label=label, labelOpts={"position": 0.92, "color": color_hex,
                                    "anchors": [(0, 0.5), (0, 0.5)]})
        line.setToolTip(tooltip)
        self.addItem(line, ignoreBounds=True)
        self.marks.append(line)
        return line

    def reset(self) -> None:
        """Remove every curve and mark and forget any zoom: the next run's data is shown whole,
        and until it arrives the axes show nothing of the last run's range."""
        self.clear()
        self.marks.clear()
        self.curves.clear()
        self._data.clear()
        self._dots.clear()
        self.view.known.clear()
        self.legend.show_entries(False)  # until the next run's first curve
        self.view.setRange(xRange=(0.0, 1.0), yRange=(0.0, 1.0), padding=0.0)
        self.view.enableAutoRange()
        if self.x_master is not None:  # x follows the master's, which fits the data
            self.view.disableAutoRange(pg.ViewBox.XAxis)
            self.x_master.view.enableAutoRange(pg.ViewBox.XAxis)

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
        """How many points curve ``name`` draws, before thinning (tests use it to see data
        arrived)."""
        data = self._data.get(name)
        return 0 if data is None else len(data[0])

    def _save_dialog(self) -> None:
        from PySide6.QtWidgets import QFileDialog, QMessageBox

        title = self.getPlotItem().titleLabel.text or "chart"
        name = "".join(c if c.isalnum() else "_" for c in title).strip("_").lower() or "chart"
        from app.dialogs import save_folder, tell

        path, chosen = QFileDialog.getSaveFileName(self, "Save chart",
                                                   str(save_folder(self) / f"{name}.png"),
                                                   "PNG (*.png);;SVG (*.svg)")
        if not path:
            return
        if Path(path).suffix.lower() not in (".png", ".svg"):  # the filter chosen decides
            path += ".svg" if chosen.startswith("SVG") else ".png"
        try:
            tell(self, f"chart saved to {self.export(path)}")
        except (OSError, ValueError) as e:
            QMessageBox.warning(self, "Chart not saved", str(e))

    def export(self, path: str | os.PathLike[str], width: int | None = None) -> Path:
        """Save this chart as PNG or SVG, by the suffix of ``path`` (see app.export)."""
        return export_chart(self, path, width=width)
