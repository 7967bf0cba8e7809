"""The dashboard's alert line names the straggler with its cause: the rank the others wait for
in the all-reduce, not the one with the longest step (ddp_engine/common/straggler.py)."""

from __future__ import annotations

import json
import time
from pathlib import Path

from app.dashboard import Dashboard
from app.metric_store import MetricStore


def _write_run(folder: Path, reports: int) -> None:
    """metrics.jsonl of 3 CPU ranks whose steps are equally long (DDP), rank 2 computing 30%
    longer: the others wait 3 ms per step for it in the all-reduce. Rank 0's step time reads a
    little longer (its evaluation): no straggler for that."""
    folder.mkdir()
    now = time.time()  # one report a second up to now: the run is not stalled
    with open(folder / "metrics.jsonl", "w") as f:
        for i in range(reports):
            ranks = [{"rank": r, "device": "cpu", "loss": 1.0, "step_time_s": 0.0132,
                      "eval_s": 0.0, "sync_time_s": wait, "sync_exposed_s": wait,
                      "data_wait_s": 0.0001, "process_cpu_s": 0.01 * i}
                     for r, wait in enumerate((0.0032, 0.0032, 0.0002))]
            ranks[0].update(step_time_s=0.0200, eval_s=0.0068)
            f.write(json.dumps({"type": "metrics", "time": now - reports + i, "step": 10 * (i + 1),
                                "epoch": 0, "total_steps": 1000, "ranks": ranks}) + "\n")


def _alert_after(qtbot, folder: Path) -> str:
    dash = Dashboard(MetricStore())
    dash.timer.stop()
    qtbot.addWidget(dash)
    dash.store.load_run(folder)
    dash.redraw(budget_s=None)  # a frame: the alerts are worked out in it
    return dash.alert.text()


def test_the_alert_names_the_rank_the_others_wait_for_with_its_compute(qtbot,
                                                                         tmp_path: Path) -> None:
    _write_run(tmp_path / "run", 25)
    assert _alert_after(qtbot, tmp_path / "run") == (
        "straggler: rank 2: compute 30% longer than the median rank's (waits 0.2 ms in the "
        "all-reduce, the others 3.2 ms); CPU time 0.01 cores (the others 0.01)")


def test_no_straggler_before_it_was_the_slowest_for_20_reports(qtbot, tmp_path: Path) -> None:
    _write_run(tmp_path / "run", 19)
    assert "straggler" not in _alert_after(qtbot, tmp_path / "run")
