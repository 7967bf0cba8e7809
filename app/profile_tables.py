"""The view of a profile's summary (issue 31; :mod:`ddp_engine.common.profile_summary` makes
it): the headline and the last rank to arrive, then three tabs (every rank's step split into its
parts, as a table and as one stacked bar per rank; the collectives and their bus bandwidth; the
slowest rank's top operators), and where the traces are.

The tables are as tall as their rows and the tabs scroll, so no rank is ever left out.
"""

from __future__ import annotations

import html
from typing import Any

from PySide6.QtCore import QEvent, QPointF, QRectF, Qt, QUrl
from PySide6.QtGui import (
    QColor,
    QDesktopServices,
    QHelpEvent,
    QIcon,
    QPainter,
    QPaintEvent,
    QPixmap,
    QResizeEvent,
)
from PySide6.QtWidgets import (
    QBoxLayout,
    QHBoxLayout,
    QLabel,
    QPushButton,
    QScrollArea,
    QSizePolicy,
    QTableWidgetItem,
    QTabWidget,
    QToolTip,
    QVBoxLayout,
    QWidget,
)

from app.doctor_tables import FitTable
from ddp_engine.common.profile_summary import PARTS
from ddp_engine.common.profile_text import (
    PERFETTO,
    headline,
    last_text,
    part_title,
    share_text,
    size_text,
)

PART_COLOURS = {"compute": "#4e79a7", "optimizer": "#b07aa1", "data": "#59a14f",
                "comm_exposed": "#e15759", "idle": "#bab0ac"}
"""A fixed colour per part of the step, the same in the bars, their legend and the table."""
TABS_HEIGHT = 230
BARS_MIN_WIDTH = 360
"""Narrower than the table plus this, the bars go under the table."""
"""The tabs at most, in pixels (with the headline and the folder line the view is about
300 px); shorter when every page is (a few ranks); their pages scroll."""
MIN_FIT_WIDTH = 600
"""The width the tabs' height is fitted for before they are laid out."""
TOP_OPERATORS = 5
COLLECTIVE_COLUMNS = ["kind", "group", "calls/step", "size", "time ms", "exposed ms",
                      "overlapped", "skew ms mean/max", "last (rank x calls)"]
OPERATOR_COLUMNS = ["self ms", "calls/step", "operator"]


def rank_columns(timeline: str) -> list[str]:
    """The per-rank table's titles: the part columns read as :func:`part_title` says."""
    return ["rank", "step ms", *(part_title(p, timeline) for p in PARTS), "comm ms",
            "overlapped"]


def bandwidth_line(b: dict[str, Any]) -> str:
    """One bus bandwidth line, worded as ``python -m ddp_engine profile`` prints it."""
    ref = (f"; doctor measured {b['doctor_busbw_gbs']:.2f} GB/s at "
           f"{size_text(b.get('doctor_bytes'))} ({share_text(b.get('of_doctor'))} of it)"
           if b.get("doctor_busbw_gbs") else "; no doctor measurement to compare with")
    return (f"Bus bandwidth, {b['kind']} of {size_text(b.get('bytes'))}: "
            f"{b['busbw_gbs']:.2f} GB/s{ref}")


def slowest_rank(summary: dict[str, Any]) -> dict[str, Any] | None:
    """The per-rank entry with the longest step (None: no rank)."""
    return max(summary["per_rank"], key=lambda r: r["step_time_ms"], default=None)


def _swatch(colour: str) -> QIcon:
    pixmap = QPixmap(10, 10)
    pixmap.fill(QColor(colour))
    return QIcon(pixmap)


