"""Where a dashboard frame's time goes: ingest, setData, the synchronous repaint, and the event
loop until idle (the rest of the painting), on the GUI thread, without a live publisher.

    .venv/bin/python bench/frame_parts.py [--ranks 64] [--history 1500] [--per-frame 3]
                                          [--frames 300] [--budget-ms MS] [--profile]

The real ``MainWindow`` (offscreen Qt platform) gets ``--history`` synthetic metrics messages
(one row per rank, every field filled, as bench/ingest_draw.py sends), then ``--frames`` frames,
each: ``store.add_many`` of ``--per-frame`` more messages, ``Dashboard.redraw(budget_s=None)``
(every chart draws: the whole cost of bringing the dashboard up to date, which the app spreads
over budgeted frames; ``--budget-ms 8`` draws as the app does), its ``repaint()``, and
``processEvents()``. Prints p50/p95 of each part's GUI-thread CPU time
(``time.thread_time``); ``--profile`` adds a cProfile of the frames, by cumulative time.
"""

from __future__ import annotations

import argparse
import cProfile
import os
import pstats
import random
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")

from bench.synthetic import rank_rows  # noqa: E402


def message(step: int, ranks: int, rng: random.Random) -> dict[str, Any]:
    return {"type": "metrics", "step": step, "epoch": 0, "total_steps": 10**6,
            "ranks": rank_rows(step, ranks, rng), "time": time.time()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ranks", type=int, default=64)
    parser.add_argument("--history", type=int, default=1500)
    parser.add_argument("--per-frame", type=int, default=3)
    parser.add_argument("--frames", type=int, default=300)
    parser.add_argument("--budget-ms", type=float, default=None,
                        help="draw as the app's timer does: only the charts that fit this "
                        "budget (default: every chart, every frame)")
    parser.add_argument("--profile", action="store_true")
    args = parser.parse_args()
    budget = None if args.budget_ms is None else args.budget_ms / 1000

    from PySide6.QtCore import QSettings
    from PySide6.QtWidgets import QApplication

    app = QApplication.instance() or QApplication([])
    from app.main_window import MainWindow

    work = Path(tempfile.mkdtemp(prefix="rankscope-frames-"))
    settings = QSettings(str(work / "settings.ini"), QSettings.Format.IniFormat)
    w = MainWindow(runs_dir=str(work / "runs"), settings=settings, gpus=[])
    w.runs.stop_watching()
    w.show()
    deadline = time.monotonic() + 1.5
    while time.monotonic() < deadline:  # shown, and the deferred chart build done
        app.processEvents()
        time.sleep(0.01)
    rng = random.Random(0)
    w.store.add({"type": "event", "kind": "run_start", "world_size": args.ranks,
                 "total_steps": 10**6, "start_step": 0, "steps_per_epoch": 10**6,
                 "time": time.time()})
    total = args.history + args.frames * args.per_frame
    msgs = [message(s, args.ranks, rng) for s in range(1, total + 1)]
    w.store.add_many(msgs[:args.history])
    w.dashboard.redraw(budget_s=None)
    w.dashboard.repaint()
    app.processEvents()

    parts: dict[str, list[float]] = {k: [] for k in ("ingest", "setData", "repaint", "events")}
    profile = cProfile.Profile() if args.profile else None
    pos = args.history
    for _ in range(args.frames):
        if profile:
            profile.enable()
        t0 = time.thread_time()
        w.store.add_many(msgs[pos:pos + args.per_frame])
        pos += args.per_frame
        t1 = time.thread_time()
        w.dashboard.redraw(budget_s=budget)
        t2 = time.thread_time()
        w.dashboard.repaint()
        t3 = time.thread_time()
        app.processEvents()
        t4 = time.thread_time()
        if profile:
            profile.disable()
        for key, value in zip(parts, (t1 - t0, t2 - t1, t3 - t2, t4 - t3), strict=True):
            parts[key].append(value)
    parts["frame"] = [sum(v) for v in zip(*parts.values(), strict=True)]

    def q(values: list[float], p: float) -> float:
        ordered = sorted(values)
        return 1e3 * ordered[int(p * (len(ordered) - 1))]

    print(f"{args.ranks} ranks, {args.history} reports of history, {args.per_frame} messages "
          f"per frame, {args.frames} frames (GUI thread CPU time)")
    for key, values in parts.items():
        print(f"  {key:8} p50 {q(values, 0.5):6.2f} ms  p95 {q(values, 0.95):6.2f} ms")
    print("  each chart's redraw, as the dashboard last measured it (setData, fitting, paint): "
          + ", ".join(f"{c.getPlotItem().titleLabel.text} {1e3 * cost:.1f} ms"
                      for c, cost in w.dashboard.cost_s.items()))
    if profile:
        pstats.Stats(profile).sort_stats("cumulative").print_stats(40)
    w.close()


if __name__ == "__main__":
    main()
