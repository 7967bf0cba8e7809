"""The device picker: GPUs from NVML refreshed every second, or CPU processes when there are none.

NVML is read on the GUI thread: the calls used here take microseconds (no process listing).
"""

from __future__ import annotations

from typing import Any

from PySide6.QtCore import Qt, QTimer, Signal
from PySide6.QtWidgets import (
    QHBoxLayout,
    QLabel,
    QPushButton,
    QSpinBox,
    QTableWidget,
    QTableWidgetItem,
    QVBoxLayout,
    QWidget,
)

from ddp_engine.common.gpus import GpuInfo, GpuReading, Nvml, cpu_count, list_gpus

IDLE_UTIL_PCT = 10.0
IDLE_MEM_FRACTION = 0.1


class DevicePicker(QWidget):
    """A table of GPUs with check boxes and 'first N idle', or a CPU process count."""

    changed = Signal()

    def __init__(self, gpus: list[GpuInfo] | None = None, refresh_ms: int = 1000) -> None:
        super().__init__()
        self.gpus = list_gpus() if gpus is None else gpus
        self.cpus = cpu_count()
        layout = QVBoxLayout(self)
        layout.setContentsMargins(0, 0, 0, 0)
        self.table = QTableWidget(len(self.gpus), 6)
        self.table.setHorizontalHeaderLabels(["use", "GPU", "name", "memory", "util", "temp"])
        self.table.verticalHeader().setVisible(False)
        self.count = QSpinBox()
        self.count.setObjectName("nproc")
        self.nvml = Nvml() if self.gpus else None  # handles cached for the live readings
        if self.gpus:
            for row, gpu in enumerate(self.gpus):
                check = QTableWidgetItem()
                check.setFlags(Qt.ItemFlag.ItemIsUserCheckable | Qt.ItemFlag.ItemIsEnabled)
                check.setCheckState(Qt.CheckState.Checked)
                self.table.setItem(row, 0, check)
                self.table.setItem(row, 1, QTableWidgetItem(str(gpu.index)))
                self.table.setItem(row, 2, QTableWidgetItem(gpu.name))
                for col in (3, 4, 5):
                    self.table.setItem(row, col, QTableWidgetItem("-"))
            self.table.itemChanged.connect(lambda _item: self.changed.emit())
            layout.addWidget(self.table)
            row_layout = QHBoxLayout()
            self.count.setRange(1, len(self.gpus))
            self.count.setValue(len(self.gpus))
            pick = QPushButton("Use the first N idle")
            pick.clicked.connect(self.pick_idle)
            row_layout.addWidget(QLabel("N:"))
            row_layout.addWidget(self.count)
            row_layout.addWidget(pick)
            layout.addLayout(row_layout)
            self._timer = QTimer(self)
            self._timer.timeout.connect(self.refresh)
            self._timer.start(refresh_ms)
            self.refresh()
        else:
            self.table.hide()
            note = QLabel("No NVIDIA GPU found: training runs as CPU processes (gloo).")
            note.setObjectName("no_gpu_note")
            note.setWordWrap(True)
            layout.addWidget(note)
            row_layout = QHBoxLayout()
            row_layout.addWidget(QLabel("CPU processes:"))
            self.count.setRange(1, max(1, self.cpus))
            self.count.setValue(min(2, self.cpus))
            self.count.valueChanged.connect(lambda _v: self.changed.emit())
            row_layout.addWidget(self.count)
            row_layout.addStretch(1)
            layout.addLayout(row_layout)

    @property
    def has_gpus(self) -> bool:
        return bool(self.gpus)

    def readings(self) -> list[GpuReading]:
        assert self.nvml is not None
        return [self.nvml.read(self.nvml.handle(g.uuid)) for g in self.gpus]

    def refresh(self) -> None:
        if not self.gpus:
            return
        for row, r in enumerate(self.readings()):
            mem = (f"{r.mem_used_bytes / 2**30:.1f}/{r.mem_total_bytes / 2**30:.1f} GiB"
                   if r.mem_used_bytes is not None and r.mem_total_bytes else "n/a")
            self.table.item(row, 3).setText(mem)
            self.table.item(row, 4).setText("n/a" if r.util_pct is None else f"{r.util_pct:.0f}%")
            self.table.item(row, 5).setText("n/a" if r.temp_c is None else f"{r.temp_c:.0f} °C")

    def pick_idle(self) -> None:
        """Check the first N GPUs that are idle (low utilization and memory), uncheck the rest."""
        readings = self.readings()
        idle = [i for i, r in enumerate(readings)
                if (r.util_pct or 0) <= IDLE_UTIL_PCT
                and (r.mem_used_bytes or 0) <= IDLE_MEM_FRACTION * (r.mem_total_bytes or 1)]
        chosen = set(idle[:self.count.value()])
        for row in range(len(self.gpus)):
            state = Qt.CheckState.Checked if row in chosen else Qt.CheckState.Unchecked
            self.table.item(row, 0).setCheckState(state)

    def selected_gpus(self) -> list[int]:
        return [self.gpus[row].index for row in range(len(self.gpus))
                if self.table.item(row, 0).checkState() == Qt.CheckState.Checked]

    def set_gpus(self, gpus: list[int] | None) -> None:
        if not self.gpus:
            return
        for row, gpu in enumerate(self.gpus):
            on = gpus is None or gpu.index in gpus
            self.table.item(row, 0).setCheckState(
                Qt.CheckState.Checked if on else Qt.CheckState.Unchecked)

    def config_values(self) -> dict[str, Any]:
        """The RunConfig keys this picker decides."""
        if self.gpus:
            return {"device": "cuda", "gpus": self.selected_gpus(), "nproc": None}
        return {"device": "cpu", "gpus": None, "nproc": self.count.value()}
