"""The store behind the charts: bounded over a million steps, stragglers, stalls, ETA."""

from __future__ import annotations

import numpy as np

from app.metric_store import MetricStore, Series


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
    assert store.stragglers() == {2: 0.5}  # rank 2 is 50% slower than the median
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
