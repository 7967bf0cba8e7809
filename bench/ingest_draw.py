"""Ingest and drawing under load: a synthetic rank 0 floods the real window, which must keep up.

    .venv/bin/python bench/ingest_draw.py [--ranks 64] [--rates 100,200,400,800,1600]
                                          [--seconds 15] [--reps 1] [--variants app]

A publisher process plays rank 0: it is the engine's own ``ddp_engine.rank.telemetry.Telemetry``
(the real server, protocol and metrics.jsonl), fed with metrics messages at a fixed rate, each
with one row per rank and every field filled, GPU readings included (the device samples ride
in the rank rows, as in the engine). This process is the app: the real ``MainWindow`` (offscreen
Qt platform), a real ``TelemetryClient`` thread and ``store.add_many`` connected as the window
connects its run controller. For each rate it measures, on the GUI thread:

- **frame work** and **frame wall**: a frame begins when ``Dashboard.redraw()`` (on its 16 ms
  timer) has work: new data to hand the charts, or charts that have not drawn what they were
  given (a frame draws only the charts that fit its budget, the stalest first). Qt paints the
  charts on the window's next update request (a platform timer, 5 ms offscreen), so the frame
  ends at the first moment the event loop is about to wait
  (``QAbstractEventDispatcher.aboutToBlock``) after a chart's viewport got its paint event.
  Frame work is the GUI thread's CPU time (``time.thread_time``) within it, frame wall the
  wall time; both include whatever else the loop handled meanwhile (batches of messages that
  arrived during the frame). Also: frames drawn per second;
- **ingest time**: one ``store.add_many`` of a batch (the client hands over what has arrived);
- **GUI thread busy**: the GUI thread's CPU time (``time.thread_time``) over wall time;
- **send-to-drawn latency**: for every metrics message, from its "time" stamp (set by the
  publisher when it is sent) to the end of the frame after which every chart has drawn it
  (``Dashboard.drawn_version``, painted); and, in
  brackets, its first part: from the stamp to the batch being handed to the GUI thread;
- frames and messages of the first second (``WARMUP_S``: the window creates its curves, legend
  entries and toggles) are left out of the percentiles above and reported apart, as the
  largest frame and the largest latency of that second;
- whether the server dropped the viewer (it drops one whose 8 MiB send buffer fills) and
  whether every message arrived.

The sustained rate is the highest rate with no drop, every message drawn and latency p95 under
1 s. Targets (issue 7): frame time (work) p95 < 16 ms and send-to-drawn latency p95 < 100 ms at
64 ranks x 100 messages/s. ``--variants app,translucent-grid,moving-axes`` compares the
charts as shipped with two of their earlier ways, side by side: pyqtgraph's translucent grid
(before the opaque grid), and pyqtgraph's own auto-range, fitted inside each paint to every new
point (before steady ranges and settling).
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")

PUBLISHER = r"""
import json, random, sys, time
from pathlib import Path
from bench.synthetic import rank_rows
from ddp_engine.rank.telemetry import Telemetry

run_dir, ranks = Path(sys.argv[1]), int(sys.argv[2])
rate, seconds = float(sys.argv[3]), float(sys.argv[4])
t = Telemetry(run_dir, welcome_extra={"world_size": ranks, "config": {"model": "synthetic"}},
              on_stop=lambda _why: None)
print("ready", flush=True)
sys.stdin.readline()  # the viewer is connected
total = int(rate * seconds)
t.publish({"type": "event", "kind": "run_start", "world_size": ranks, "total_steps": total,
           "start_step": 0, "backend": "gloo", "steps_per_epoch": total})
rng = random.Random(0)
start = time.perf_counter()
for i in range(total):
    due = start + i / rate
    now = time.perf_counter()
    if due > now:
        time.sleep(due - now)
    step = i + 1
    rows = rank_rows(step, ranks, rng)
    t.publish({"type": "metrics", "step": step, "epoch": 0, "total_steps": total, "ranks": rows})
