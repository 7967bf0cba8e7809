"""Where telemetry lands before it is drawn: bounded series per rank (no Qt, no torch).

Arrival is not drawing: the telemetry thread's messages are added here as they come; charts
read the arrays on a redraw timer. Each series keeps at most ``capacity`` points: when full it
keeps every other point (the whole run stays visible at half the resolution), so memory is
bounded however long the run is.
"""

from __future__ import annotations

import os
import statistics
import time
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ddp_engine.heartbeat import ReportClock
from ddp_engine.run_dir import FINAL_STATES, iter_metrics, read_status

RANK_FIELDS: tuple[str, ...] = (
    "loss", "step_time_s", "samples_per_s", "data_wait_s", "forward_s", "backward_s",
    "optimizer_s", "sync_time_s", "sync_exposed_s", "sync_bytes", "gpu_util_pct",
    "gpu_mem_used_bytes", "gpu_mem_total_bytes", "gpu_temp_c", "gpu_power_w", "cpu_pct",
    "rss_bytes")


SPREAD_ABOVE = 10
"""Above this many ranks the charts draw the spread across ranks (min, median, max) instead of
a line per rank: a line per rank would cost a frame's budget and be unreadable anyway."""
SPREAD_FIELDS: tuple[str, ...] = (*RANK_FIELDS, "sync_share_pct")
"""The per-rank fields whose spread is kept, with sync_time_s / step_time_s in %."""
STATS = ("min", "median", "max")


_SYNC, _STEP = RANK_FIELDS.index("sync_time_s"), RANK_FIELDS.index("step_time_s")


class Series:
    """x/y float arrays that grow, and halve their resolution when full."""

    def __init__(self, capacity: int = 20_000) -> None:
        self.capacity = capacity
        self._x = np.empty(capacity, dtype=np.float64)
        self._y = np.empty(capacity, dtype=np.float64)
        self._n = 0
        self._stride = 1  # keep one point in every `stride` appended
        self._skipped = 0
        self.generation = 0
        """Bumped whenever the points kept so far are thinned (caches of them are stale)."""

    def append(self, x: float, y: float | None) -> None:
        if self._skipped + 1 < self._stride:
            self._skipped += 1
            return
        self._skipped = 0
        if self._n == self.capacity:
            half = self._n // 2
            self._x[:half] = self._x[1:self._n:2][:half]
            self._y[:half] = self._y[1:self._n:2][:half]
            self._n = half
            self._stride *= 2
            self.generation += 1
        self._x[self._n] = x
        self._y[self._n] = np.nan if y is None else y
        self._n += 1

    def __len__(self) -> int:
        return self._n

    @property
    def x(self) -> np.ndarray:
        return self._x[:self._n]

    @property
    def y(self) -> np.ndarray:
        return self._y[:self._n]

    def last(self) -> float | None:
        return float(self._y[self._n - 1]) if self._n else None


@dataclass
class RunInfo:
    world_size: int = 0
    total_steps: int | None = None
    steps_per_epoch: int | None = None
    step: int = 0
    epoch: int = 0
    state: str = "idle"
    devices: dict[int, str] = field(default_factory=dict)
    last_metrics_time: float | None = None
    clock: ReportClock = field(default_factory=ReportClock)
    """When metrics last came, and how often they usually do."""
    start_time: float | None = None
    start_step: int = 0


