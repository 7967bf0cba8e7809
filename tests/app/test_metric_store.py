"""The store behind the charts: bounded over a million steps, stragglers, stalls, ETA."""

from __future__ import annotations

import numpy as np
import pytest

from app.metric_store import MetricStore, Series, Table


def _metrics(step: int, t: float, step_times: list[float]) -> dict:
    return {"type": "metrics", "time": t, "step": step, "epoch": 0, "total_steps": 1000,
            "ranks": [{"rank": r, "loss": 1.0 / (1 + step), "step_time_s": st,
                       "samples_per_s": 100.0, "device": "cpu"}
                      for r, st in enumerate(step_times)]}


def test_a_series_stays_bounded_and_keeps_the_whole_run() -> None:
    s = Series(capacity=1000)
    for step in range(1_000_000):
        s.append(step, float(step))
    assert len(s) <= 1000
    assert s.x[0] < 2_000 and s.x[-1] > 998_000  # the start and the end are both there
    assert np.all(np.diff(s.x) > 0)


def test_a_million_steps_of_two_ranks_fit_in_bounded_memory() -> None:
    store = MetricStore(capacity=2000)
    for step in range(1, 1_000_001, 10):
        store.add(_metrics(step, float(step), [0.01, 0.01]))
    assert all(len(s) <= 2000 for s in store.series.values())
    assert store.info.step == 999_991


def test_stragglers_and_stalls_and_eta() -> None:
    store = MetricStore()
    store.add({"type": "event", "kind": "run_start", "time": 0.0, "total_steps": 1000,
               "world_size": 3, "start_step": 0})
    for i in range(1, 11):
        store.add(_metrics(10 * i, float(i), [0.010, 0.010, 0.015]))
    assert store.straggler() is None  # a long step names nobody: the all-reduce wait does
    assert store.eta_s() == 90.0  # 100 steps took 10 s; 900 to go
    assert store.stall_s(now=12.0) is None
    assert store.stall_s(now=25.0) == 15.0  # > 5 typical intervals (1 s) and > 10 s
    store.add({"type": "event", "kind": "stopped", "time": 26.0, "step": 100})
    assert store.stall_s(now=100.0) is None


def test_validation_loss_and_null_values() -> None:
    store = MetricStore()
    store.add({"type": "event", "kind": "eval", "time": 1.0, "step": 50, "val_loss": 0.5})
    m = _metrics(60, 2.0, [0.01])
    m["ranks"][0]["loss"] = None  # a diverged loss arrives as null
    store.add(m)
    assert store.val_loss.last() == 0.5
    assert np.isnan(store.get(0, "loss").last())


def test_many_ranks_keep_the_spread_across_ranks() -> None:
    store = MetricStore()
    rng = np.random.default_rng(0)
    rows_by_step = []
    for step in (10, 20):
        rows = [{"rank": r, "loss": float(rng.normal(2, 0.5)), "step_time_s": 0.01 * (1 + r),
                 "sync_time_s": 0.005, "gpu_util_pct": None if r % 3 == 0 else float(r),
                 "device": "cpu"} for r in range(13)]
        rows_by_step.append(rows)
        store.add({"type": "metrics", "time": float(step), "step": step, "ranks": rows})
    assert store.many_ranks and len(store.ranks()) == 13
    lo, mid, hi = store.spread("loss")
    losses = [r["loss"] for r in rows_by_step[-1]]
    assert list(mid.x) == [10.0, 20.0]
    assert (lo.last(), mid.last(), hi.last()) == pytest.approx(
        (min(losses), float(np.median(losses)), max(losses)))
    util = [r["gpu_util_pct"] for r in rows_by_step[-1] if r["gpu_util_pct"] is not None]
    assert store.spread("gpu_util_pct")[1].last() == pytest.approx(float(np.median(util)))
    share = [100 * 0.005 / (0.01 * (1 + r)) for r in range(13)]
    assert store.spread("sync_share_pct")[2].last() == pytest.approx(max(share))
    assert np.isnan(store.spread("gpu_power_w")[1].y).all()  # no rank has it: gaps
    few = MetricStore()
    few.add({"type": "metrics", "time": 1.0, "step": 1, "ranks": rows_by_step[0][:4]})
    assert not few.many_ranks and few.spreads == {}