class PartBars(QWidget):
    """One horizontal stacked bar per rank: its step's parts, each in its part's colour, the
    longest step as wide as the widget allows (so the ranks compare at a glance). Hovering a
    segment names it. Placed beside the per-rank table, each bar on its rank's row."""

    GAP = 5
    """Between two bars, in pixels."""

    def __init__(self) -> None:
        super().__init__()
        self.setObjectName("profile_bars")
        self.setSizePolicy(QSizePolicy.Policy.Expanding, QSizePolicy.Policy.Fixed)
        self.setMinimumWidth(240)
        self.timeline = "cpu"
        self.rows: list[tuple[int, dict[str, float]]] = []
        """(rank, ms per step of each part) per rank, in the summary's order."""
        self.top = 0
        self.row_height = 22

    def set_summary(self, summary: dict[str, Any], top: int = 0, row_height: int = 22) -> None:
        """Bars for ``summary``'s ranks, the first ``top`` pixels down, one per
        ``row_height`` (a table's header and rows, to sit beside them)."""
        self.timeline = summary["timeline"]
        self.rows = [(int(r["rank"]), {p: float(r["parts_ms"].get(p) or 0.0) for p in PARTS})
                     for r in summary["per_rank"]]
        self.top, self.row_height = top, max(12, row_height)
        self.setFixedHeight(self.top + len(self.rows) * self.row_height + 2)
        self.update()

    def _bar_top(self, i: int) -> float:
        return self.top + i * self.row_height + self.GAP / 2

    @property
    def bar_height(self) -> int:
        return self.row_height - self.GAP

    def _columns(self) -> tuple[float, float, float]:
        """Where the bars start, their full width and the longest step's ms."""
        fm = self.fontMetrics()
        label_w = fm.horizontalAdvance(f"rank {max((r for r, _ in self.rows), default=0)}") + 8
        value_w = fm.horizontalAdvance("00000.00 ms") + 8
        longest = max((sum(parts.values()) for _, parts in self.rows), default=0.0)
        return label_w, max(1.0, self.width() - label_w - value_w), longest

    def segments(self) -> list[list[tuple[str, QRectF]]]:
        """Per rank, its parts' rectangles left to right (parts of 0 ms have none)."""
        x0, full, longest = self._columns()
        out = []
        for i, (_, parts) in enumerate(self.rows):
            y = self._bar_top(i)
            x, row = x0, []
            for part in PARTS:
                w = full * parts[part] / longest if longest > 0 else 0.0
                if w > 0:
                    row.append((part, QRectF(x, y, w, self.bar_height)))
                x += w
            out.append(row)
        return out

    def bar_rects(self) -> list[QRectF]:
        """Each rank's whole bar (one per rank, even an empty one)."""
        x0, full, longest = self._columns()
        return [QRectF(x0, self._bar_top(i),
                       full * sum(parts.values()) / longest if longest > 0 else 0.0,
                       self.bar_height) for i, (_, parts) in enumerate(self.rows)]

    def paintEvent(self, event: QPaintEvent) -> None:  # noqa: N802 (Qt's name)
        painter = QPainter(self)
        text_colour = self.palette().color(self.foregroundRole())
        x0, _, _ = self._columns()
        for (rank, parts), segments, bar in zip(self.rows, self.segments(), self.bar_rects(),
                                                strict=True):
            for part, rect in segments:
                painter.fillRect(rect, QColor(PART_COLOURS[part]))
            painter.setPen(text_colour)
            label = QRectF(0, bar.top() - 2, x0 - 8, bar.height() + 4)
            painter.drawText(label, Qt.AlignmentFlag.AlignRight | Qt.AlignmentFlag.AlignVCenter,
                             f"rank {rank}")
            value = QRectF(bar.right() + 6, bar.top() - 2, 200, bar.height() + 4)
            painter.drawText(value, Qt.AlignmentFlag.AlignLeft | Qt.AlignmentFlag.AlignVCenter,
                             f"{sum(parts.values()):.2f} ms")
        painter.end()

    def tip_at(self, pos: QPointF) -> str | None:
        """What the segment at ``pos`` is (None: no segment there)."""
        for (rank, parts), segments in zip(self.rows, self.segments(), strict=True):
            step = sum(parts.values())
            for part, rect in segments:
                if rect.contains(pos):
                    return (f"rank {rank}: {part_title(part, self.timeline)} "
                            f"{parts[part]:.2f} ms of {step:.2f} ms "
                            f"({share_text(parts[part] / step)})")
        return None

    def event(self, event: QEvent) -> bool:
        if event.type() == QEvent.Type.ToolTip and isinstance(event, QHelpEvent):
            tip = self.tip_at(QPointF(event.pos()))
            if tip:
                QToolTip.showText(event.globalPos(), tip, self)
            else:
                QToolTip.hideText()
            return True
        return super().event(event)


def _note(name: str, rich: bool = False) -> QLabel:
    label = QLabel()
    label.setObjectName(name)
    label.setWordWrap(True)
    label.setTextFormat(Qt.TextFormat.RichText if rich else Qt.TextFormat.PlainText)
    label.setTextInteractionFlags(Qt.TextInteractionFlag.TextBrowserInteraction if rich
                                  else Qt.TextInteractionFlag.TextSelectableByMouse)
    label.setOpenExternalLinks(rich)
    return label