late = time.perf_counter() - (start + total / rate)
t.publish({"type": "event", "kind": "completed", "step": total})
t.close()
print(json.dumps({"sent": total, "dropped_viewers": t.dropped_viewers,
                  "behind_s": late}), flush=True)
"""


WARMUP_S = 1.0
"""The first second after the publisher starts (the window creating every curve, legend entry
and toggle, the first fits) is reported apart: its frame and latency maxima."""


def pct(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q / 100 * len(ordered)))]


def translucent_grid(window: Any) -> None:
    """The charts' grid as before docs/BENCHMARKS.md's grid fix: pyqtgraph's translucent grid
    (alpha 0.2, three tick levels), for a side-by-side comparison."""
    from app.charts.base import Chart

    for chart in window.findChildren(Chart):
        chart.showGrid(x=True, y=True, alpha=0.2)
        for side in ("left", "bottom"):
            axis = chart.getAxis(side)
            axis.setStyle(tickAlpha=None, maxTickLevel=2)
            axis.setTickPen()


def moving_axes(window: Any) -> None:
    """The charts' auto-range as before steady ranges: pyqtgraph's own, fitted to every new
    point inside the paint (and so asking for a second paint)."""
    import pyqtgraph as pg

    from app.charts.base import Chart

    for chart in window.findChildren(Chart):
        box = chart.getViewBox()
        box.childrenBounds = functools.partial(pg.ViewBox.childrenBounds, box)
        chart.settle = lambda: None


def every_chart(window: Any) -> None:
    """Frames as before the frame budget: every 33 ms, every chart that is behind redraws."""
    dash = window.dashboard
    dash.timer.setInterval(33)
    dash.redraw = functools.partial(type(dash).redraw, dash, budget_s=None)


def no_catch_up(window: Any) -> None:
    """Budgeted frames, but the charts left behind wait for the next 16 ms tick."""
    from app.dashboard import REDRAW_MS

    window.dashboard.catch_up_ms = REDRAW_MS


def labels_every_frame(window: Any) -> None:
    """The progress line and the captions take new text in every frame with new data, as
    before LABELS_S (not every 250 ms)."""
    window.dashboard.labels_s = 0.0


def full_tables(window: Any) -> None:
    """The store's tables allocated at full capacity from the start, as before they grew
    (each variant runs in a process of its own)."""
    from app.metric_store import Table

    Table.START = window.store.capacity
    window.store.clear()


def pyqtgraph_curves(window: Any) -> None:
    """Curves as before thinning: pyqtgraph's PlotDataItem given every point, with its own
    clipping and auto peak downsampling, and the auto-range asking each item for its bounds."""
    import pyqtgraph as pg
    from PySide6.QtCore import Qt

    from app.charts.base import Chart

    def curve(chart: Chart, name: str, color_hex: str, dashed: bool = False,
              faint: bool = False, symbol: str | None = None) -> pg.PlotDataItem:
        if name not in chart.curves:
            style = (Qt.PenStyle.DotLine if faint else Qt.PenStyle.DashLine if dashed
                     else Qt.PenStyle.SolidLine)
            item = chart.plot([], [], name=name, pen=pg.mkPen(
                color_hex + ("90" if faint else ""), width=1, style=style))
            item.setDownsampling(auto=True, method="peak")
            item.setClipToView(True)
            chart.curves[name] = item
        return chart.curves[name]

    for chart in window.findChildren(Chart):
        chart.curve = functools.partial(curve, chart)
        chart._show = lambda item, x, y: item.setData(x, y, connect="finite")


def unlinked_x(window: Any) -> None:
    """Every step chart fits its own x axis, as before the charts shared the loss chart's."""
    import pyqtgraph as pg

    for chart in window.dashboard.charts[1:]:
        chart.setXLink(None)
        chart.x_master = None
        chart.view.enableAutoRange(pg.ViewBox.XAxis)


