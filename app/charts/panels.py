"""The dashboard's charts: loss, devices, gradient sync, throughput."""

from __future__ import annotations

import numpy as np
from PySide6.QtCore import Qt
from PySide6.QtWidgets import (
    QCheckBox,
    QHBoxLayout,
    QLabel,
    QSizePolicy,
    QSlider,
    QVBoxLayout,
    QWidget,
)

from app.charts.base import Chart, color
from app.metric_store import MetricStore


def smooth(y: np.ndarray, weight: float) -> np.ndarray:
    """TensorBoard's smoothing: a debiased exponential moving average, NaNs passed over."""
    if weight <= 0 or len(y) == 0:
        return y
    out = np.empty_like(y)
    last, n = 0.0, 0
    for i, v in enumerate(y):
        if np.isfinite(v):
            last = last * weight + (1 - weight) * v
            n += 1
            out[i] = last / (1 - weight ** n)
        else:
            out[i] = np.nan
    return out


class LossPanel(QWidget):
    """Loss per rank (toggles, smoothing) and validation loss."""

    def __init__(self) -> None:
        super().__init__()
        self.chart = Chart("Loss per rank", "loss")
        self.slider = QSlider(Qt.Orientation.Horizontal)
        self.slider.setRange(0, 99)
        self.slider.setValue(60)
        self.slider.setToolTip("smoothing (exponential moving average, as in TensorBoard)")
        self.toggles_row = QHBoxLayout()
        self.toggles: dict[int, QCheckBox] = {}
        controls = QHBoxLayout()
        controls.addWidget(QLabel("ranks:"))
        controls.addLayout(self.toggles_row)
        controls.addStretch(1)
        controls.addWidget(QLabel("smoothing"))
        controls.addWidget(self.slider)
        layout = QVBoxLayout(self)
        layout.setContentsMargins(0, 0, 0, 0)
        layout.addLayout(controls)
        layout.addWidget(self.chart)
        self.slider.valueChanged.connect(lambda _v: self.redraw(self._store, force=True))
        self._store: MetricStore | None = None

    def _toggle(self, rank: int) -> QCheckBox:
        if rank not in self.toggles:
            box = QCheckBox(str(rank))
            box.setChecked(True)
            box.toggled.connect(lambda _c: self.redraw(self._store, force=True))
            self.toggles[rank] = box
            self.toggles_row.addWidget(box)
        return self.toggles[rank]

    def redraw(self, store: MetricStore | None, force: bool = False) -> None:
        if store is None:
            return
        self._store = store
        weight = self.slider.value() / 100
        for rank in store.ranks():
            s = store.get(rank, "loss")
            visible = self._toggle(rank).isChecked()
            item = self.chart.curve(f"rank {rank}", color(rank))
            item.setVisible(visible)
            if visible:
                item.setData(s.x, smooth(s.y, weight), connect="finite")
        if len(store.val_loss):
            self.chart.set_data("validation", store.val_loss.x, store.val_loss.y, "#000000",
                                dashed=True)

    def clear(self) -> None:
        self.chart.clear()
        self.chart.curves.clear()
        for box in self.toggles.values():
            box.deleteLater()
        self.toggles.clear()


class PairPanel(QWidget):
    """Two charts side by side over a caption line."""

    def __init__(self, left: Chart, right: Chart) -> None:
        super().__init__()
        self.caption = QLabel("")
        # One line, clipped when narrow: a wrapping label makes the dashboard's grid give
        # this row its height first (height-for-width), squeezing the loss charts.
        self.caption.setSizePolicy(QSizePolicy.Policy.Ignored, QSizePolicy.Policy.Preferred)
        layout = QVBoxLayout(self)
        layout.setContentsMargins(0, 0, 0, 0)
        row = QHBoxLayout()
        row.addWidget(left)
        row.addWidget(right)
        layout.addLayout(row)
        layout.addWidget(self.caption)


