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
from app.metric_store import MetricStore, Series


def smooth(y: np.ndarray, weight: float) -> np.ndarray:
    """TensorBoard's smoothing: a debiased exponential moving average, NaNs passed over."""
    if weight <= 0 or len(y) == 0:
        return y
    return ema(y, weight, 0.0, 0)[0]


def ema(y: np.ndarray, weight: float, last: float, count: int) -> tuple[np.ndarray, float, int]:
    """Continue an exponential moving average over ``y`` (NaNs passed over, left NaN) from the
    state ``last`` (the biased average) and ``count`` (finite values seen); returns the
    debiased averages and the new state.

    Vectorized in chunks: within a chunk, last_k = w^k (last + (1 - w) sum_j<=k v_j w^-j), with
    chunks short enough that w^-k stays below 1e150."""
    out = np.full(len(y), np.nan)
    finite = np.flatnonzero(np.isfinite(y))
    values = y[finite]
    smoothed = np.empty(len(values))
    chunk = max(1, int(150 / -np.log10(weight)))
    for pos in range(0, len(values), chunk):
        v = values[pos:pos + chunk]
        wk = weight ** np.arange(1, len(v) + 1, dtype=np.float64)
        biased = wk * (last + (1 - weight) * np.cumsum(v / wk))
        smoothed[pos:pos + len(v)] = biased / (1 - weight ** (count + pos + np.arange(
            1, len(v) + 1)))
        last = float(biased[-1])
    out[finite] = smoothed
    return out, last, count + len(values)


