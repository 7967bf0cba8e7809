"""Compare runs: the loss and throughput of two or more runs overlaid, by step or by time, their
validation loss, and their settings side by side.

Each run's metrics.jsonl is read into its own MetricStore (the dashboard's store, so the
numbers are the same ones) and followed as it grows, so a live run's curve keeps extending.
The settings are each run's config.json; what the table and the caption say is worded in
app/compare_settings.py, without Qt.
"""

from __future__ import annotations

import html
from pathlib import Path
from typing import Any

import numpy as np
from PySide6.QtCore import Qt, QTimer
from PySide6.QtGui import QBrush, QColor, QFont, QResizeEvent
from PySide6.QtWidgets import (
    QCheckBox,
    QComboBox,
    QHBoxLayout,
    QHeaderView,
    QLabel,
    QSplitter,
    QTableWidget,
    QTableWidgetItem,
    QVBoxLayout,
    QWidget,
)

from app.charts.base import Chart, color
from app.charts.caption import ElidedLabel
from app.compare_settings import SettingRow, differences_note, settings_rows, validation_note
from app.metric_store import MetricStore
from ddp_engine.common.run_dir import CONFIG_FILE, MetricsTail, read_json

X_STEP = "step"
X_TIME = "time since start (s)"
DIFFERS_BACKGROUND = "#ffe28a"
"""A differing setting's row: amber behind black bold text, legible in a light or dark theme."""
DIFFERS_TEXT = "#000000"
CHARTS_SHARE = 0.62
"""The part of Compare's height its charts and their caption take (the table the rest)."""


class ComparedRun:
    """One run's curves, fed incrementally from its metrics.jsonl, and its config.json."""

    def __init__(self, run_dir: Path) -> None:
        self.run_dir = Path(run_dir)
        self.store = MetricStore()
        self.tail = MetricsTail(self.run_dir)
        self.config: dict[str, Any] | None = None

    def update(self) -> bool:
        """Read what was appended (and config.json until there is one); True if anything was."""
        lines = self.tail.poll()
        self.store.add_many(lines)
        if self.config is None:
            config = read_json(self.run_dir / CONFIG_FILE)
            self.config = config if isinstance(config, dict) else None
            if self.config is not None:
                return True
        return bool(lines)

    def _since_start(self, t: np.ndarray) -> np.ndarray:
        first = self.store.report_time.y
        return t - (self.store.info.start_time or (first[0] if len(first) else 0.0))

    def x(self, axis: str) -> np.ndarray:
        if axis == X_STEP:
            return self.store.mean_loss.x
        return self._since_start(self.store.report_time.y)

    def validation(self, axis: str) -> tuple[np.ndarray, np.ndarray]:
        """The validation loss (from the ``eval`` events) against ``axis``."""
        val = self.store.val_loss
        if axis == X_STEP:
            return val.x, val.y
        times = [float(e.get("time") or np.nan) for e in self.store.events
                 if e.get("kind") == "eval" and e.get("val_loss") is not None]
        return self._since_start(np.array(times, dtype=float)), val.y


class SettingsTable(QWidget):
    """The runs' settings side by side: one row per config key, one column per run; rows that
    differ highlighted and listed first, or alone with "only differences"."""

    def __init__(self) -> None:
        super().__init__()
        self.rows: list[SettingRow] = []
        self.heading = QLabel("Settings")
        self.heading.setObjectName("compare_settings_heading")
        self.only_differences = QCheckBox("only differences")
        self.only_differences.setObjectName("compare_only_differences")
        self.only_differences.toggled.connect(lambda _on: self._filter())
        self.table = QTableWidget(0, 1)
        self.table.setObjectName("compare_settings")
        self.table.verticalHeader().setVisible(False)
        self.table.setEditTriggers(QTableWidget.EditTrigger.NoEditTriggers)
        self.table.setSelectionBehavior(QTableWidget.SelectionBehavior.SelectRows)
        self.table.setWordWrap(False)
        self.table.setTextElideMode(Qt.TextElideMode.ElideMiddle)  # paths keep both ends
        self.table.horizontalHeader().setTextElideMode(Qt.TextElideMode.ElideMiddle)
        self.table.verticalHeader().setDefaultSectionSize(self.fontMetrics().height() + 8)
        top = QHBoxLayout()
        top.addWidget(self.heading, 1)
        top.addWidget(self.only_differences)
        layout = QVBoxLayout(self)
        layout.setContentsMargins(0, 0, 0, 0)
        layout.addLayout(top)
        layout.addWidget(self.table, 1)

    def set_rows(self, names: list[str], rows: list[SettingRow]) -> None:
        self.rows = rows
        self.heading.setText(differences_note(rows))
        table = self.table
        table.clearContents()
        table.setColumnCount(1 + len(names))
        table.setRowCount(len(rows))
        for col, name in enumerate(["setting", *names]):  # a name cut keeps both ends
            head = QTableWidgetItem(name)
            head.setToolTip(name)
            table.setHorizontalHeaderItem(col, head)
        bold = QFont(table.font())
        bold.setBold(True)
        for i, row in enumerate(rows):
            for col, text in enumerate((row.key, *row.values)):
                item = QTableWidgetItem(text)
                item.setToolTip(row.help if col == 0 else text)
                if row.differs:
                    item.setBackground(QBrush(QColor(DIFFERS_BACKGROUND)))
                    item.setForeground(QBrush(QColor(DIFFERS_TEXT)))
                    item.setFont(bold)
                table.setItem(i, col, item)
        header = table.horizontalHeader()
        header.setSectionResizeMode(0, QHeaderView.ResizeMode.ResizeToContents)
        for col in range(1, table.columnCount()):
            header.setSectionResizeMode(col, QHeaderView.ResizeMode.Stretch)
        self._filter()

    def _filter(self) -> None:
        only = self.only_differences.isChecked()
        for i, row in enumerate(self.rows):
            self.table.setRowHidden(i, only and not row.differs)

    def highlighted(self) -> list[str]:
        """The keys of the highlighted (differing) rows, top to bottom (tests read this)."""
        return [r.key for r in self.rows if r.differs]