def _scrolled(*rows: QWidget | QBoxLayout) -> QScrollArea:
    """A tab's page: ``rows`` top to bottom, scrolling when taller than the tab."""
    page = QWidget()
    layout = QVBoxLayout(page)
    layout.setContentsMargins(4, 4, 4, 4)
    for row in rows:
        if isinstance(row, QBoxLayout):
            layout.addLayout(row)
        else:
            layout.addWidget(row)
    layout.addStretch(1)
    area = QScrollArea()
    area.setWidgetResizable(True)
    area.setFrameShape(QScrollArea.Shape.NoFrame)
    area.setWidget(page)
    return area


def _left(table: FitTable) -> QHBoxLayout:
    """``table`` as wide as its columns, the rest of the row empty."""
    row = QHBoxLayout()
    row.addWidget(table)
    row.addStretch(1)
    return row


class SummaryView(QWidget):
    """A profile's summary; :meth:`show_summary` fills it, ``open_button`` opens its
    folder."""

    def __init__(self) -> None:
        super().__init__()
        self.folder = ""
        self.headline = _note("profile_headline")
        font = self.headline.font()
        font.setBold(True)
        self.headline.setFont(font)
        self.last = _note("profile_last")
        self.ranks = FitTable("profile_ranks", rank_columns("cpu"),
                              numbers=tuple(range(1, len(PARTS) + 5)))
        self.missing = _note("profile_missing")
        self.legend = _note("profile_legend", rich=True)
        self.bars = PartBars()
        bars = QVBoxLayout()
        bars.setSpacing(2)
        bars.addWidget(self.bars)
        bars.addWidget(self.legend)
        bars.addStretch(1)
        ranks_row = self.ranks_row = QBoxLayout(QBoxLayout.Direction.LeftToRight)
        ranks_row.addWidget(self.ranks, 0, Qt.AlignmentFlag.AlignTop)
        ranks_row.addSpacing(12)
        ranks_row.addLayout(bars, 1)
        self._summary: dict[str, Any] | None = None
        self.collectives = FitTable("profile_collectives", COLLECTIVE_COLUMNS,
                                    numbers=(2, 3, 4, 5, 6, 7))
        self.no_collectives = QLabel("No collective was recorded in these steps.")
        self.bandwidth = _note("profile_bandwidth")
        self.operators_title = _note("profile_operators_title")
        self.operators = FitTable("profile_operators", OPERATOR_COLUMNS, numbers=(0, 1))
        self.tabs = QTabWidget()
        self.tabs.setObjectName("profile_tabs")
        self.tabs.addTab(_scrolled(ranks_row, self.missing), "Ranks")
        self.tabs.addTab(_scrolled(_left(self.collectives), self.no_collectives,
                                   self.bandwidth), "Collectives")
        self.tabs.addTab(_scrolled(self.operators_title, _left(self.operators)), "Operators")
        self.tabs.setFixedHeight(TABS_HEIGHT)
        self.where = _note("profile_where", rich=True)
        self.open_button = QPushButton("Open folder")
        self.open_button.setObjectName("profile_open_folder")
        self.open_button.setToolTip("Open the profile's folder (a trace per rank and "
                                    "summary.json)")
        self.open_button.clicked.connect(self.open_folder)
        self.footer = QHBoxLayout()
        self.footer.addWidget(self.where, 1)
        self.footer.addWidget(self.open_button, 0, Qt.AlignmentFlag.AlignTop)
        layout = QVBoxLayout(self)
        layout.setContentsMargins(0, 0, 0, 0)
        layout.setSpacing(4)
        layout.addWidget(self.headline)
        layout.addWidget(self.last)
        layout.addWidget(self.tabs)
        layout.addLayout(self.footer)

    def show_summary(self, s: dict[str, Any]) -> None:
        """Fill every part from the summary ``s`` (summary.json's schema)."""
        timeline = s["timeline"]
        self.folder = str(s["folder"])
        self.headline.setText(headline(s))
        last = last_text(s)
        self.last.setText(last or "")
        self.last.setVisible(bool(last))
        self._fill_ranks(s)
        self.legend.setText("&nbsp;&nbsp; ".join(
            f"<span style='color:{PART_COLOURS[p]}'>&#9632;</span>&nbsp;"
            f"{html.escape(part_title(p, timeline)).replace(' ', '&nbsp;')}" for p in PARTS)
            + "&nbsp;&nbsp; <i>(ms per step)</i>")
        self._summary = s
        self._place_bars()
        self.collectives.fill([[
            c["kind"], c["group"] or "-", f"{c['calls_per_step']:g}", size_text(c.get("bytes")),
            f"{c['time_ms']:.2f}", f"{c['exposed_ms']:.2f}", share_text(c.get("overlapped_share")),
            "-" if c.get("skew_ms_mean") is None
            else f"{c['skew_ms_mean']:.2f} / {c['skew_ms_max']:.2f}",
            ", ".join(f"rank {r} x{n}" for r, n in c["last_rank_counts"].items()) or "-"]
            for c in s["collectives"]])
        self.collectives.setVisible(bool(s["collectives"]))
        self.no_collectives.setVisible(not s["collectives"])
        self.bandwidth.setText("\n".join(bandwidth_line(b) for b in s.get("bandwidth", [])))
        self.bandwidth.setVisible(bool(s.get("bandwidth")))
        slowest = slowest_rank(s)
        ops = slowest["top_ops"][:TOP_OPERATORS] if slowest else []
        self.operators_title.setText(
            f"Top operators of rank {slowest['rank']} (the slowest step), self time per step:"
            if slowest else "No rank's operators were recorded.")
        self.operators.fill([[f"{o['self_ms']:.3f}", f"{o['calls_per_step']:g}", o["name"]]
                             for o in ops])
        self.operators.setVisible(bool(ops))
        url = "https://ui.perfetto.dev"
        self._fit_tabs()
        self.where.setText(f"Traces and summary.json: {html.escape(self.folder)}<br>"
                           + html.escape(PERFETTO).replace(url, f"<a href='{url}'>{url}</a>"))

    def _fill_ranks(self, s: dict[str, Any]) -> None:
        columns = rank_columns(s["timeline"])
        self.ranks.setHorizontalHeaderLabels(columns)
        for i, part in enumerate(PARTS):
            item = self.ranks.horizontalHeaderItem(2 + i) or QTableWidgetItem(columns[2 + i])
            item.setIcon(_swatch(PART_COLOURS[part]))
            self.ranks.setHorizontalHeaderItem(2 + i, item)
        self.ranks.fill([[str(r["rank"]), f"{r['step_time_ms']:.2f}",
                          *(f"{float(r['parts_ms'].get(p) or 0.0):.2f}" for p in PARTS),
                          f"{r['comm_ms']:.2f}", share_text(r.get("comm_overlapped_share"))]
                         for r in s["per_rank"]])
        missing = s.get("missing") or {}
        self.missing.setText("\n".join(f"rank {rank}: no trace ({why})"
                                       for rank, why in missing.items()))
        self.missing.setVisible(bool(missing))

    def stacked(self) -> bool:
        """Whether the bars go under the table (the view too narrow for both side by side)."""
        return self.width() < self.ranks.content_width() + BARS_MIN_WIDTH

    def _place_bars(self) -> None:
        """The bars beside the table, each on its rank's row, or under it when narrow."""
        if self._summary is None:
            return
        under = self.stacked()
        self.ranks_row.setDirection(QBoxLayout.Direction.TopToBottom if under
                                    else QBoxLayout.Direction.LeftToRight)
        header = self.ranks.horizontalHeader()
        top = self.ranks.frameWidth() + max(header.height(), header.sizeHint().height())
        self.bars.set_summary(self._summary, top=0 if under else top,
                              row_height=self.ranks.rowHeight(0) if self._summary["per_rank"]
                              else 22)

    def _fit_tabs(self) -> None:
        """As tall as the tallest page at the tabs' width, at most TABS_HEIGHT (measured here:
        the layouts of pages never shown are not up to date)."""
        width = max(self.tabs.width(), MIN_FIT_WIDTH) - 16

        def tall(*widgets: QWidget) -> int:
            out = 0
            for w in widgets:
                if w.isHidden():
                    continue
                if isinstance(w, FitTable):
                    out += w.minimumHeight() + 6  # fixed to its rows
                elif isinstance(w, QLabel) and w.wordWrap():
                    out += w.heightForWidth(width) + 6
                else:
                    out += w.sizeHint().height() + 6
            return out

        beside = (tall(self.ranks) + tall(self.bars, self.legend) if self.stacked()
                  else max(tall(self.ranks), tall(self.bars, self.legend)))
        pages = [beside + tall(self.missing),
                 tall(self.collectives, self.no_collectives, self.bandwidth),
                 tall(self.operators_title, self.operators)]
        bar = self.tabs.tabBar().sizeHint().height()
        self.tabs.setFixedHeight(min(TABS_HEIGHT, bar + max(pages) + 12))

    def resizeEvent(self, event: QResizeEvent) -> None:  # noqa: N802 (Qt's name)
        super().resizeEvent(event)
        if self.folder:
            self._place_bars()
            self._fit_tabs()

    def open_folder(self) -> None:
        if self.folder:
            QDesktopServices.openUrl(QUrl.fromLocalFile(self.folder))
