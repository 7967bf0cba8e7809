"""The live dashboard: progress, alerts, the four chart panels and a chart per series the run
logged by name (added as the names first come), redrawn on a timer.

The progress line and the captions take new text a few times a second (LABELS_S). A frame
has a budget: on each tick only as many charts redraw as fit in FRAME_BUDGET_S by
their measured cost, the stalest first; the rest redraw in the next frames, which follow at
once (CATCH_UP_MS) until every chart shows the latest data. So the window stays responsive
however many curves there are, and a full refresh still reaches the screen within a few
frames."""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from PySide6.QtCore import Qt, QTimer, Signal
from PySide6.QtGui import QResizeEvent
from PySide6.QtWidgets import (
    QFrame,
    QGridLayout,
    QHBoxLayout,
    QLabel,
    QProgressBar,
    QScrollArea,
    QVBoxLayout,
    QWidget,
)

from app.charts.base import Chart
from app.charts.panels import DevicePanel, LoggedPanel, LossPanel, ThroughputPanel
from app.charts.sync_panel import SyncPanel
from app.metric_store import MetricStore
from app.profile_view import ProfilePanel
from app.run_banner import RunBanner
from app.run_model import progress_text, unavailable_text, warning_text
from app.stacks_view import StacksPanel
from ddp_engine.common.doctor_result import load_doctor
from ddp_engine.common.heartbeat import fmt_seconds, hang_hint, read_heartbeats, stall_text
from ddp_engine.common.profile_text import sampled_text
from ddp_engine.common.run_dir import FINAL_STATES
from ddp_engine.common.runs import fmt_duration

REDRAW_MS = 16  # a tick: at most ~60 frames a second, however fast messages arrive
CATCH_UP_MS = 1
"""While charts are behind, the next frame follows this soon rather than a tick later: the
event loop handles what is queued (input, the paint) in between, and a full refresh spread
over a few frames reaches the screen sooner."""
ALERTS_S = 0.25  # how often the straggler and stall alerts are worked out
LABELS_S = 0.25
"""How often the progress line and the panels' captions take new text: a label's new text
costs a repaint of the widgets around and beneath it (its parents, the tab page), about as
much as a chart's, so not in every frame (docs/BENCHMARKS.md)."""
PANEL_MIN_HEIGHT = 230
"""A chart panel is never squeezed below this (a chart of 80 px says nothing): where the
window is too small for all four, the dashboard scrolls."""
SYNC_MIN_HEIGHT = 300
"""The sync panel's: two charts with two-row legends over a four-line breakdown (at 230 px
its plots were 35 px tall)."""
LOGGED_MIN_HEIGHT = 180
"""A logged key's panel: one chart and no caption, so less than the built-in panels need."""
TWO_COLUMNS_MIN_WIDTH = 900
"""Below this width the panels stand in one column, each as wide as the dashboard, rather
than two columns of charts too narrow to read."""
ENDED_STATES = (*FINAL_STATES, "interrupted", "disconnected")
"""The states of a run shown that is no longer training: no ETA, no Stacks, no hang hint."""
FRAME_BUDGET_S = 0.008
"""What the charts drawn in one frame may cost (their setData, fitting and paint, as each last
measured its own): half a tick, so the event loop has the rest. At least one chart draws."""


