"""The device picker: the GPUs a run may use, with live readings, or CPU processes when there
are none (or when the installed torch cannot use the GPUs NVML lists).

NVML is never read on the GUI thread: :class:`app.gpu_readings.GpuReader` reads each GPU on a
daemon thread of its own and posts the results; the table shows only what was posted, and a
GPU without a reading newer than ``timeout_ms`` (a failed read, or one still blocked on a
wedged GPU) shows "unknown" and is never taken as idle. GPUs are named by their NVML index, as
nvidia-smi names them; GPUs in MIG mode are listed greyed out and can never be chosen.

The inventory itself (which GPUs, which torch) is read once, when the picker is made, unless
the caller passes it, waiting at most INVENTORY_TIMEOUT_S for NVML: past that the picker offers
CPU processes and says NVML did not answer.
"""

from __future__ import annotations

import time
from typing import Any

from PySide6.QtCore import Qt, QTimer, Signal
from PySide6.QtGui import QCloseEvent, QColor
from PySide6.QtWidgets import (
    QHBoxLayout,
    QHeaderView,
    QLabel,
    QPushButton,
    QSpinBox,
    QTableWidget,
    QTableWidgetItem,
    QVBoxLayout,
    QWidget,
)

from app.gpu_readings import GpuReader, IdleState, Posted, idle_state
from ddp_engine.common.gpus import GpuInfo, GpuReading, cpu_count
from ddp_engine.common.inventory import GpuInventory, gpu_inventory_within, mig_advice

UNKNOWN = "unknown"
INVENTORY_TIMEOUT_S = 5.0
"""How long the window waits for NVML's inventory when the picker is made (a wedged GPU)."""
PENDING = "-"
MEM_COL, UTIL_COL, TEMP_COL = 3, 4, 5


