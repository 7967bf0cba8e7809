"""Where telemetry lands before it is drawn: bounded series per rank (no Qt, no torch).

Arrival is not drawing: the telemetry thread's messages are added here as they come; charts
read the arrays on a redraw timer. Each series keeps at most ``capacity`` points: when full it
keeps every other point (the whole run stays visible at half the resolution), so memory is
bounded however long the run is.
"""

from __future__ import annotations

import os
import re
import time
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ddp_engine.common.heartbeat import ReportClock
from ddp_engine.common.run_dir import FINAL_STATES, iter_metrics, read_status
from ddp_engine.common.straggler import StragglerWatch, Verdict

RANK_FIELDS: tuple[str, ...] = (
    "loss", "step_time_s", "samples_per_s", "data_wait_s", "forward_s", "backward_s",
    "optimizer_s", "eval_s", "sync_time_s", "sync_exposed_s", "sync_bytes", "gpu_util_pct",
    "gpu_mem_used_bytes", "gpu_mem_total_bytes", "gpu_temp_c", "gpu_power_w", "cpu_pct",
    "rss_bytes")


SPREAD_ABOVE = 10
"""Above this many ranks the charts draw the spread across ranks (min, median, max) instead of
a line per rank: a line per rank would cost a frame's budget and be unreadable anyway."""
SPREAD_FIELDS: tuple[str, ...] = (*RANK_FIELDS, "sync_share_pct")
"""The per-rank fields whose spread is kept, with sync_time_s / step_time_s in %."""
STATS = ("min", "median", "max")
LOGGED_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_./-]{0,63}$")  # as ddp_engine/rank/logged.py
LOGGED_KEYS_MAX = 64  # logged keys kept, a chart each (32 per rank in the engine); no more


_F = len(RANK_FIELDS)
_FIELD = {name: i for i, name in enumerate(RANK_FIELDS)}
_SYNC, _STEP = _FIELD["sync_time_s"], _FIELD["step_time_s"]


class Table:
    """Rows that share an x (the step of one report): one value per column per row, appended
    together. When full it keeps every other row (the whole run stays visible at half the
    resolution), so memory is bounded however long the run is. Columns are contiguous (a chart
    reads a column's points in one slice) and may be added later (a rank that joins).

    The arrays start small and double up to ``capacity`` rows: a column-major table written
    one row at a time touches every column's memory at once, and the kernel (transparent huge
    pages) then zeroes all of it, which for 64 ranks' fields at full capacity took ~90 ms in
    the first report and kept 170 MB resident from the start."""

    START = 256  # rows allocated at first

    def __init__(self, capacity: int = 20_000, columns: int = 1) -> None:
        self.capacity = capacity
        size = min(capacity, self.START)
        self._x = np.empty(size, dtype=np.float64)
        self._y = np.empty((columns, size), dtype=np.float64)
        self._n = 0
        self._stride = 1  # keep one row in every `stride` appended
        self._skipped = 0
        self.generation = 0
        """Bumped whenever the rows kept so far are thinned (caches of them are stale)."""

    @property
    def columns(self) -> int:
        return self._y.shape[0]

    def add_columns(self, count: int) -> int:
        """Add ``count`` columns, NaN in the rows so far; returns the first one's index."""
        first = self.columns
        grown = np.empty((first + count, len(self._x)), dtype=np.float64)
        grown[:first, :self._n] = self._y[:, :self._n]
        grown[first:, :self._n] = np.nan
        self._y = grown
        return first

    def _grow(self) -> None:
        """Twice the rows (at most ``capacity``), the rows so far copied."""
        n, size = self._n, min(self.capacity, 2 * len(self._x))
        x = np.empty(size, dtype=np.float64)
        y = np.empty((self.columns, size), dtype=np.float64)
        x[:n] = self._x[:n]
        y[:, :n] = self._y[:, :n]
        self._x, self._y = x, y

    def append(self, x: float, values: np.ndarray) -> None:
        """One row: ``values`` holds one float per column (NaN where there is none)."""
        if self._skipped + 1 < self._stride:
            self._skipped += 1
            return
        self._skipped = 0
        n = self._n
        if n == len(self._x) < self.capacity:
            self._grow()
        elif n == self.capacity:
            half = n // 2
            self._x[:half] = self._x[1:n:2][:half]
            self._y[:, :half] = self._y[:, 1:n:2][:, :half]
            n = self._n = half
            self._stride *= 2
            self.generation += 1
        self._x[n] = x
        self._y[:, n] = values
        self._n = n + 1

    def __len__(self) -> int:
        return self._n

    @property
    def nbytes(self) -> int:
        """The memory its arrays hold."""
        return self._x.nbytes + self._y.nbytes

    @property
    def x(self) -> np.ndarray:
        return self._x[:self._n]

    def column(self, i: int) -> np.ndarray:
        return self._y[i, :self._n]


