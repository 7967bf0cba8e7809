"""The dashboard's charts: loss, devices, gradient sync, throughput, and a chart per series the
run logged by name."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
from PySide6.QtCore import Qt
from PySide6.QtWidgets import (
    QCheckBox,
    QHBoxLayout,
    QLabel,
    QSlider,
    QVBoxLayout,
    QWidget,
)

from app.charts.base import Chart, color
from app.charts.caption import ElidedLabel
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


SPIKE_COLOR = "#b35900"  # the dashboard's alert colour


class LossPanel(QWidget):
    """Loss per rank (toggles, smoothing), validation loss, and a mark at each loss spike the
    engine warned of."""

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
        self.log = QCheckBox("log")
        self.log.setObjectName("loss_log")
        self.log.setToolTip("a logarithmic loss axis")
        self.log.toggled.connect(self.chart.set_log_y)
        controls.addWidget(self.log)
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
        for spike in store.loss_spikes[len(self.chart.marks):]:  # the new ones
            self.chart.mark(float(spike["step"]), "loss spike", SPIKE_COLOR,
                            str(spike.get("message") or ""))

    def clear(self) -> None:
        self.chart.reset()
        for box in self.toggles.values():  # out of the row now: deleted when Qt is back in
            self.toggles_row.removeWidget(box)  # its event loop
            box.hide()
            box.deleteLater()
        self.toggles.clear()
        self.smoothers.clear()


class PairPanel(QWidget):
    """Two charts side by side over a caption line, worded by ``caption`` from the store."""

    def __init__(self, left: Chart, right: Chart,
                 caption: Callable[[MetricStore], str]) -> None:
        super().__init__()
        self._caption = caption
        self.caption = ElidedLabel()  # a line too long ends in an ellipsis; all in its tooltip
        layout = QVBoxLayout(self)
        layout.setContentsMargins(0, 0, 0, 0)
        row = QHBoxLayout()
        row.addWidget(left)
        row.addWidget(right)
        layout.addLayout(row)
        layout.addWidget(self.caption)

    def redraw_caption(self, store: MetricStore) -> None:
        """The caption, from the store's latest values (the dashboard does this a few times a
        second, not in every frame: a label's new text repaints the window around it)."""
        self.caption.set_full_text(self._caption(store))


class DevicePanel(PairPanel):
    """Per GPU: utilization and memory, with temperature and power in the caption; on CPU
    ranks: CPU % and RSS per rank. The two charts redraw separately (the dashboard spreads
    them over frames); the caption goes with the utilization chart."""

    def __init__(self) -> None:
        self.util = Chart("Utilization", "%", from_zero=True)
        self.mem = Chart("Memory", "GiB", from_zero=True)
        self._mem_unit = (2**30, "GiB")
        super().__init__(self.util, self.mem, self._device_caption)

    def redraw(self, store: MetricStore) -> None:
        self.redraw_util(store)
        self.redraw_mem(store)
        self.redraw_caption(store)

    @staticmethod
    def _gpu(store: MetricStore, rank: int) -> bool:
        return store.info.devices.get(rank, "").startswith(("GPU", "cuda"))

    def _name(self, store: MetricStore, rank: int) -> str:
        device = store.info.devices.get(rank, "")
        return f"{device} (rank {rank})" if self._gpu(store, rank) else f"rank {rank} (cpu)"

    def _on_gpus(self, store: MetricStore) -> bool:
        """The run's ranks are on GPUs (as the first rank is)."""
        ranks = store.ranks()
        return bool(ranks) and self._gpu(store, ranks[0])

    def _what(self, store: MetricStore) -> str:
        n = len(store.ranks())
        return f"{n} GPUs" if self._on_gpus(store) else f"{n} ranks (cpu)"

    def redraw_util(self, store: MetricStore) -> None:
        if store.many_ranks:
            gpu = self._on_gpus(store)
            lo, mid, hi = store.spread("gpu_util_pct" if gpu else "cpu_pct")
            self.util.set_spread(self._what(store), mid.x, lo.y, mid.y, hi.y, color(0))
            return
        for rank in store.ranks():
            util = store.get(rank, "gpu_util_pct" if self._gpu(store, rank) else "cpu_pct")
            self.util.set_data(self._name(store, rank), util.x, util.y, color(rank))

    def _device_caption(self, store: MetricStore) -> str:
        if store.many_ranks:
            gpu = self._on_gpus(store)
            lo, mid, _hi = store.spread("gpu_util_pct" if gpu else "cpu_pct")
            return self._spread_caption(store, gpu, lo, mid)
        return " | ".join(self._rank_caption(store, r) for r in store.ranks())

    def _unit(self, largest: float) -> float:
        """Bytes per unit of the memory axis: MiB below 1 GiB, else GiB (relabelled when it
        changes)."""
        unit = (2**20, "MiB") if largest < 2**30 else (2**30, "GiB")
        if unit != self._mem_unit:
            self._mem_unit = unit
            self.mem.setLabel("left", unit[1])
        return unit[0]

    def redraw_mem(self, store: MetricStore) -> None:
        if store.many_ranks:
            gpu = self._on_gpus(store)
            lo, mid, hi = store.spread("gpu_mem_used_bytes" if gpu else "rss_bytes")
            div = self._unit(_largest(hi.y))
            self.mem.set_spread(self._what(store), mid.x, lo.y / div, mid.y / div, hi.y / div,
                                color(0))
            return
        series = {rank: store.get(rank, "gpu_mem_used_bytes" if self._gpu(store, rank)
                                  else "rss_bytes") for rank in store.ranks()}
        div = self._unit(max((_largest(m.y) for m in series.values()), default=0.0))
        for rank, mem in series.items():
            self.mem.set_data(self._name(store, rank), mem.x, mem.y / div, color(rank))

    def _rank_caption(self, store: MetricStore, rank: int) -> str:
        name = self._name(store, rank)
        if not self._gpu(store, rank):
            return (f"{name}: CPU {_fmt(store.get(rank, 'cpu_pct').last(), '%')}, RSS "
                    f"{_fmt((store.get(rank, 'rss_bytes').last() or 0) / 2**30, ' GiB')}")
        used = store.get(rank, "gpu_mem_used_bytes").last()
        total = store.get(rank, "gpu_mem_total_bytes").last()
        return (f"{name}: {_fmt(store.get(rank, 'gpu_util_pct').last(), '%')}, "
                f"{_fmt((used or 0) / 2**30, ' GiB')} of {_fmt((total or 0) / 2**30, ' GiB')}, "
                f"{_fmt(store.get(rank, 'gpu_temp_c').last(), ' °C')}, "
                f"{_fmt(store.get(rank, 'gpu_power_w').last(), ' W')}")

    def _spread_caption(self, store: MetricStore, gpu: bool, util_lo: Series,
                        util_mid: Series) -> str:
        _mem_lo, mem_mid, mem_hi = store.spread("gpu_mem_used_bytes" if gpu else "rss_bytes")
        text = (f"{self._what(store)}: utilization median {_fmt(util_mid.last(), '%')} (min "
                f"{_fmt(util_lo.last(), '%')}), memory median "
                f"{_fmt((mem_mid.last() or 0) / 2**30, ' GiB')} (max "
                f"{_fmt((mem_hi.last() or 0) / 2**30, ' GiB')}")
        if not gpu:
            return text + ")"
        total = store.spread("gpu_mem_total_bytes")[2].last()
        power = [store.get(r, "gpu_power_w").last() for r in store.ranks()]
        return text + (f" of {_fmt((total or 0) / 2**30, ' GiB')}), temperature max "
                       f"{_fmt(store.spread('gpu_temp_c')[2].last(), ' °C')}, power total "
                       f"{_fmt(sum(w for w in power if w is not None and np.isfinite(w)), ' W')}")


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