VARIANTS = {"app": lambda _window: None, "translucent-grid": translucent_grid,
            "moving-axes": moving_axes, "every-chart": every_chart,
            "pyqtgraph-curves": pyqtgraph_curves, "no-catch-up": no_catch_up,
            "labels-every-frame": labels_every_frame, "full-tables": full_tables,
            "unlinked-x": unlinked_x}


def measure(ranks: int, rate: float, seconds: float, variant: str = "app") -> dict[str, Any]:
    from PySide6.QtCore import (
        QAbstractEventDispatcher,
        QEvent,
        QEventLoop,
        QObject,
        QSettings,
        Qt,
        QTimer,
        Slot,
    )
    from PySide6.QtWidgets import QApplication

    from app.charts.base import Chart
    from app.main_window import MainWindow
    from app.telemetry_client import TelemetryClient

    app = QApplication.instance() or QApplication([])
    work = Path(tempfile.mkdtemp(prefix="rankscope-ingest-"))
    run_dir = work / "run"
    run_dir.mkdir()
    settings = QSettings(str(work / "settings.ini"), QSettings.Format.IniFormat)
    w = MainWindow(runs_dir=str(work / "runs"), settings=settings, gpus=[])
    w.runs.stop_watching()  # the Runs panel's folder scans are not part of this
    w.show()
    while not w.isVisible() or not w.windowHandle().isExposed():
        app.processEvents()
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline:  # the deferred chart build
        app.processEvents()
        time.sleep(0.01)
    w.dashboard.run_dir = run_dir
    VARIANTS[variant](w)

    pub = subprocess.Popen([sys.executable, "-c", PUBLISHER, str(run_dir), str(ranks), str(rate),
                            str(seconds)], cwd=REPO, stdin=subprocess.PIPE,
                           stdout=subprocess.PIPE, text=True,
                           env=dict(os.environ, PYTHONPATH=str(REPO)))
    assert pub.stdout is not None and pub.stdin is not None
    assert pub.stdout.readline().strip() == "ready"

    frames: list[float] = []
    frame_work: list[float] = []  # the GUI thread's CPU time within each frame
    ingests: list[float] = []
    latencies: list[float] = []
    arrivals: list[float] = []  # sent to handed to the GUI thread
    first_frames: list[float] = []  # those of the first WARMUP_S, reported apart
    first_latencies: list[float] = []
    steady_from = [float("inf")]  # Unix time: the end of the warm-up
    pending: list[tuple[float, int]] = []  # (sent, store version with it) of those not drawn
    received = [0]
    ended = [False]

    def on_messages(batch: list[dict[str, Any]]) -> None:
        now = time.time()
        arrivals.extend(now - float(m["time"]) for m in batch if m.get("type") == "metrics")
        t0 = time.perf_counter()
        w.store.add_many(batch)
        ingests.append(time.perf_counter() - t0)
        for m in batch:
            if m.get("type") == "metrics":
                pending.append((float(m["time"]), w.store.version))
                received[0] += 1
            elif m.get("kind") == "completed":
                ended[0] = True

    redraw = w.dashboard.redraw

    frame_start: list[float | None] = [None]
    frame_cpu = [0.0]
    painted = [False]

    def timed_redraw() -> None:
        if w.dashboard.has_work() and frame_start[0] is None:
            frame_start[0] = time.perf_counter()  # a frame begins: charts get data to draw
            frame_cpu[0] = time.thread_time()
            painted[0] = False
        redraw()

    class PaintWatch(QObject):
        """Sees the charts' paint events. Qt paints a widget's update on the window's next
        UpdateRequest (a platform timer, 5 ms offscreen), not inside the redraw: a frame ends
        at the first idle moment after a chart was painted."""

        def eventFilter(self, obj: QObject, event: QEvent) -> bool:
            if event.type() == QEvent.Type.Paint and frame_start[0] is not None:
                painted[0] = True
            return False

    def idle() -> None:
        """The event loop is about to wait: if the charts were painted since the redraw, the
        frame (setData, the scene's update, the paint of every chart, and whatever else was
        queued meanwhile) is done."""
        if frame_start[0] is not None and painted[0]:
            now = time.time()
            warm = now > steady_from[0]
            (frames if warm else first_frames).append(time.perf_counter() - frame_start[0])
            if warm:
                frame_work.append(time.thread_time() - frame_cpu[0])
            frame_start[0] = None
            drawn = w.dashboard.drawn_version  # every chart has drawn up to this version
            while pending and pending[0][1] <= drawn:
                sent = pending.pop(0)[0]
                (latencies if sent > steady_from[0] else first_latencies).append(now - sent)

    watch_paint = PaintWatch()
    for chart in w.findChildren(Chart):
        chart.viewport().installEventFilter(watch_paint)
    w.dashboard.timer.timeout.disconnect()
    w.dashboard.timer.timeout.connect(timed_redraw)
    dispatcher = QAbstractEventDispatcher.instance()
    assert dispatcher is not None
    dispatcher.aboutToBlock.connect(idle, Qt.ConnectionType.DirectConnection)

    class Sink(QObject):
        """A receiver owned by the GUI thread: the client's batches are queued to it, as to
        the window's run controller (a plain function would run in the client's thread)."""

        @Slot(object)
        def take(self, batch: list[dict[str, Any]]) -> None:
            on_messages(batch)

    sink = Sink()
    client = TelemetryClient(run_dir)
    client.messages.connect(sink.take)
    disconnected: list[str] = []
    client.disconnected.connect(disconnected.append)
    client.start()
    while not client.isRunning() or client._conn is None:
        app.processEvents()
        time.sleep(0.005)
    pub.stdin.write("go\n")
    pub.stdin.flush()
    steady_from[0] = time.time() + WARMUP_S
    started = time.perf_counter()
    cpu0 = time.thread_time()
    limit = time.monotonic() + seconds + 60
    loop = QEventLoop()  # the app's own event loop, as app.exec() runs it

    def check() -> None:
        now = time.monotonic()
        if ended[0] and ended_at[0] is None:
            ended_at[0] = now
        if disconnected or now > limit or (ended_at[0] is not None and now > ended_at[0] + 0.2):
            loop.quit()  # the end (and one more frame for what arrived last)

    ended_at: list[float | None] = [None]
    watch = QTimer()
    watch.timeout.connect(check)
    watch.start(50)
    loop.exec()
    watch.stop()
    wall = time.perf_counter() - started
    out, _ = pub.communicate(timeout=60)
    result = json.loads(out.strip().splitlines()[-1])
    client.request_stop()
    client.wait(3000)
    w.close()
    w.deleteLater()
    app.processEvents()
    busy = (time.thread_time() - cpu0) / wall if wall > 0 else float("nan")
    return {
        "ranks": ranks, "rate": rate, "variant": variant, "sent": result["sent"],
        "received": received[0],
        "dropped": result["dropped_viewers"] > 0 or bool(disconnected and not ended[0]),
        "publisher_behind_s": result["behind_s"],
        "frames": len(frames), "frame_p50_ms": 1000 * pct(frames, 50),
        "frame_p95_ms": 1000 * pct(frames, 95), "frame_max_ms": 1000 * max(frames or [0]),
        "work_p50_ms": 1000 * pct(frame_work, 50), "work_p95_ms": 1000 * pct(frame_work, 95),
        "frames_per_s": len(frames) / wall if wall > 0 else float("nan"),
        "ingest_p95_ms": 1000 * pct(ingests, 95), "busy": busy,
        "latency_p50_ms": 1000 * pct(latencies, 50), "latency_p95_ms": 1000 * pct(latencies, 95),
        "latency_max_ms": 1000 * max(latencies or [0]),
        "first_frame_max_ms": 1000 * max(first_frames or [0]),
        "first_latency_max_ms": 1000 * max(first_latencies or [0]),
        "arrival_p50_ms": 1000 * pct(arrivals, 50), "arrival_p95_ms": 1000 * pct(arrivals, 95),
    }