class CompareView(QWidget):
    def __init__(self, poll_ms: int = 1000) -> None:
        super().__init__()
        self.runs: list[ComparedRun] = []
        self._settings_of: list[Any] | None = None  # the configs the table shows
        self.axis = QComboBox()
        self.axis.setObjectName("compare_axis")
        self.axis.addItems([X_STEP, X_TIME])
        # One line, elided (the names in its tooltip): a label as wide as three run names
        # would squeeze the launch panel beside it.
        self.label = ElidedLabel("select two or more runs in the Runs panel and press Compare")
        self.label.setObjectName("compare_label")
        self.loss = Chart("Loss (dashed: validation)", "mean loss of ranks")
        self.throughput = Chart("Throughput (all ranks)", "samples/s")
        for chart in (self.loss, self.throughput):
            # The caption under the charts names the runs by colour, wrapped: a legend of
            # long run names would take half a small chart's height.
            chart.legend.wanted = False
        self.validation_caption = QLabel("")
        self.validation_caption.setObjectName("compare_validation")
        self.validation_caption.setWordWrap(True)
        self.validation_caption.setTextFormat(Qt.TextFormat.RichText)
        self.settings = SettingsTable()
        top = QHBoxLayout()
        top.addWidget(self.label, 1)
        top.addWidget(QLabel("x axis"))
        top.addWidget(self.axis)
        charts = QHBoxLayout()
        charts.addWidget(self.loss)
        charts.addWidget(self.throughput)
        upper = QWidget()
        upper_layout = QVBoxLayout(upper)
        upper_layout.setContentsMargins(0, 0, 0, 0)
        upper_layout.addLayout(charts, 1)
        upper_layout.addWidget(self.validation_caption)
        self.splitter = QSplitter(Qt.Orientation.Vertical)
        self.splitter.setChildrenCollapsible(False)
        self.splitter.addWidget(upper)
        self.splitter.addWidget(self.settings)
        # The charts get CHARTS_SHARE of the height, whatever the window's size, until the user
        # drags the handle (sizes set before the tab is first shown were not kept: at 1000x700
        # the charts had a plot a few pixels tall).
        self._user_sized = False
        self.splitter.splitterMoved.connect(self._dragged)
        layout = QVBoxLayout(self)
        layout.addLayout(top)
        layout.addWidget(self.splitter, 1)
        self.axis.currentTextChanged.connect(lambda _t: self.redraw())
        self.timer = QTimer(self)
        self.timer.setInterval(poll_ms)
        self.timer.timeout.connect(self.poll_once)

    def _dragged(self, *_: object) -> None:
        self._user_sized = True

    def resizeEvent(self, event: QResizeEvent) -> None:  # noqa: N802 (Qt's)
        super().resizeEvent(event)
        height = self.splitter.height()
        if not self._user_sized and height > 0:
            charts = round(height * CHARTS_SHARE)
            self.splitter.setSizes([charts, height - charts])

    def set_runs(self, run_dirs: list[Path]) -> None:
        self.runs = [ComparedRun(p) for p in run_dirs]
        for chart in (self.loss, self.throughput):
            chart.reset()
        self.label.set_full_text("comparing " + ", ".join(r.run_dir.name for r in self.runs))
        self.poll_once(force=True)
        self.timer.start()

    def poll_once(self, force: bool = False) -> bool:
        """Read every run's new lines and redraw if any arrived. True if something did."""
        changed = [r.update() for r in self.runs]
        if any(changed) or force:
            self.redraw()
        return any(changed)

    def names(self) -> list[str]:
        """Each run's name: its folder's, with its parent's where two folders share one."""
        names = [r.run_dir.name for r in self.runs]
        return [n if names.count(n) == 1 else f"{r.run_dir.parent.name}/{n}"
                for n, r in zip(names, self.runs, strict=True)]

    def redraw(self) -> None:
        axis = self.axis.currentText()
        for chart in (self.loss, self.throughput):
            chart.setLabel("bottom", axis)
        names = self.names()
        notes = []
        for i, (name, run) in enumerate(zip(names, self.runs, strict=True)):
            x = run.x(axis)
            self.loss.set_data(name, x, run.store.mean_loss.y, color(i))
            self.throughput.set_data(name, x, run.store.total_samples_per_s.y, color(i))
            val_x, val_y = run.validation(axis)
            if len(val_y):
                self.loss.set_data(f"{name} validation", val_x, val_y, color(i), dashed=True,
                                   symbol="o")
                self.loss.curves[f"{name} validation"].setSymbolSize(6)
            val = run.store.val_loss
            notes.append(f'<span style="color:{color(i)}">&#9632;</span> '
                         + html.escape(validation_note(name, val.x.tolist(), val.y.tolist())))
        self.validation_caption.setText("<br>".join(notes))
        shown = [names, *(r.config for r in self.runs)]
        if shown != self._settings_of:  # rebuilt only then: the scroll position stays put
            self._settings_of = shown
            self.settings.set_rows(names, settings_rows([r.config for r in self.runs]))