class DevicePanel(PairPanel):
    """Per GPU: utilization and memory, with temperature and power in the caption; on CPU
    ranks: CPU % and RSS per rank."""

    def __init__(self) -> None:
        self.util = Chart("Utilization", "%")
        self.mem = Chart("Memory", "GiB")
        super().__init__(self.util, self.mem)

    def redraw(self, store: MetricStore) -> None:
        parts = []
        for rank in store.ranks():
            device = store.info.devices.get(rank, "")
            gpu = device.startswith("cuda")
            name = f"{device} (rank {rank})" if gpu else f"rank {rank} (cpu)"
            util = store.get(rank, "gpu_util_pct" if gpu else "cpu_pct")
            mem = store.get(rank, "gpu_mem_used_bytes" if gpu else "rss_bytes")
            self.util.set_data(name, util.x, util.y, color(rank))
            self.mem.set_data(name, mem.x, mem.y / 2**30, color(rank))
            if gpu:
                temp = store.get(rank, "gpu_temp_c").last()
                power = store.get(rank, "gpu_power_w").last()
                total = store.get(rank, "gpu_mem_total_bytes").last()
                parts.append(f"{name}: {_fmt(util.last(), '%')}, "
                             f"{_fmt((mem.last() or 0) / 2**30, ' GiB')} of "
                             f"{_fmt((total or 0) / 2**30, ' GiB')}, {_fmt(temp, ' °C')}, "
                             f"{_fmt(power, ' W')}")
            else:
                parts.append(f"{name}: CPU {_fmt(util.last(), '%')}, RSS "
                             f"{_fmt((mem.last() or 0) / 2**30, ' GiB')}")
        self.caption.setText(" | ".join(parts))


class SyncPanel(PairPanel):
    """Gradient all-reduce time and its exposed part per rank, their share of the step, and the
    step-time breakdown of the last interval."""

    BREAKDOWN = (("data_wait_s", "data"), ("forward_s", "fwd"), ("backward_s", "bwd"),
                 ("sync_exposed_s", "exposed sync"), ("optimizer_s", "opt"))

    def __init__(self) -> None:
        self.sync = Chart("Gradient sync per step", "ms")
        self.share = Chart("Sync share of step time", "%")
        super().__init__(self.sync, self.share)

    def redraw(self, store: MetricStore) -> None:
        lines = []
        for rank in store.ranks():
            sync = store.get(rank, "sync_time_s")
            exposed = store.get(rank, "sync_exposed_s")
            step = store.get(rank, "step_time_s")
            self.sync.set_data(f"rank {rank}", sync.x, sync.y * 1e3, color(rank))
            self.sync.set_data(f"rank {rank} exposed", exposed.x, exposed.y * 1e3, color(rank),
                               dashed=True)
            n = min(len(sync), len(step))
            with np.errstate(divide="ignore", invalid="ignore"):
                share = 100 * sync.y[:n] / step.y[:n]
            self.share.set_data(f"rank {rank}", sync.x[:n], share, color(rank))
            parts = []
            for key, label in self.BREAKDOWN:
                v = store.get(rank, key).last()
                if v is not None and np.isfinite(v):
                    parts.append(f"{label} {v * 1e3:.1f}")
            total = step.last()
            if parts and total:
                lines.append(f"rank {rank} step {total * 1e3:.1f} ms = " + ", ".join(parts))
        self.caption.setText("\n".join(lines))


class ThroughputPanel(QWidget):
    def __init__(self) -> None:
        super().__init__()
        self.chart = Chart("Throughput", "samples/s")
        layout = QVBoxLayout(self)
        layout.setContentsMargins(0, 0, 0, 0)
        layout.addWidget(self.chart)

    def redraw(self, store: MetricStore) -> None:
        total = store.total_samples_per_s
        self.chart.set_data("all ranks", total.x, total.y, "#000000")
        for rank in store.ranks():
            s = store.get(rank, "samples_per_s")
            self.chart.set_data(f"rank {rank}", s.x, s.y, color(rank))


def _fmt(value: float | None, unit: str) -> str:
    if value is None or not np.isfinite(value):
        return "n/a"
    return f"{value:.1f}{unit}"