def measure_fresh(ranks: int, rate: float, seconds: float, variant: str) -> dict[str, Any]:
    """:func:`measure` in a process of its own (a fresh window, nothing left from before)."""
    out = subprocess.run([sys.executable, __file__, "--one", str(ranks), str(rate),
                          str(seconds), variant], capture_output=True, text=True, check=True,
                         cwd=REPO).stdout
    return dict(json.loads(out.strip().splitlines()[-1]))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ranks", type=int, default=64)
    parser.add_argument("--rates", default="100,200,400,800,1600",
                        help="metrics messages per second, comma-separated")
    parser.add_argument("--seconds", type=float, default=15.0)
    parser.add_argument("--reps", type=int, default=1)
    parser.add_argument("--variants", default="app",
                        help="charts to compare, comma-separated: app (as shipped), "
                        "translucent-grid (pyqtgraph's alpha grid, as before), moving-axes "
                        "(pyqtgraph's auto-range fitted in each paint, as before), every-chart "
                        "(no frame budget: all charts every 33 ms, as before), pyqtgraph-curves "
                        "(every point to pyqtgraph's PlotDataItem, as before thinning), "
                        "no-catch-up (charts left behind wait for the next tick), "
                        "labels-every-frame (progress line and captions in every frame), "
                        "full-tables (the store's tables at full size from the start), "
                        "unlinked-x (each step chart fits its own x axis)")
    parser.add_argument("--json", metavar="FILE", help="also write the results here")
    parser.add_argument("--png", metavar="FILE", help="also plot them here")
    parser.add_argument("--one", nargs=4, metavar=("RANKS", "RATE", "SECONDS", "VARIANT"),
                        help=argparse.SUPPRESS)  # one measurement, in a fresh process
    args = parser.parse_args()
    if args.one:
        ranks, rate, seconds, variant = args.one
        print(json.dumps(measure(int(ranks), float(rate), float(seconds), variant)))
        return
    rates = [float(r) for r in args.rates.split(",")]
    results = []
    print(f"{args.ranks} ranks, {args.seconds:g} s per rate, {os.cpu_count()} cores; frame = "
          "redraw until painted and idle; latency = sent to drawn")
    kinds = args.variants.split(",")
    unknown = sorted(set(kinds) - set(VARIANTS))
    if unknown:
        parser.error(f"--variants: unknown {', '.join(unknown)}; choose from "
                     f"{', '.join(VARIANTS)}")
    print(f"{'variant':>16} {'msgs/s':>6} {'recv/sent':>9} {'drop':>4} {'fps':>4} "
          f"{'frame work p50':>14} {'p95':>5} {'frame wall p50':>14} {'p95':>5} {'max':>5} "
          f"{'ingest p95':>10} {'busy':>4} {'latency p50':>11} {'p95':>5} {'max':>5} "
          f"{'(arrival p50':>12} {'p95)':>5} {'first 1 s: frame max':>20} {'latency max':>11}")
    for rep in range(args.reps):
        for rate in rates:
            k = rep % len(kinds)  # rotate the order, so the machine's noise hits all alike
            for kind in kinds[k:] + kinds[:k]:
                r = measure_fresh(args.ranks, rate, args.seconds, kind)
                results.append(r)
                print(f"{kind:>16} {rate:6.0f} {r['received']:>4}/{r['sent']:<4} "
                      f"{'yes' if r['dropped'] else 'no':>4} {r['frames_per_s']:4.0f} "
                      f"{r['work_p50_ms']:12.1f}ms {r['work_p95_ms']:5.1f} "
                      f"{r['frame_p50_ms']:12.1f}ms {r['frame_p95_ms']:5.1f} "
                      f"{r['frame_max_ms']:5.0f} {r['ingest_p95_ms']:8.1f}ms {r['busy']:4.0%} "
                      f"{r['latency_p50_ms']:9.0f}ms {r['latency_p95_ms']:5.0f} "
                      f"{r['latency_max_ms']:5.0f} {r['arrival_p50_ms']:10.0f}ms "
                      f"{r['arrival_p95_ms']:5.0f} {r['first_frame_max_ms']:18.0f}ms "
                      f"{r['first_latency_max_ms']:9.0f}ms", flush=True)
    for kind in kinds:
        mine = [r for r in results if r["variant"] == kind]
        ok = [r for r in mine if not r["dropped"] and r["received"] == r["sent"]
              and r["latency_p95_ms"] < 1000]
        best = max((r["rate"] for r in ok), default=None)
        print(f"{kind}: sustained {best:.0f} messages/s ({best * args.ranks:.0f} rank "
              "rows/s)" if best else f"{kind}: sustained none of the rates")
        base = [r for r in mine if r["rate"] == rates[0]]
        if base:
            work = statistics.median(r["work_p95_ms"] for r in base)
            frame = statistics.median(r["frame_p95_ms"] for r in base)
            latency = statistics.median(r["latency_p95_ms"] for r in base)
            print(f"  at {rates[0]:.0f} messages/s (median of {len(base)}): frame work p95 "
                  f"{work:.1f} ms (target < 16; wall {frame:.1f} ms), latency p95 "
                  f"{latency:.0f} ms (target < 100)")
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=1))
    if args.png:
        plot(results, args.ranks, Path(args.png))