class LoggedPanel(QWidget):
    """One series the run logged by name (``rankscope.log(acc=...)``, the built-in loop's
    ``lr``): a chart titled by the key, a curve per rank that logged it (above SPREAD_ABOVE
    ranks, their median, min and max). A rank's curve joins the reports where it logged the
    key, over those where it did not."""

    def __init__(self, key: str) -> None:
        super().__init__()
        self.key = key
        self.chart = Chart(key, "")
        self.title = key
        self.chart.getAxis("left").showLabel(False)  # the title names it
        layout = QVBoxLayout(self)
        layout.setContentsMargins(0, 0, 0, 0)
        layout.addWidget(self.chart)

    def redraw(self, store: MetricStore) -> None:
        if store.many_ranks:
            lo, mid, hi = store.logged_spread(self.key)
            keep = np.isfinite(mid.y)
            self.chart.set_spread(f"{len(store.ranks())} ranks", mid.x[keep], lo.y[keep],
                                  mid.y[keep], hi.y[keep], color(0))
            self._title(mid.y[keep], "median")
            return
        first: np.ndarray | None = None
        for rank in store.ranks():
            s = store.logged(rank, self.key)
            keep = np.isfinite(s.y)
            if keep.any() or f"rank {rank}" in self.chart.curves:
                self.chart.set_data(f"rank {rank}", s.x[keep], s.y[keep], color(rank))
            if first is None and keep.any():
                first = s.y[keep]
        self._title(first, f"rank {store.ranks()[0]}" if store.ranks() else "")

    def _title(self, values: np.ndarray | None, whose: str) -> None:
        """The key and its latest value in the title: a flat series (a constant lr) reads as
        its number, not as a line at an unlabelled height."""
        text = self.key if values is None or not len(values) else (
            f"{self.key}: {float(values[-1]):.4g} ({whose}, latest)")
        if text != self.title:
            self.title = text
            self.chart.setTitle(text, color="#333", size="10pt")


def _fmt(value: float | None, unit: str) -> str:
    if value is None or not np.isfinite(value):
        return "n/a"
    return f"{value:.1f}{unit}"


def _largest(y: np.ndarray) -> float:
    """The largest finite value of ``y`` (0 for none)."""
    finite = y[np.isfinite(y)] if len(y) else y
    return float(finite.max()) if len(finite) else 0.0