class Series:
    """One column of a :class:`Table`: x/y float arrays that grow, and halve their resolution
    when full. ``Series(capacity)`` is a column of a table of its own, fed by ``append``."""

    def __init__(self, capacity: int = 20_000, table: Table | None = None,
                 column: int = 0) -> None:
        self.table = table if table is not None else Table(capacity)
        self.index = column

    def append(self, x: float, y: float | None) -> None:
        """A point of a series that has its table to itself."""
        self.table.append(x, np.nan if y is None else y)

    def __len__(self) -> int:
        return len(self.table)

    @property
    def generation(self) -> int:
        return self.table.generation

    @property
    def x(self) -> np.ndarray:
        return self.table.x

    @property
    def y(self) -> np.ndarray:
        return self.table.column(self.index)

    def last(self) -> float | None:
        n = len(self.table)
        return float(self.table._y[self.index, n - 1]) if n else None


def as_floats(rows: list[dict[str, Any]], names: tuple[str, ...]) -> np.ndarray:
    """The ``names`` fields of each row as a float matrix, NaN where a field is missing, null
    or not a number (one bad value from the wire spoils nothing else)."""
    nan = np.nan
    cells = [[nan if (v := r.get(name)) is None else v for name in names] for r in rows]
    try:
        return np.array(cells, dtype=np.float64).reshape(len(rows), len(names))
    except (TypeError, ValueError):
        return np.array([[_float(v) for v in row] for row in cells],
                        dtype=np.float64).reshape(len(rows), len(names))


def _float(v: Any) -> float:
    try:
        return float(v)
    except (TypeError, ValueError, OverflowError):
        return np.nan


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
    last_eval: dict[str, Any] | None = None
    """The latest "eval" event: its step, val_loss and how long it took (eval_s)."""
    script: str | None = None  # the user's own script a script run trains (run_start's)
    sync_timing: str | None = None
    """Where the run's sync fields come from (run_start's): "reducer", "hook" or None."""