def test_a_table_thins_every_column_alike_and_takes_new_columns() -> None:
    table = Table(capacity=100, columns=2)
    for step in range(1000):
        if step == 500:
            assert table.add_columns(1) == 2  # a rank joins: its past rows are NaN
        table.append(step, np.array([step, -step, 2 * step][:table.columns], dtype=float))
    assert len(table) <= 100
    x = table.x
    assert np.array_equal(table.column(0), x) and np.array_equal(table.column(1), -x)
    joined = x >= 500
    assert np.isnan(table.column(2)[~joined]).all()
    assert np.array_equal(table.column(2)[joined], 2 * x[joined])


def test_a_table_grows_as_rows_come_keeping_every_row_and_column() -> None:
    table = Table(capacity=20_000, columns=64 * 17)  # 64 ranks' fields
    table.append(1, np.ones(table.columns))
    assert table.nbytes < 4 * 2**20  # not 170 MiB from the first report on
    rows = []
    for step in range(2, 3000):
        if step == 700:  # columns added while the table is growing
            table.add_columns(17)
        row = np.full(table.columns, float(step))
        row[::2] = -step
        table.append(step, row)
        rows.append(step)
    assert len(table) == 3000 - 1 and list(table.x) == [1, *rows]
    assert list(table.column(1)) == [1, *rows]
    assert list(table.column(0)) == [1, *(-np.array(rows))]
    late = table.column(table.columns - 2)  # odd: the step itself, from step 700 on
    assert np.isnan(late[:699]).all() and np.array_equal(late[699:], rows[698:])
    assert table.nbytes < 20_000 * (table.columns + 1) * 8 / 2


def test_a_rank_that_joins_late_and_bad_values_spoil_nothing_else() -> None:
    store = MetricStore()
    store.add(_metrics(1, 1.0, [0.01]))
    late = _metrics(2, 2.0, [0.01, 0.02])
    late["ranks"][0]["loss"] = "not a number"  # a broken value from the wire
    late["ranks"][1]["samples_per_s"] = [1, 2]
    store.add(late)
    assert store.ranks() == [0, 1]
    assert list(store.get(0, "step_time_s").y) == [0.01, 0.01]
    assert np.isnan(store.get(0, "loss").last())
    assert np.isnan(store.get(1, "step_time_s").y[0]) and store.get(1, "step_time_s").last() \
        == 0.02  # rank 1 was not there at step 1
    assert store.total_samples_per_s.last() == 100.0  # rank 1's list counts as missing
    assert len(store.get(7, "loss")) == 0 and 7 not in store.ranks()  # never reported


def _script_report(step: int, logged: list[dict | None], total_steps: int | None = None) -> dict:
    """A script run's metrics message: rank r logged ``logged[r]`` (None: nothing)."""
    ranks = []
    for r, scalars in enumerate(logged):
        entry: dict = {"rank": r, "loss": 2.0 - step / 100, "step_time_s": 0.01,
                       "device": "cpu"}
        if scalars is not None:
            entry["logged"] = scalars
        ranks.append(entry)
    return {"type": "metrics", "time": float(step), "step": step, "epoch": 0,
            "total_steps": total_steps, "ranks": ranks}


def test_no_total_throughput_where_no_rank_measured_one() -> None:
    store = MetricStore()
    store.add(_script_report(10, [None, None]))  # a script without DDP: no samples/s
    assert len(store.total_samples_per_s) == 1
    assert np.isnan(store.total_samples_per_s.last())  # no point drawn, not a 0