class DevicePicker(QWidget):
    """A table of GPUs with check boxes and 'first N idle', or a CPU process count."""

    changed = Signal()

    def __init__(self, gpus: list[GpuInfo] | None = None, refresh_ms: int = 1000, *,
                 inventory: GpuInventory | None = None, timeout_ms: int | None = None) -> None:
        """``gpus`` (GPUs torch can use) or ``inventory`` (NVML's GPUs and whether torch can
        use them) describe the machine; neither: :func:`gpu_inventory`. A GPU shows "unknown"
        when its last reading is older than ``timeout_ms`` (default: twice ``refresh_ms``,
        at least 3 s)."""
        super().__init__()
        if gpus is not None and inventory is not None:
            raise ValueError("DevicePicker: pass gpus or inventory, not both")
        if refresh_ms < 1:
            raise ValueError(f"refresh_ms must be >= 1, got {refresh_ms}")
        if timeout_ms is not None and timeout_ms < 1:
            raise ValueError(f"timeout_ms must be >= 1 (or None: automatic), got {timeout_ms}")
        self.inventory = (inventory if inventory is not None
                          else GpuInventory(list(gpus)) if gpus is not None
                          else gpu_inventory_within(INVENTORY_TIMEOUT_S))
        self.gpus = self.inventory.usable
        """The GPUs that may be picked (never a MIG GPU; none when torch cannot use CUDA)."""
        self.rows = list(self.inventory.gpus) if self.gpus else []
        """The table's GPUs, in inventory order: the usable ones and those in MIG mode."""
        self.cpus = cpu_count()
        self.timeout_s = (max(2 * refresh_ms, 3000) if timeout_ms is None else timeout_ms) / 1000
        self._latest: dict[str, tuple[GpuReading, float]] = {}  # uuid: (reading, arrival)
        self._started = time.monotonic()
        self.reader: GpuReader | None = None
        layout = QVBoxLayout(self)
        layout.setContentsMargins(0, 0, 0, 0)
        self.table = QTableWidget(len(self.rows), 6)
        self.table.setHorizontalHeaderLabels(["use", "GPU", "name", "memory", "util", "temp"])
        self.table.verticalHeader().setVisible(False)
        header = self.table.horizontalHeader()  # the narrow columns as narrow as their text
        for col in (0, 1, 4, 5):
            header.setSectionResizeMode(col, QHeaderView.ResizeMode.ResizeToContents)
        self.count = QSpinBox()
        self.count.setObjectName("nproc")
        self.idle_note = QLabel()
        self.idle_note.setObjectName("idle_note")
        self.idle_note.setWordWrap(True)
        self.idle_note.hide()
        if self.gpus:
            self._build_gpu_ui(layout)
            self.reader = GpuReader([g.uuid for g in self.rows], refresh_ms / 1000)
            self.reader.reading.connect(self._posted)
            reader = self.reader
            # Not a method of self: by the time ``destroyed`` fires, the Python side may be gone.
            self.destroyed.connect(lambda *_: reader.request_stop())
            self._timer = QTimer(self)
            self._timer.timeout.connect(self.redraw)  # turns silent GPUs "unknown"
            self._timer.start(refresh_ms)
            self.reader.start()
        else:
            self._build_cpu_ui(layout)

    # ------------------------------------------------------------------------------ layout
    def _build_gpu_ui(self, layout: QVBoxLayout) -> None:
        for row, gpu in enumerate(self.rows):
            self._fill_row(row, gpu)
        self.table.itemChanged.connect(self._item_changed)
        layout.addWidget(self.table)
        mig = [g for g in self.rows if g.mig]
        if mig:
            note = QLabel("Not usable: " + mig_advice(mig) + ".")
            note.setObjectName("mig_note")
            note.setWordWrap(True)
            layout.addWidget(note)
        row_layout = QHBoxLayout()
        self.count.setRange(1, len(self.gpus))
        self.count.setValue(len(self.gpus))
        pick = QPushButton("Use the first N idle")
        pick.setToolTip("check the first N GPUs with low utilization and memory in use; a GPU "
                        "without a reading is not idle")
        pick.clicked.connect(self.pick_idle)
        row_layout.addWidget(QLabel("N:"))
        row_layout.addWidget(self.count)
        row_layout.addWidget(pick)
        layout.addLayout(row_layout)
        layout.addWidget(self.idle_note)

    def _fill_row(self, row: int, gpu: GpuInfo) -> None:
        identity = f"NVML index {gpu.index}\nUUID {gpu.uuid}\nPCI bus {gpu.pci_bus_id}"
        check = QTableWidgetItem()
        cells = [check, QTableWidgetItem(str(gpu.index)), QTableWidgetItem(gpu.name),
                 *(QTableWidgetItem(PENDING) for _ in range(3))]
        why_not = self.inventory.why_not(gpu.index)
        for col, item in enumerate(cells):
            item.setToolTip(identity if why_not is None else f"{identity}\n\n{why_not}")
            if why_not is None:
                item.setFlags(Qt.ItemFlag.ItemIsEnabled | (
                    Qt.ItemFlag.ItemIsUserCheckable if col == 0 else Qt.ItemFlag.NoItemFlags))
            else:  # greyed out, not selectable, not checkable
                item.setFlags(Qt.ItemFlag.NoItemFlags)
                item.setForeground(QColor("gray"))
            self.table.setItem(row, col, item)
        check.setCheckState(Qt.CheckState.Checked if why_not is None
                            else Qt.CheckState.Unchecked)

    def _build_cpu_ui(self, layout: QVBoxLayout) -> None:
        self.table.hide()
        why = self.inventory.cpu_note()
        note = QLabel(f"Training runs as CPU processes (gloo): {why}." if why else
                      "No NVIDIA GPU found: training runs as CPU processes (gloo).")
        note.setObjectName("no_gpu_note")
        note.setWordWrap(True)
        note.setTextInteractionFlags(Qt.TextInteractionFlag.TextSelectableByMouse)
        layout.addWidget(note)
        row_layout = QHBoxLayout()
        row_layout.addWidget(QLabel("CPU processes:"))
        self.count.setRange(1, max(1, self.cpus))
        self.count.setValue(min(2, self.cpus))
        self.count.valueChanged.connect(lambda _v: self.changed.emit())
        row_layout.addWidget(self.count)
        row_layout.addStretch(1)
        layout.addLayout(row_layout)

    def _item_changed(self, item: QTableWidgetItem) -> None:
        if item.column() == 0:  # a check box; not the readings, which change every second
            self.changed.emit()

    def _cell(self, row: int, col: int) -> QTableWidgetItem:
        item = self.table.item(row, col)
        assert item is not None, f"no table item at ({row}, {col})"  # every cell is made above
        return item

    # ------------------------------------------------------------------------------ readings
    @property
    def has_gpus(self) -> bool:
        return bool(self.gpus)

    def _posted(self, posted: Posted) -> None:
        self._latest[posted.uuid] = (posted.reading, time.monotonic())
        self.redraw()

    def current(self, gpu: GpuInfo) -> GpuReading | None:
        """The GPU's last posted reading if it is fresh (younger than the timeout), else None:
        unknown, whether NVML never answered or has stopped answering."""
        latest = self._latest.get(gpu.uuid)
        if latest is None or time.monotonic() - latest[1] > self.timeout_s:
            return None
        return latest[0]

    def refresh(self) -> None:
        """Ask for new readings now (they arrive later) and show the ones posted so far.
        Never waits on NVML."""
        if self.reader is not None:
            self.reader.wake()
        self.redraw()

    def redraw(self) -> None:
        """Show each GPU's last posted reading, or "unknown" where it has none fresh."""
        waited_s = time.monotonic() - self._started
        for row, gpu in enumerate(self.rows):
            r = self.current(gpu)
            if r is None:
                text = PENDING if waited_s <= self.timeout_s and gpu.uuid not in self._latest \
                    else UNKNOWN
                texts = [text] * 3
            else:
                texts = [_mem_text(r), UNKNOWN if r.util_pct is None else f"{r.util_pct:.0f}%",
                         UNKNOWN if r.temp_c is None else f"{r.temp_c:.0f} °C"]
            for col, text in zip((MEM_COL, UTIL_COL, TEMP_COL), texts, strict=True):
                item = self._cell(row, col)
                if item.text() != text:
                    item.setText(text)

    # ------------------------------------------------------------------------------ choice
    def pick_idle(self) -> None:
        """Check the first N GPUs that are idle (low utilization and memory), uncheck the rest.
        A GPU without a fresh reading is not idle. When fewer than N are idle, only those are
        checked and ``idle_note`` says why."""
        wanted = self.count.value()
        states: dict[int, IdleState] = {g.index: idle_state(self.current(g)) for g in self.gpus}
        chosen = [i for i, s in states.items() if s == "idle"][:wanted]
        for row, gpu in enumerate(self.rows):
            if gpu in self.gpus:
                self._cell(row, 0).setCheckState(
                    Qt.CheckState.Checked if gpu.index in chosen else Qt.CheckState.Unchecked)
        note = _shortfall(wanted, chosen, states)
        self.idle_note.setText(note)
        self.idle_note.setVisible(bool(note))

    def selected_gpus(self) -> list[int]:
        """NVML indices of the checked GPUs, in table order (never a MIG GPU)."""
        return [gpu.index for row, gpu in enumerate(self.rows) if gpu in self.gpus
                and self._cell(row, 0).checkState() == Qt.CheckState.Checked]

    def set_gpus(self, gpus: list[int] | None) -> None:
        """Check the usable GPUs of ``gpus`` (NVML indices; None: every usable GPU)."""
        if not self.gpus:
            return
        for row, gpu in enumerate(self.rows):
            on = gpu in self.gpus and (gpus is None or gpu.index in gpus)
            self._cell(row, 0).setCheckState(
                Qt.CheckState.Checked if on else Qt.CheckState.Unchecked)

    def config_values(self) -> dict[str, Any]:
        """The RunConfig keys this picker decides."""
        if self.gpus:
            return {"device": "cuda", "gpus": self.selected_gpus(), "nproc": None}
        return {"device": "cpu", "gpus": None, "nproc": self.count.value()}

    # ------------------------------------------------------------------------------ shutdown
    def stop(self) -> None:
        """Stop reading: the reader threads end (one blocked in NVML ends when NVML returns;
        it is a daemon, so it never holds up the process's exit)."""
        if self.reader is not None:
            self._timer.stop()
            self.reader.request_stop()

    def closeEvent(self, event: QCloseEvent) -> None:  # noqa: N802 (Qt's name)
        self.stop()
        super().closeEvent(event)


def _mem_text(r: GpuReading) -> str:
    if r.mem_used_bytes is None or not r.mem_total_bytes:
        return UNKNOWN
    return f"{r.mem_used_bytes / 2**30:.1f}/{r.mem_total_bytes / 2**30:.1f} GiB"


def _shortfall(wanted: int, chosen: list[int], states: dict[int, IdleState]) -> str:
    """What "first N idle" could not do: "" when N GPUs were idle."""
    if len(chosen) >= wanted:
        return ""
    verb = "is" if len(chosen) == 1 else "are"
    parts = [f"only {len(chosen)} of the {wanted} GPUs asked for {verb} idle"
             + (f" (checked: {_names(chosen)})" if chosen else "")]
    for state, what in (("busy", "busy"), ("unknown", "unknown (no NVML reading)")):
        found = [i for i, s in states.items() if s == state]
        if found:
            parts.append(f"{_names(found)} {what}")
    return "; ".join(parts)


def _names(indices: list[int]) -> str:
    return ", ".join(f"GPU {i}" for i in indices)