class MetricStore:
    """Every rank's series, validation loss, and what the progress line needs."""

    def __init__(self, capacity: int = 20_000) -> None:
        self.capacity = capacity
        self.clear()

    def clear(self) -> None:
        self.ranks_table = Table(self.capacity, 0)
        """Every rank's RANK_FIELDS, one row per report: a rank's fields are the columns from
        its slot times len(RANK_FIELDS) (slots in the order the ranks first came)."""
        self._slots: dict[int, int] = {}
        self._ranks: list[int] = []  # the ranks with a slot, sorted
        self.series: dict[tuple[int, str], Series] = {}
        self.val_loss = Series(self.capacity)
        self.total_samples_per_s = Series(self.capacity)
        self.mean_loss = Series(self.capacity)  # over ranks, per report
        self.report_time = Series(self.capacity)  # Unix time of each report, by step
        self.spread_table: Table | None = None  # min, median, max per SPREAD_FIELDS
        self.spreads: dict[tuple[str, str], Series] = {}  # (field, stat): above SPREAD_ABOVE
        self.info = RunInfo()
        self.events: list[dict[str, Any]] = []
        self.loss_spikes: list[dict[str, Any]] = []
        """The "warning" events of cause "loss_spike" (the loss chart marks each one's step)."""
        self.last_warning: dict[str, Any] | None = None  # the latest "warning" event
        self.warnings = 0  # how many came
        self.logged_tables: dict[str, Table] = {}
        """Per logged key (``rankscope.log``), in the order they came, apart from RANK_FIELDS
        so a key never shadows one: a row per report where a rank logged it; STATS across
        ranks (above SPREAD_ABOVE), then a column per rank slot (NaN: not logged)."""
        self.unavailable: dict[str, str] = {}
        """What a script run cannot show, and why (the latest "unavailable" event's items)."""
        self.straggler_watch = StragglerWatch()
        """The rank the others wait for in the all-reduce, once sustained (every report)."""
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
        """Field ``name`` of ``rank`` (empty for a rank or field never reported)."""
        key = (rank, name)
        series = self.series.get(key)
        if series is None:
            slot = self._slots.get(rank)
            if slot is not None and name in _FIELD:
                series = Series(table=self.ranks_table, column=slot * _F + _FIELD[name])
            else:
                series = Series(self.capacity)  # nothing will come: an empty one
                if slot is None:
                    return series  # not kept: it would shadow the rank's when it comes
            self.series[key] = series
        return series

    def logged(self, rank: int, key: str) -> Series:
        """Logged ``key`` of ``rank``, NaN where it did not log it (empty: never logged)."""
        table, slot = self.logged_tables.get(key), self._slots.get(rank)
        if table is None or slot is None or len(STATS) + slot >= table.columns:
            return Series(1)
        return Series(table=table, column=len(STATS) + slot)

    def logged_spread(self, key: str) -> tuple[Series, Series, Series]:
        """Min, median and max of logged ``key`` across ranks (runs above SPREAD_ABOVE)."""
        table = self.logged_tables.get(key) or Table(1, len(STATS))
        return Series(table=table), Series(table=table, column=1), Series(table=table, column=2)

    def _slot(self, rank: int) -> int:
        slot = self._slots.get(rank)
        if slot is None:
            slot = self._slots[rank] = self.ranks_table.add_columns(_F) // _F
            self._ranks = sorted([*self._ranks, rank])
        return slot

    def spread(self, name: str) -> tuple[Series, Series, Series]:
        """Min, median and max of field ``name`` across ranks, per report (kept for runs of
        more than SPREAD_ABOVE ranks)."""
        first = SPREAD_FIELDS.index(name) * len(STATS)
        out = []
        for i, stat in enumerate(STATS):
            key = (name, stat)
            if key not in self.spreads:
                self.spreads[key] = Series(table=self._spread_table(), column=first + i)
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
        rows = [r for r in m.get("ranks") or [] if isinstance(r, dict) and "rank" in r]
        slots = []
        for r in rows:
            rank = int(r["rank"])
            info.devices[rank] = str(r.get("device", ""))
            slots.append(self._slot(rank))
        values = as_floats(rows, RANK_FIELDS)  # one row per rank
        row = np.full((self.ranks_table.columns // _F, _F), np.nan)
        row[slots] = values
        self.ranks_table.append(step, row.ravel())
        samples = values[:, _FIELD["samples_per_s"]]
        losses = values[:, _FIELD["loss"]]
        losses = losses[~np.isnan(losses)]
        if len(rows) > SPREAD_ABOVE:
            self._spread(step, values)
        self.total_samples_per_s.append(step, None if np.isnan(samples).all()  # a script
                                        else float(np.nansum(samples)))  # without DDP: none
        self.mean_loss.append(step, float(losses.mean()) if len(losses) else None)
        self.report_time.append(step, now)
        self.straggler_watch.add(m)
        info.world_size = max(info.world_size, len(rows))
        self._logged(step, rows, slots)

    def _logged(self, step: float, rows: list[dict[str, Any]], slots: list[int]) -> None:
        """Each rank's ``logged`` scalars: a row in the table of each key some rank logged."""
        width, new = len(STATS) + len(self._slots), {}
        for r, slot in zip(rows, slots, strict=True):
            logged = r.get("logged")
            for key, value in logged.items() if isinstance(logged, dict) else ():
                if isinstance(key, str) and LOGGED_NAME.match(key) and \
                        np.isfinite(v := _float(value)):
                    if (row := new.get(key)) is None:
                        row = new[key] = np.full(width, np.nan)
                    row[len(STATS) + slot] = v
        for key, row in new.items():
            table = self.logged_tables.get(key)
            if table is None and len(self.logged_tables) < LOGGED_KEYS_MAX:
                table = self.logged_tables[key] = Table(self.capacity, width)
            if table is None:
                continue
            if table.columns < width:  # a rank joined
                table.add_columns(width - table.columns)
            if len(rows) > SPREAD_ABOVE:
                got = row[len(STATS):][np.isfinite(row[len(STATS):])]
                row[:len(STATS)] = got.min(), np.median(got), got.max()
            table.append(step, row)

    def _spread(self, step: float, table: np.ndarray) -> None:
        """Min, median and max of every field across ranks (rows): one sort per field (NaNs,
        the fields a rank does not have, sort last and are left out)."""
        with np.errstate(divide="ignore", invalid="ignore"):
            share = 100 * table[:, _SYNC] / table[:, _STEP]
        table = np.sort(np.column_stack([table, share]), axis=0)
        n = np.isfinite(table).sum(axis=0)
        cols = np.arange(table.shape[1])
        lo = np.where(n > 0, table[0], np.nan)
        hi = np.where(n > 0, table[np.maximum(n - 1, 0), cols], np.nan)
        mid = np.where(n > 0, (table[np.maximum((n - 1) // 2, 0), cols]
                               + table[np.maximum(n // 2, 0), cols]) / 2, np.nan)
        self._spread_table().append(step, np.column_stack([lo, mid, hi]).ravel())

    def _spread_table(self) -> Table:
        """The spreads' table: column ``field * 3 + stat`` (SPREAD_FIELDS, STATS)."""
        if self.spread_table is None:
            self.spread_table = Table(self.capacity, len(SPREAD_FIELDS) * len(STATS))
        return self.spread_table

    def _event(self, e: dict[str, Any]) -> None:
        kind = e.get("kind")
        self.events.append(e)
        if kind == "run_start":
            self.info.total_steps = e.get("total_steps")
            self.info.steps_per_epoch = e.get("steps_per_epoch")
            self.info.world_size = int(e.get("world_size") or self.info.world_size)
            self.info.start_time = e.get("time")
            self.info.start_step = int(e.get("start_step") or 0)
            script = e.get("script")
            self.info.script = script if isinstance(script, str) and script else None
            timing = e.get("sync_timing")
            self.info.sync_timing = timing if timing in ("reducer", "hook") else None
        elif kind == "eval" and e.get("val_loss") is not None:
            self.val_loss.append(float(e.get("step", 0)), e["val_loss"])
            self.info.last_eval = e
        elif kind == "unavailable":  # the latest says all: {} when everything is shown
            items = e.get("items")
            self.unavailable = ({str(k): str(v) for k, v in items.items()}
                                if isinstance(items, dict) else {})
        elif kind in ("stopping", "stopped", "completed", "failed"):
            self.info.state = kind
        elif kind == "warning":
            self.last_warning = e
            self.warnings += 1
            if e.get("cause") == "loss_spike" and isinstance(e.get("step"), int | float):
                self.loss_spikes.append(e)

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

    def straggler(self) -> Verdict | None:
        """The straggler and its likely cause (see :mod:`ddp_engine.common.straggler`)."""
        return self.straggler_watch.verdict

    def stall_s(self, now: float | None = None, factor: float = 5.0,
                minimum_s: float = 10.0) -> float | None:
        """Seconds since the last report when that is over ``factor`` typical intervals (and
        ``minimum_s``): the run looks hung. None while it is progressing, and once it ended or
        its remote rank 0 is out of reach ("disconnected": no news is not a hang)."""
        if self.info.state in ("stopped", "completed", "failed", "disconnected"):
            return None
        return self.info.clock.stall_s(time.time() if now is None else now, factor, minimum_s)