def test_logged_series_are_kept_per_rank_apart_from_the_built_in_fields() -> None:
    store = MetricStore()
    store.add(_script_report(10, [{"lr": 0.1}, {"lr": 0.1}]))
    store.add(_script_report(20, [{"lr": 0.05, "acc": 0.7, "loss": 9.0},
                                  {"lr": 0.05, "acc": 0.6, "loss": 8.0}]))
    store.add(_script_report(30, [{"lr": 0.02}, None]))  # rank 1 logged nothing this time
    store.add(_script_report(40, [{"acc": 0.8, "bad key!": 1.0, "lr": "x"},
                                  {"acc": float("nan"), "lr": [1]}]))
    assert list(store.logged_tables) == ["lr", "acc", "loss"]  # in the order they came
    lr0 = store.logged(0, "lr")
    assert list(lr0.x) == [10.0, 20.0, 30.0] and list(lr0.y) == [0.1, 0.05, 0.02]
    lr1 = store.logged(1, "lr")
    assert list(lr1.y[:2]) == [0.1, 0.05] and np.isnan(lr1.y[2])  # not logged at step 30
    acc0, acc1 = store.logged(0, "acc"), store.logged(1, "acc")
    assert list(acc0.x) == [20.0, 40.0] and list(acc0.y) == [0.7, 0.8]
    assert acc1.y[0] == 0.6 and np.isnan(acc1.y[1])  # a NaN is not a value
    # a logged "loss" is its own series: the built-in loss is untouched
    assert list(store.logged(1, "loss").y) == [8.0]
    assert list(store.get(1, "loss").y) == pytest.approx([1.9, 1.8, 1.7, 1.6])
    assert len(store.logged(0, "bad key!")) == 0 and len(store.logged(7, "lr")) == 0
    # a rank that joins later gets a column of its own in the keys it logs
    store.add(_script_report(50, [{"acc": 0.9}, {"acc": 0.8}, {"acc": 0.5}]))
    assert list(store.logged(2, "acc").y[-1:]) == [0.5] and np.isnan(store.logged(2, "acc").y[0])
    assert len(store.logged(2, "lr")) == 0  # it never logged lr: no column yet


def test_logged_series_are_bounded_and_many_ranks_keep_their_spread() -> None:
    store = MetricStore(capacity=100)
    for step in range(1, 1001):
        store.add(_script_report(step, [{"acc": step + r} for r in range(13)]))
    acc = store.logged(12, "acc")
    assert len(acc) <= 100 and acc.x[0] < 20 and acc.x[-1] > 950  # the whole run, thinned
    assert np.array_equal(acc.y, acc.x + 12)
    assert store.many_ranks
    lo, mid, hi = store.logged_spread("acc")
    assert np.array_equal(mid.x, acc.x)
    assert (lo.last(), mid.last(), hi.last()) == (acc.x[-1], acc.x[-1] + 6, acc.x[-1] + 12)
    assert len(store.logged_spread("nothing")[1]) == 0


def test_unavailable_items_the_latest_event_wins_and_a_script_is_named() -> None:
    store = MetricStore()
    store.add({"type": "event", "kind": "run_start", "time": 0.0, "total_steps": None,
               "steps_per_epoch": None, "world_size": 2, "source": "script",
               "script": "/home/u/train.py"})
    assert store.info.script == "/home/u/train.py" and store.info.total_steps is None
    assert store.unavailable == {}
    store.add({"type": "event", "kind": "unavailable", "step": 10,
               "items": {"sync": "hook X cannot be timed", "loss": "no loss"}})
    assert store.unavailable == {"sync": "hook X cannot be timed", "loss": "no loss"}
    store.add({"type": "event", "kind": "unavailable", "step": 20, "items": {}})
    assert store.unavailable == {}
    store.add({"type": "event", "kind": "unavailable", "step": 30, "items": "garbage"})
    assert store.unavailable == {}
    store.add(_script_report(40, [{"acc": 1.0}, None]))
    assert store.info.total_steps is None and store.eta_s() is None  # unknown length: no ETA
    store.clear()
    assert store.logged_tables == {} and store.info.script is None
