"""The live dashboard: progress, alerts and the four chart panels, redrawn on a timer."""

from __future__ import annotations

import time
from pathlib import Path

from PySide6.QtCore import QTimer
from PySide6.QtWidgets import (
    QGridLayout,
    QHBoxLayout,
    QLabel,
    QProgressBar,
    QVBoxLayout,
    QWidget,
)

from app.charts.panels import DevicePanel, LossPanel, SyncPanel, ThroughputPanel
from app.metric_store import MetricStore
from ddp_engine.heartbeat import hang_hint, read_heartbeats, stall_text
from ddp_engine.runs import fmt_duration

REDRAW_MS = 33  # at most ~30 redraws a second, however fast messages arrive


class Dashboard(QWidget):
    def __init__(self, store: MetricStore) -> None:
        super().__init__()
        self.store = store
        self.progress = QProgressBar()
        self.progress.setObjectName("progress")
        self.progress_label = QLabel("no run")
        self.progress_label.setObjectName("progress_label")
        self.alert = QLabel("")
        self.alert.setObjectName("alert")
        self.alert.setWordWrap(True)
        self.alert.setStyleSheet("color: #b35900; font-weight: bold;")
        self.loss = LossPanel()
        self.devices = DevicePanel()
        self.sync = SyncPanel()
        self.throughput = ThroughputPanel()
        top = QHBoxLayout()
        top.addWidget(self.progress_label)
        top.addWidget(self.progress, 1)
        grid = QGridLayout()
        grid.addWidget(self.loss, 0, 0)
        grid.addWidget(self.throughput, 0, 1)
        grid.addWidget(self.sync, 1, 0)
        grid.addWidget(self.devices, 1, 1)
        grid.setRowStretch(0, 1)
        grid.setRowStretch(1, 1)
        layout = QVBoxLayout(self)
        layout.addLayout(top)
        layout.addWidget(self.alert)
        layout.addLayout(grid, 1)
        self.charts = (self.loss.chart, self.throughput.chart, self.sync.sync, self.sync.share,
                       self.devices.util, self.devices.mem)
        self._drawn_version = -1
        self.redraws = 0
        self.run_dir: Path | None = None  # the run shown: its heartbeats word the hang hint
        self.timer = QTimer(self)
        self.timer.timeout.connect(self.redraw)
        self.timer.start(REDRAW_MS)

    def reset(self) -> None:
        self.store.clear()
        self.loss.clear()
        for chart in self.charts:
            if chart is not self.loss.chart:  # the loss panel clears its own
                chart.reset()
        self._drawn_version = -1
        self.alert.setText("")

    def redraw(self) -> None:
        """Redraw if anything arrived since the last redraw; the alerts always."""
        self._alerts()
        if self.store.version == self._drawn_version:
            return
        self._drawn_version = self.store.version
        self.redraws += 1
        info = self.store.info
        total = info.total_steps or 0
        self.progress.setRange(0, max(total, 1))
        self.progress.setValue(min(info.step, max(total, 1)))
        self.progress_label.setText(f"step {info.step}/{total or '?'}  epoch {info.epoch}  "
                                    f"ETA {fmt_duration(self.store.eta_s())}")
        self.loss.redraw(self.store)
        self.devices.redraw(self.store)
        self.sync.redraw(self.store)
        self.throughput.redraw(self.store)
        for chart in self.charts:
            chart.settle()

    def _alerts(self) -> None:
        parts = []
        stragglers = self.store.stragglers()
        if stragglers:
            parts.append("straggler: " + ", ".join(
                f"rank {r} step time {100 * x:.0f}% above the median"
                for r, x in sorted(stragglers.items())))
        now = time.time()
        stall = self.store.stall_s(now)
        if stall is not None:
            info = self.store.info
            hint = hang_hint(read_heartbeats(self.run_dir), now) if self.run_dir else None
            parts.append(stall_text(stall, info.clock.typical_s(), info.step, hint))
        text = "\n".join(parts)
        if text != self.alert.text():
            self.alert.setText(text)