def plot(results: list[dict[str, Any]], ranks: int, path: Path) -> None:
    """Latency p50/p95 and frame work p95 against the message rate, one line per variant, with
    the issue's targets as dotted lines; drawn with the app's own Chart and saved as PNG."""
    import pyqtgraph as pg
    from PySide6.QtCore import Qt
    from PySide6.QtWidgets import QApplication

    from app.charts.base import Chart, color
    from bench.plotting import save_chart

    app = QApplication.instance() or QApplication([])
    chart = Chart(f"{ranks} ranks: the window under load (log-log)", "milliseconds",
                  "metrics messages/s")
    # log-log by hand: the app's bare curves (PlotCurveItem) have no log mode of their own
    chart.legend.anchor((0, 0), (0, 0), offset=(70, 30))  # top left, above the low rates
    all_rates = sorted({r["rate"] for r in results})
    chart.getAxis("bottom").setTicks([[(np.log10(x), f"{x:g}") for x in all_rates], []])
    chart.getAxis("left").setTicks([[(float(e), f"{10 ** e:g}") for e in range(0, 6)], []])
    kinds = sorted({r["variant"] for r in results}, key=lambda g: g != "app")
    values = []
    for i, (key, label) in enumerate((("latency_p95_ms", "sent to drawn p95"),
                                      ("latency_p50_ms", "sent to drawn p50"),
                                      ("work_p95_ms", "frame work p95"))):
        for kind in kinds:
            by_rate: dict[float, list[float]] = {}
            for r in results:
                if r["variant"] == kind:
                    by_rate.setdefault(r["rate"], []).append(r[key])
            rates = sorted(by_rate)
            y = [statistics.median(by_rate[x]) for x in rates]
            values += y
            name = label if len(kinds) == 1 else f"{label} ({kind})"
            chart.set_data(name, np.log10(rates), np.log10(y), color(i),
                           dashed=kind != kinds[0], symbol="o")
    for ms, what in ((100, "latency target"), (16, "frame target")):
        chart.addItem(pg.InfiniteLine(np.log10(ms), angle=0, label=f"{what} {ms} ms",
                                      labelOpts={"position": 0.1, "color": "#555"},
                                      pen=pg.mkPen("#555", style=Qt.PenStyle.DashLine)))
    chart.setXRange(np.log10(min(all_rates) / 1.3), np.log10(max(all_rates) * 1.3), padding=0)
    chart.setYRange(np.log10(min([*values, 16]) / 1.5), np.log10(max(values) * 1.5), padding=0)
    save_chart(app, chart, path)


if __name__ == "__main__":
    main()
