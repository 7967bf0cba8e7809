"""Long runs: the window's memory and frame time as a run's history grows to 1,000,000 steps.

    .venv/bin/python bench/long_history.py [--ranks 8] [--steps 1000000]

The real ``MainWindow`` (offscreen Qt platform) is fed synthetic metrics messages, one per step
(``log_every`` 1, the worst case), each with one row per rank and every field filled, in
batches of 2,000 as the telemetry client delivers a replay. At 1k, 10k, 100k and 1M steps it
prints the process's resident memory (psutil) and the frame time:
``Dashboard.redraw(budget_s=None)`` (every chart redraws), its repaint, and the event loop until
it is about to wait again (the paint of every chart), median and max of 20 frames, each after
one more message so that every frame really redraws; and how many messages per second
``store.add_many`` took in (its own time only). Targets (issue 7): below 500 MB after
1,000,000 steps x 8 ranks, with frame time unchanged.
"""

from __future__ import annotations

import argparse
import math
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")


def message(step: int, ranks: int) -> dict[str, Any]:
    rows = [{"rank": r, "loss": 2.3 * math.exp(-step / 200_000) + 0.001 * r,
             "samples_per_s": 6400.0 + r, "step_time_s": 0.010, "data_wait_s": 0.0004,
             "forward_s": 0.002, "backward_s": 0.005, "optimizer_s": 0.001,
             "sync_time_s": 0.003, "sync_exposed_s": 0.001, "sync_bytes": 88104,
             "sync_buckets": 1, "gpu_util_pct": 95.0, "gpu_mem_used_bytes": 4.0e10 + step,
             "gpu_mem_total_bytes": 8.0e10, "gpu_temp_c": 61.0, "gpu_power_w": 520.0,
             "cpu_pct": 100.0, "rss_bytes": 3.0e9, "device": f"cuda:{r}"} for r in range(ranks)]
    return {"type": "metrics", "time": 1.8e9 + step * 0.01, "step": step, "epoch": 0,
            "total_steps": 10_000_000, "ranks": rows}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ranks", type=int, default=8)
    parser.add_argument("--steps", type=int, default=1_000_000)
    args = parser.parse_args()

    import psutil
    from PySide6.QtCore import QAbstractEventDispatcher, QEventLoop, QSettings, Qt
    from PySide6.QtWidgets import QApplication

    from app.main_window import MainWindow

    app = QApplication([])
    work = Path(tempfile.mkdtemp(prefix="rankscope-history-"))
    settings = QSettings(str(work / "settings.ini"), QSettings.Format.IniFormat)
    w = MainWindow(runs_dir=str(work / "runs"), settings=settings, gpus=[])
    w.runs.stop_watching()
    w.dashboard.timer.stop()  # frames are drawn here, one at a time
    w.show()
    deadline = time.monotonic() + 3
    while time.monotonic() < deadline:
        app.processEvents()
        time.sleep(0.01)
    proc = psutil.Process()
    w.store.add({"type": "event", "kind": "run_start", "time": 1.8e9, "world_size": args.ranks,
                 "total_steps": 10_000_000, "start_step": 0, "steps_per_epoch": 10_000_000})

    loop = QEventLoop()
    dispatcher = QAbstractEventDispatcher.instance()
    assert dispatcher is not None
    dispatcher.aboutToBlock.connect(loop.quit, Qt.ConnectionType.DirectConnection)

    def frames(step: int) -> list[float]:
        """Frame times: redraw, the dashboard repainted at once (Qt would paint it on the
        window's next update request, a few ms later), then the event loop until it is about
        to wait (the scene updates and the paint of every chart done)."""
        out = []
        for i in range(20):
            w.store.add(message(step + i, args.ranks))
            t0 = time.perf_counter()
            w.dashboard.redraw(budget_s=None)
            w.dashboard.repaint()
            loop.exec()
            out.append(time.perf_counter() - t0)
        return out

    rss0 = proc.memory_info().rss
    print(f"{args.ranks} ranks; window built, RSS {rss0 / 2**20:.0f} MiB")
    print(f"{'steps':>9} {'RSS MiB':>8} {'frame p50':>10} {'max':>7} {'ingest msgs/s':>14}")
    marks = [m for m in (1_000, 10_000, 100_000, 1_000_000, 10_000_000) if m <= args.steps]
    if args.steps not in marks:
        marks.append(args.steps)
    step = 0
    for mark in marks:
        spent = 0.0
        n0 = step
        while step < mark:
            batch = [message(s, args.ranks) for s in range(step + 1, min(mark, step + 2000) + 1)]
            t0 = time.perf_counter()
            w.store.add_many(batch)
            spent += time.perf_counter() - t0
            step += len(batch)
            app.processEvents()
        rate = (step - n0) / spent
        f = frames(step + 1)
        step += len(f)
        rss = proc.memory_info().rss
        print(f"{mark:9,d} {rss / 2**20:8.0f} {1000 * statistics.median(f):8.1f}ms "
              f"{1000 * max(f):5.1f}ms {rate:14,.0f}", flush=True)
    w.close()


if __name__ == "__main__":
    main()