class Dashboard(QWidget):
    looks_hung = Signal(str)
    """The stall alert's text, once per stall (app/alerts.py tells the desktop)."""

    def __init__(self, store: MetricStore) -> None:
        super().__init__()
        self.store = store
        self.progress = QProgressBar()
        self.progress.setObjectName("progress")
        self.progress_label = QLabel("no run")
        self.progress_label.setObjectName("progress_label")
        self.alert = QLabel("")
        self.alert.setObjectName("alert")
        self.alert.setWordWrap(True)
        self.alert.setStyleSheet("color: #b35900; font-weight: bold;")
        self.unavailable = QLabel("")
        """What a user's script run cannot show, and why (hidden when it shows everything)."""
        self.unavailable.setObjectName("unavailable")
        self.unavailable.setWordWrap(True)
        self.unavailable.setStyleSheet("color: #6b6b6b;")
        self.unavailable.hide()
        self._unavailable_said: dict[str, str] = {}
        self.loss = LossPanel()
        self.devices = DevicePanel()
        self.sync = SyncPanel()
        self.throughput = ThroughputPanel()
        top = QHBoxLayout()
        top.addWidget(self.progress_label)
        top.addWidget(self.progress, 1)
        self.stacks = StacksPanel()  # the Stacks button, and its text under the alerts
        top.addWidget(self.stacks.button)
        self.profile = ProfilePanel()  # Profile N steps, and the reading under the charts
        top.addWidget(self.profile.controls)
        self.profile.shown.connect(self._sampled)
        self.sampled = ""
        """The latest profile's communication share, for a script whose sync is not timed."""
        self.panels: tuple[QWidget, ...] = (self.loss, self.throughput, self.sync, self.devices)
        for panel in self.panels:
            panel.setMinimumHeight(PANEL_MIN_HEIGHT)
        self.sync.setMinimumHeight(SYNC_MIN_HEIGHT)
        page = QWidget()
        stack = QVBoxLayout(page)  # the charts, and under them a profile's reading
        stack.setContentsMargins(0, 0, 0, 0)
        charts = QWidget()
        stack.addWidget(charts, 1)
        stack.addWidget(self.profile)
        self.grid = QGridLayout(charts)
        self.grid.setContentsMargins(0, 0, 0, 0)
        self.columns = 0
        self._arrange(2)
        self.scroll = QScrollArea()
        self.scroll.setObjectName("dashboard_scroll")
        self.scroll.setWidget(page)
        self.scroll.setWidgetResizable(True)
        self.scroll.setFrameShape(QFrame.Shape.NoFrame)
        self.scroll.setHorizontalScrollBarPolicy(Qt.ScrollBarPolicy.ScrollBarAlwaysOff)
        self.banner = RunBanner()  # how the run shown ended, its checkpoint, what next
        layout = QVBoxLayout(self)
        layout.addLayout(top)
        layout.addWidget(self.banner)
        layout.addWidget(self.alert)
        layout.addWidget(self.stacks)
        layout.addWidget(self.unavailable)
        layout.addWidget(self.scroll, 1)
        self.welcome = QLabel("")
        """The first window's page (app/first_run.py words it): shown until a run is."""
        self.welcome.setObjectName("welcome")
        self.welcome.setWordWrap(True)
        self.welcome.setTextFormat(Qt.TextFormat.RichText)
        self.welcome.setAlignment(Qt.AlignmentFlag.AlignLeft | Qt.AlignmentFlag.AlignTop)
        self.welcome.setTextInteractionFlags(Qt.TextInteractionFlag.TextSelectableByMouse)
        self.welcome.setContentsMargins(24, 16, 24, 16)
        self.welcome.setMaximumWidth(760)
        layout.addWidget(self.welcome, 1)
        self.startup_text = "no report yet"
        """The progress line before the first report (app/first_run.py: where start-up is)."""
        self.show_welcome(True)
        self.logged: dict[str, LoggedPanel] = {}  # a panel per logged key, as they came
        self.parts: tuple[tuple[Chart, Callable[[MetricStore], None]], ...] = (
            (self.loss.chart, self.loss.redraw),
            (self.throughput.chart, self.throughput.redraw),
            (self.sync.sync, self.sync.redraw_sync),
            (self.sync.share, self.sync.redraw_share),
            (self.devices.util, self.devices.redraw_util),
            (self.devices.mem, self.devices.redraw_mem))
        """Each chart, and what redraws it (and its panel's caption) from the store."""
        self.charts = tuple(chart for chart, _redraw in self.parts)
        self._built_in = (len(self.panels), len(self.parts))  # the rest are logged keys'
        self.noted: dict[str, tuple[Chart, ...]] = {
            "sync": (self.sync.sync, self.sync.share), "samples": (self.throughput.chart,),
            "loss": (self.loss.chart,)}
        """The charts left empty by each item an "unavailable" event may name."""
        for chart in self.charts[1:]:  # every chart is against step: zoom one, see all there
            chart.link_x(self.loss.chart)
        self.cost_s = dict.fromkeys(self.charts, 0.0)
        """What a redraw of each chart costs (its setData, fitting and paint), averaged."""
        self._drawn = dict.fromkeys(self.charts, -1)  # the store version each chart shows
        self.labels_version = -1
        """The store version that the progress line and the captions show (-1: none yet)."""
        self._labels_at = float("-inf")
        self.labels_s = LABELS_S
        self._alerts_at = -ALERTS_S
        self._hung_at: float | None = None  # the last report before the stall said
        self._run_dir: Path | None = None
        self.catch_up_ms = CATCH_UP_MS
        self.timer = QTimer(self)
        self.timer.timeout.connect(self.redraw)
        self.timer.start(REDRAW_MS)
        self.looks_hung.connect(lambda _text: self.stacks.take(self.run_dir, automatic=True))

    def set_welcome(self, text: str) -> None:
        if text != self.welcome.text():
            self.welcome.setText(text)

    def show_welcome(self, on: bool) -> None:
        """The first window's page instead of empty charts, or the charts (a run is shown)."""
        self.welcome.setVisible(on)
        self.scroll.setVisible(not on)
        for widget in (self.progress, self.progress_label, self.stacks.button):
            widget.setVisible(not on)

    def _arrange(self, columns: int, again: bool = False) -> None:
        """The panels in ``columns`` columns (2: loss and throughput above sync and devices;
        1: the four one under the other), then the logged keys' in the same way, every row
        stretching alike; the last panel takes the rest of its row. ``again``: even if the
        columns did not change (panels did)."""
        if columns == self.columns and not again:
            return
        self.columns = columns
        for panel in self.panels:
            self.grid.removeWidget(panel)
        for i, panel in enumerate(self.panels):  # a last panel alone in its row: full width
            span = columns - i % columns if i == len(self.panels) - 1 else 1
            self.grid.addWidget(panel, i // columns, i % columns, 1, span)
        rows = -(-len(self.panels) // columns)
        for row in range(max(rows, self.grid.rowCount())):
            self.grid.setRowStretch(row, 1 if row < rows else 0)

    def _add_logged(self) -> None:
        """A panel for each key the run logged that has none yet (keys only come, until a
        reset): its chart follows the step charts' x axis and redraws with the others."""
        keys = self.store.logged_tables
        if len(keys) == len(self.logged):
            return
        for key in keys:
            if key in self.logged:
                continue
            panel = self.logged[key] = LoggedPanel(key)
            panel.setMinimumHeight(LOGGED_MIN_HEIGHT)
            panel.chart.link_x(self.loss.chart)
            self.panels += (panel,)
            self.parts += ((panel.chart, panel.redraw),)
            self.charts += (panel.chart,)
            self.cost_s[panel.chart] = 0.0
            self._drawn[panel.chart] = -1
        self._arrange(self.columns, again=True)

    def _drop_logged(self) -> None:
        """Remove the logged keys' panels (a new run has its own)."""
        for panel in self.logged.values():
            self.grid.removeWidget(panel)
            panel.hide()  # at once: it is deleted when Qt is back in its event loop
            panel.chart.unlink_x()
            del self.cost_s[panel.chart]
            panel.deleteLater()
        self.logged.clear()
        self.panels = self.panels[:self._built_in[0]]
        self.parts = self.parts[:self._built_in[1]]
        self.charts = tuple(chart for chart, _redraw in self.parts)
        self._arrange(self.columns, again=True)

    def resizeEvent(self, event: QResizeEvent) -> None:  # noqa: N802 (Qt's name)
        self._arrange(2 if event.size().width() >= TWO_COLUMNS_MIN_WIDTH else 1)
        super().resizeEvent(event)

    @property
    def run_dir(self) -> Path | None:
        """The run shown: its heartbeats word the hang hint, and its runs folder's doctor.json
        is what its sync bandwidth is compared with."""
        return self._run_dir

    @run_dir.setter
    def run_dir(self, folder: Path | None) -> None:
        self._run_dir = folder
        self.stacks.set_run(folder)
        self.sampled = ""
        self.profile.set_run(folder)
        self.load_reference()

    def load_reference(self) -> None:
        """Read the machine's measured all-reduce bandwidth (``doctor``) kept in the shown run's
        runs folder (or, for a sweep's run, its group's)."""
        folder = self._run_dir
        found = None
        for parent in (folder.parent, folder.parent.parent) if folder else ():
            found = load_doctor(parent)
            if found is not None:
                break
        self.sync.reference = found
        self.labels_version = -1  # the caption says it at the next frame

    def reset(self) -> None:
        self.store.clear()
        self.loss.clear()
        self._drop_logged()
        for chart in self.charts:
            if chart is not self.loss.chart:  # the loss panel clears its own
                chart.reset()
        self._drawn = dict.fromkeys(self.charts, -1)
        self.labels_version = -1
        self._labels_at = float("-inf")
        self.alert.setText("")
        self.startup_text = "no report yet"
        self.banner.clear()
        self.stacks.set_ended(False)
        self._unavailable()

    @property
    def drawn_version(self) -> int:
        """The store version that every chart shows (-1: none yet)."""
        return min(self._drawn.values())

    def has_work(self) -> bool:
        """A chart does not show the store's latest version yet."""
        return self.drawn_version != self.store.version

    def behind(self) -> list[Chart]:
        """The charts that do not show the store's latest version yet."""
        return [c for c in self.charts if self._drawn[c] != self.store.version]

    def redraw(self, budget_s: float | None = FRAME_BUDGET_S) -> None:
        """One frame: the charts behind the store that fit in ``budget_s`` (None: all of
        them, and the labels too), the stalest first; the progress line and captions every
        ``labels_s``, the alerts every ALERTS_S."""
        now = time.monotonic()
        if now - self._alerts_at >= ALERTS_S:  # not in every catch-up frame
            self._alerts_at = now
            self._alerts()
        version = self.store.version
        if version != self.labels_version and (
                budget_s is None or now - self._labels_at >= self.labels_s):
            self._labels_at = now
            self.labels_version = version
            self._progress()
            self._unavailable()
            self.sync.redraw_caption(self.store)
            self.devices.redraw_caption(self.store)
        self._add_logged()
        spent = 0.0
        stale = sorted((p for p in self.parts if self._drawn[p[0]] != version),
                       key=lambda p: self._drawn[p[0]])
        for chart, redraw in stale:
            cost = self.cost_s[chart]
            if spent and budget_s is not None and spent + cost > budget_s:
                break
            t0 = time.perf_counter()
            redraw(self.store)
            chart.settle()
            took = time.perf_counter() - t0 + chart.paint_s  # its paint follows; the last one
            self.cost_s[chart] = took if not cost else 0.7 * cost + 0.3 * took
            spent += self.cost_s[chart]
            self._drawn[chart] = version
        self.timer.setInterval(self.catch_up_ms if self.has_work() else REDRAW_MS)

    @property
    def ended(self) -> bool:
        """The run shown is no longer training (it ended, or its rank 0 is out of reach)."""
        return self.store.info.state in ENDED_STATES

    def _progress(self) -> None:
        info = self.store.info
        total = info.total_steps or 0
        ended = self.ended
        self.stacks.set_ended(ended)
        self.profile.set_ended(ended)
        if not total and ended:  # an unknown length that ended: its steps, all done
            self.progress.setRange(0, 1)
            self.progress.setValue(1)
            self.progress.setFormat(f"{info.step} steps")
        else:
            self.progress.setRange(0, max(total, 1))
            self.progress.setValue(min(info.step, total))  # unknown length: empty, says so
            self.progress.setFormat("%p%" if total or not self.store.version
                                    else "length unknown")
        if info.last_metrics_time is None and not ended:  # no report since the reset
            text = self.startup_text
        else:
            text = progress_text(info.step, info.total_steps, info.epoch,
                                 fmt_duration(self.store.eta_s()),
                                 ended=info.state if ended else None)
        took = (info.last_eval or {}).get("eval_s")
        if isinstance(took, int | float):  # evaluation is work the steps wait for: say it
            text += f"  last eval (step {info.last_eval.get('step')}) took {fmt_seconds(took)}"
        if text != self.progress_label.text():
            self.progress_label.setText(text)

    def _alerts(self) -> None:
        parts = []
        straggler = self.store.straggler()
        if straggler is not None:
            parts.append("straggler: " + straggler.text)
        now = time.time()
        stall = self.store.stall_s(now)
        if stall is not None:
            info = self.store.info
            hint = hang_hint(read_heartbeats(self.run_dir), now) if self.run_dir else None
            parts.append(stall_text(stall, info.clock.typical_s(), info.step, hint))
            if self._hung_at != info.clock.last:  # a new stall: said once
                self._hung_at = info.clock.last
                self.looks_hung.emit(parts[-1])
        # kept for the run: a spike may be long past
        warning = warning_text(self.store.last_warning, self.store.warnings)
        if warning:
            parts.append(warning)
        text = "\n".join(parts)
        if text != self.alert.text():
            self.alert.setText(text)

    def _unavailable(self) -> None:
        """Say what a script run cannot show, and why: in the line above the charts, and over
        each chart left empty by it."""
        items = self.store.unavailable
        if items == self._unavailable_said:
            return
        self._unavailable_said = dict(items)
        text = unavailable_text(items, self.store.info.script)
        self.unavailable.setText(text)
        self.unavailable.setVisible(bool(text))
        for key, charts in self.noted.items():
            why = items.get(key)
            sampled = f"\n{self.sampled}" if key == "sync" and self.sampled else ""
            for chart in charts:
                chart.set_note(f"Not measured for this script: {why}{sampled}" if why else "")

    def _sampled(self, summary: dict[str, Any]) -> None:
        """A profile of the run shown was read: its communication, over the charts that a
        script without DDP leaves empty (marked as sampled)."""
        self.sampled = sampled_text(summary)
        self._unavailable_said = {"": ""}  # said again, with it
        self._unavailable()
        QTimer.singleShot(0, lambda: self.scroll.ensureWidgetVisible(self.profile, 0, 0))

    def profile_events(self, batch: list[dict[str, Any]]) -> None:
        """A profile of the run shown written (asked by the command line too): read it."""
        if any(m.get("kind") == "profile" and m.get("state") == "written" for m in batch):
            self.profile.refresh()