class Smoother:
    """:func:`smooth` of one growing :class:`Series`, extended by only the points added since
    the last call; recomputed when the series was thinned or the weight changed."""

    def __init__(self) -> None:
        self._key: tuple[int, int, float] | None = None
        self._out = np.empty(0)
        self._done = 0
        self._last = 0.0
        self._count = 0

    def __call__(self, series: Series, weight: float) -> np.ndarray:
        y = series.y
        if weight <= 0:
            return y
        key = (id(series), series.generation, weight)
        if key != self._key or len(y) < self._done:
            self._key, self._done, self._last, self._count = key, 0, 0.0, 0
        if len(self._out) < len(y):
            grown = np.empty(max(len(y), 2 * len(self._out)))
            grown[:self._done] = self._out[:self._done]
            self._out = grown
        if len(y) > self._done:
            new, self._last, self._count = ema(y[self._done:], weight, self._last, self._count)
            self._out[self._done:len(y)] = new
            self._done = len(y)
        return self._out[:len(y)]


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
        self.smoothers: dict[int | str, Smoother] = {}  # by rank, or by spread statistic
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
        if store.many_ranks:
            lo, mid, hi = store.spread("loss")
            n = len(store.ranks())
            smoothed = [self.smoothers.setdefault(k, Smoother())(series, weight)
                        for k, series in (("min", lo), ("median", mid), ("max", hi))]
            self.chart.set_spread(f"{n} ranks", mid.x, *smoothed, color(0))
        for rank in [] if store.many_ranks else store.ranks():
            s = store.get(rank, "loss")
            visible = self._toggle(rank).isChecked()
            name = f"rank {rank}"
            if visible:
                smoother = self.smoothers.setdefault(rank, Smoother())
                self.chart.set_data(name, s.x, smoother(s, weight), color(rank))
            self.chart.curve(name, color(rank)).setVisible(visible)
        if len(store.val_loss):
            self.chart.set_data("validation", store.val_loss.x, store.val_loss.y, "#000000",
                                dashed=True)

    def clear(self) -> None:
        self.chart.reset()
        for box in self.toggles.values():
            box.deleteLater()
        self.toggles.clear()
        self.smoothers.clear()


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
        if store.many_ranks:
            self._redraw_spread(store)
            return
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

    def _redraw_spread(self, store: MetricStore) -> None:
        ranks = store.ranks()
        gpu = store.info.devices.get(ranks[0], "").startswith("cuda") if ranks else False
        util_lo, util_mid, util_hi = store.spread("gpu_util_pct" if gpu else "cpu_pct")
        mem_lo, mem_mid, mem_hi = store.spread("gpu_mem_used_bytes" if gpu else "rss_bytes")
        n = len(ranks)
        what = f"{n} GPUs" if gpu else f"{n} ranks (cpu)"
        self.util.set_spread(what, util_mid.x, util_lo.y, util_mid.y, util_hi.y, color(0))
        self.mem.set_spread(what, mem_mid.x, mem_lo.y / 2**30, mem_mid.y / 2**30,
                            mem_hi.y / 2**30, color(0))
        text = (f"{what}: utilization median {_fmt(util_mid.last(), '%')} (min "
                f"{_fmt(util_lo.last(), '%')}), memory median "
                f"{_fmt((mem_mid.last() or 0) / 2**30, ' GiB')} (max "
                f"{_fmt((mem_hi.last() or 0) / 2**30, ' GiB')}")
        if gpu:
            total = store.spread("gpu_mem_total_bytes")[2].last()
            power = [store.get(r, "gpu_power_w").last() for r in ranks]
            text += (f" of {_fmt((total or 0) / 2**30, ' GiB')}), temperature max "
                     f"{_fmt(store.spread('gpu_temp_c')[2].last(), ' °C')}, power total "
                     f"{_fmt(sum(w for w in power if w is not None), ' W')}")
        else:
            text += ")"
        self.caption.setText(text)


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
        if store.many_ranks:
            self._redraw_spread(store)
            return
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
            line = self._breakdown(f"rank {rank}", step.last(), parts)
            if line:
                lines.append(line)
        self.caption.setText("\n".join(lines))

    @staticmethod
    def _breakdown(who: str, total: float | None, parts: list[str]) -> str | None:
        return f"{who} step {total * 1e3:.1f} ms = " + ", ".join(parts) if parts and total \
            else None

    def _redraw_spread(self, store: MetricStore) -> None:
        """The spread across ranks; the caption breaks down the median and the slowest rank."""
        n = len(store.ranks())
        lo, mid, hi = store.spread("sync_time_s")
        self.sync.set_spread(f"{n} ranks", mid.x, lo.y * 1e3, mid.y * 1e3, hi.y * 1e3, color(0))
        exposed = store.spread("sync_exposed_s")[1]
        self.sync.set_data("exposed median", exposed.x, exposed.y * 1e3, color(0), dashed=True)
        lo, mid, hi = store.spread("sync_share_pct")
        self.share.set_spread(f"{n} ranks", mid.x, lo.y, mid.y, hi.y, color(0))
        medians = []
        for key, label in self.BREAKDOWN:
            v = store.spread(key)[1].last()
            if v is not None and np.isfinite(v):
                medians.append(f"{label} {v * 1e3:.1f}")
        lines = [self._breakdown("median", store.spread("step_time_s")[1].last(), medians)]
        steps = {r: store.get(r, "step_time_s").last() for r in store.ranks()}
        known = {r: v for r, v in steps.items() if v is not None and np.isfinite(v)}
        if known:
            slow = max(known, key=lambda r: known[r])
            parts = []
            for key, label in self.BREAKDOWN:
                v = store.get(slow, key).last()
                if v is not None and np.isfinite(v):
                    parts.append(f"{label} {v * 1e3:.1f}")
            lines.append(self._breakdown(f"slowest, rank {slow}", known[slow], parts))
        self.caption.setText("\n".join(line for line in lines if line))


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
        if store.many_ranks:
            lo, mid, hi = store.spread("samples_per_s")
            self.chart.set_spread("per rank", mid.x, lo.y, mid.y, hi.y, color(0))
        for rank in [] if store.many_ranks else store.ranks():
            s = store.get(rank, "samples_per_s")
            self.chart.set_data(f"rank {rank}", s.x, s.y, color(rank))


def _fmt(value: float | None, unit: str) -> str:
    if value is None or not np.isfinite(value):
        return "n/a"
    return f"{value:.1f}{unit}"