class MetricStore:
    """Every rank's series, validation loss, and what the progress line needs."""

    def __init__(self, capacity: int = 20_000) -> None:
        self.capacity = capacity
        self.clear()

    def clear(self) -> None:
        self.series: dict[tuple[int, str], Series] = {}
        self._ranks: list[int] = []  # the ranks of self.series, sorted
        self._columns: dict[int, list[Series]] = {}  # a rank's series, in RANK_FIELDS order
        self.val_loss = Series(self.capacity)
        self.total_samples_per_s = Series(self.capacity)
        self.mean_loss = Series(self.capacity)  # over ranks, per report
        self.report_time = Series(self.capacity)  # Unix time of each report, by step
        self.spreads: dict[tuple[str, str], Series] = {}  # (field, stat): above SPREAD_ABOVE
        self.info = RunInfo()
        self.events: list[dict[str, Any]] = []
        self.version = 0  # bumped on every change: charts redraw only when it moved

    def load_run(self, run_dir: str | os.PathLike[str]) -> None:
        """Replace the contents with a run's record: metrics.jsonl, and its state from
        status.json (a run folder that is not live)."""
        self.clear()
        self.add_many(iter_metrics(run_dir))
        status = read_status(run_dir) or {}
        if status.get("state") in FINAL_STATES:
            self.info.state = str(status["state"])
        self.info.world_size = max(self.info.world_size, int(status.get("world_size") or 0))
        self.info.total_steps = self.info.total_steps or status.get("total_steps")
        self.version += 1

    def get(self, rank: int, name: str) -> Series:
        key = (rank, name)
        series = self.series.get(key)
        if series is None:
            series = self.series[key] = Series(self.capacity)
            if rank not in self._ranks:
                self._ranks = sorted([*self._ranks, rank])
        return series

    def spread(self, name: str) -> tuple[Series, Series, Series]:
        """Min, median and max of field ``name`` across ranks, per report (kept for runs of
        more than SPREAD_ABOVE ranks)."""
        out = []
        for stat in STATS:
            key = (name, stat)
            if key not in self.spreads:
                self.spreads[key] = Series(self.capacity)
            out.append(self.spreads[key])
        return out[0], out[1], out[2]

    @property
    def many_ranks(self) -> bool:
        """Too many ranks for a line each: charts show the spread (see SPREAD_ABOVE)."""
        return max(self.info.world_size, len(self.ranks())) > SPREAD_ABOVE

    def ranks(self) -> list[int]:
        return list(self._ranks)

    def add_many(self, messages: Iterable[dict[str, Any]]) -> None:
        for m in messages:
            self.add(m)

    def add(self, message: dict[str, Any]) -> None:
        """Take one protocol message (metrics, event or welcome)."""
        kind = message.get("type")
        if kind == "welcome":
            self.info.world_size = int(message.get("world_size") or 0)
            status = message.get("status") or {}
            self.info.total_steps = status.get("total_steps")
        elif kind == "metrics":
            self._metrics(message)
        elif kind == "event":
            self._event(message)
        else:
            return
        self.version += 1

    def _metrics(self, m: dict[str, Any]) -> None:
        step = float(m.get("step", 0))
        info = self.info
        now = float(m.get("time") or time.time())
        info.clock.tick(now)
        info.last_metrics_time = now
        info.step = int(step)
        info.epoch = int(m.get("epoch", info.epoch))
        info.total_steps = m.get("total_steps", info.total_steps)
        total = 0.0
        losses = []
        rows = m.get("ranks", [])
        for r in rows:
            rank = int(r["rank"])
            info.devices[rank] = str(r.get("device", ""))
            columns = self._columns.get(rank)
            if columns is None:
                columns = self._columns[rank] = [self.get(rank, n) for n in RANK_FIELDS]
            for name, series in zip(RANK_FIELDS, columns, strict=True):
                if name in r:
                    series.append(step, r[name])
            total += r.get("samples_per_s") or 0.0
            if isinstance(r.get("loss"), int | float):
                losses.append(float(r["loss"]))
        if len(rows) > SPREAD_ABOVE:
            self._spread(step, rows)
        self.total_samples_per_s.append(step, total)
        self.mean_loss.append(step, float(np.nanmean(losses)) if losses else None)
        self.report_time.append(step, now)
        info.world_size = max(info.world_size, len(m.get("ranks", [])))

    def _spread(self, step: float, rows: list[dict[str, Any]]) -> None:
        """Min, median and max of every field across ranks: one matrix, one sort (NaNs, the
        fields a rank does not have, sort last and are left out)."""
        cells = np.array([[r.get(name) for name in RANK_FIELDS] for r in rows], dtype=object)
        cells[np.equal(cells, None)] = np.nan
        table = cells.astype(np.float64)
        with np.errstate(divide="ignore", invalid="ignore"):
            share = 100 * table[:, _SYNC] / table[:, _STEP]
        table = np.sort(np.column_stack([table, share]), axis=0)
        n = np.isfinite(table).sum(axis=0)
        cols = np.arange(table.shape[1])
        lo = np.where(n > 0, table[0], np.nan)
        hi = table[np.maximum(n - 1, 0), cols]
        mid = (table[np.maximum((n - 1) // 2, 0), cols] + table[np.maximum(n // 2, 0), cols]) / 2
        for i, name in enumerate(SPREAD_FIELDS):
            for series, values in zip(self.spread(name), (lo, mid, hi), strict=True):
                series.append(step, float(values[i]) if n[i] else None)

    def _event(self, e: dict[str, Any]) -> None:
        kind = e.get("kind")
        self.events.append(e)
        if kind == "run_start":
            self.info.total_steps = e.get("total_steps")
            self.info.steps_per_epoch = e.get("steps_per_epoch")
            self.info.world_size = int(e.get("world_size") or self.info.world_size)
            self.info.start_time = e.get("time")
            self.info.start_step = int(e.get("start_step") or 0)
        elif kind == "eval" and e.get("val_loss") is not None:
            self.val_loss.append(float(e.get("step", 0)), e["val_loss"])
        elif kind in ("stopping", "stopped", "completed", "failed"):
            self.info.state = kind

    # ------------------------------------------------------------------------- derived
    def eta_s(self) -> float | None:
        """Seconds left at the recent pace (None until two reports arrived)."""
        info = self.info
        if not info.total_steps or info.start_time is None or info.last_metrics_time is None:
            return None
        done = info.step - info.start_step
        elapsed = info.last_metrics_time - info.start_time
        if done <= 0 or elapsed <= 0:
            return None
        return (info.total_steps - info.step) * elapsed / done

    def stragglers(self, threshold: float = 0.2) -> dict[int, float]:
        """Ranks whose last step time is more than ``threshold`` above the median: rank -> excess
        (0.35 means 35% slower)."""
        last = {r: self.get(r, "step_time_s").last() for r in self.ranks()}
        values = {r: v for r, v in last.items() if v is not None and np.isfinite(v)}
        if len(values) < 2:
            return {}
        med = statistics.median(values.values())
        if med <= 0:
            return {}
        return {r: v / med - 1 for r, v in values.items() if v > med * (1 + threshold)}

    def stall_s(self, now: float | None = None, factor: float = 5.0,
                minimum_s: float = 10.0) -> float | None:
        """Seconds since the last report when that is over ``factor`` typical intervals (and
        ``minimum_s``): the run looks hung. None while it is progressing."""
        info = self.info
        if info.state in ("stopped", "completed", "failed"):
            return None
        return info.clock.stall_s(now if now is not None else time.time(), factor, minimum_s)
