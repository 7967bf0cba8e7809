"""Compare runs: the loss and throughput of two or more runs overlaid, by step or by time.

Each run's metrics.jsonl is read into its own MetricStore (the dashboard's store, so the
numbers are the same ones) and followed as it grows, so a live run's curve keeps extending.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
from PySide6.QtCore import QTimer
from PySide6.QtWidgets import QComboBox, QHBoxLayout, QLabel, QVBoxLayout, QWidget

from app.charts.base import Chart, color
from app.metric_store import MetricStore
from ddp_engine.common.run_dir import MetricsTail

X_STEP = "step"
X_TIME = "time since start (s)"


class ComparedRun:
    """One run's curves, fed incrementally from its metrics.jsonl."""

    def __init__(self, run_dir: Path) -> None:
        self.run_dir = Path(run_dir)
        self.store = MetricStore()
        self.tail = MetricsTail(self.run_dir)

    def update(self) -> bool:
        """Read what was appended; True if anything was."""
        lines = self.tail.poll()
        self.store.add_many(lines)
        return bool(lines)

    def x(self, axis: str) -> np.ndarray:
        if axis == X_STEP:
            return self.store.mean_loss.x
        t = self.store.report_time.y
        start = self.store.info.start_time or (t[0] if len(t) else 0.0)
        return t - start


class CompareView(QWidget):
    def __init__(self, poll_ms: int = 1000) -> None:
        super().__init__()
        self.runs: list[ComparedRun] = []
        self.axis = QComboBox()
        self.axis.setObjectName("compare_axis")
        self.axis.addItems([X_STEP, X_TIME])
        self.label = QLabel("select two or more runs in the Runs panel and press Compare")
        self.label.setObjectName("compare_label")
        self.loss = Chart("Loss (mean over ranks)", "loss")
        self.throughput = Chart("Throughput (all ranks)", "samples/s")
        top = QHBoxLayout()
        top.addWidget(self.label, 1)
        top.addWidget(QLabel("x axis"))
        top.addWidget(self.axis)
        charts = QHBoxLayout()
        charts.addWidget(self.loss)
        charts.addWidget(self.throughput)
        layout = QVBoxLayout(self)
        layout.addLayout(top)
        layout.addLayout(charts, 1)
        self.axis.currentTextChanged.connect(lambda _t: self.redraw())
        self.timer = QTimer(self)
        self.timer.setInterval(poll_ms)
        self.timer.timeout.connect(self.poll_once)

    def set_runs(self, run_dirs: list[Path]) -> None:
        self.runs = [ComparedRun(p) for p in run_dirs]
        for chart in (self.loss, self.throughput):
            chart.reset()
        self.label.setText("comparing " + ", ".join(r.run_dir.name for r in self.runs))
        self.poll_once(force=True)
        self.timer.start()

    def poll_once(self, force: bool = False) -> bool:
        """Read every run's new lines and redraw if any arrived. True if something did."""
        changed = [r.update() for r in self.runs]
        if any(changed) or force:
            self.redraw()
        return any(changed)

    def redraw(self) -> None:
        axis = self.axis.currentText()
        for chart in (self.loss, self.throughput):
            chart.setLabel("bottom", axis)
        names = [r.run_dir.name for r in self.runs]
        for i, run in enumerate(self.runs):
            x = run.x(axis)
            name = names[i] if names.count(names[i]) == 1 else \
                f"{run.run_dir.parent.name}/{names[i]}"
            self.loss.set_data(name, x, run.store.mean_loss.y, color(i))
            self.throughput.set_data(name, x, run.store.total_samples_per_s.y, color(i))
