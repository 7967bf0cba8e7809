"""The Rankscope window: launch panel, live dashboard, logs, run control and the status bar."""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING, Any

from PySide6.QtCore import QSettings, Qt, QTimer
from PySide6.QtGui import QAction, QCloseEvent, QKeySequence
from PySide6.QtWidgets import (
    QDockWidget,
    QLabel,
    QMainWindow,
    QMessageBox,
    QScrollArea,
    QTabWidget,
    QToolBar,
)

from app.launch_panel import LaunchPanel
from app.logs_view import LogsView
from app.metric_store import MetricStore
from app.run_controller import RunController
from ddp_engine.config import ConfigError, RunConfig
from ddp_engine.devices import GpuInfo

if TYPE_CHECKING:
    from app.dashboard import Dashboard

SETTINGS_KEY = "last_form"
DASHBOARD_DELAY_MS = 50


class MainWindow(QMainWindow):
    def __init__(self, runs_dir: str = "runs", preset: str | None = None,
                 settings: QSettings | None = None, gpus: list[GpuInfo] | None = None,
                 grace_s: float = 30.0) -> None:
        super().__init__()
        self.setWindowTitle("Rankscope")
        self.resize(1400, 900)
        self.settings = settings if settings is not None else QSettings("Rankscope", "Rankscope")
        self.store = MetricStore()
        self.controller = RunController(self, grace_s=grace_s)
        self.panel = LaunchPanel(runs_dir=runs_dir, gpus=gpus)
        self._dashboard: Dashboard | None = None
        self.logs = LogsView()
        self.tabs = QTabWidget()
        self.tabs.addTab(QLabel("loading the charts..."), "Dashboard")
        self.tabs.addTab(self.logs, "Logs")
        self.setCentralWidget(self.tabs)
        scroll = QScrollArea()
        scroll.setWidget(self.panel)
        scroll.setWidgetResizable(True)
        dock = QDockWidget("Launch", self)
        dock.setObjectName("launch_dock")
        dock.setWidget(scroll)
        dock.setFeatures(QDockWidget.DockWidgetFeature.NoDockWidgetFeatures)
        self.addDockWidget(Qt.DockWidgetArea.LeftDockWidgetArea, dock)

        self.start_action = QAction("Start", self)
        self.start_action.setShortcut(QKeySequence("F5"))
        self.start_action.triggered.connect(self.start_run)
        self.stop_action = QAction("Stop", self)
        self.stop_action.setShortcut(QKeySequence("Shift+F5"))
        self.stop_action.triggered.connect(self.controller.stop)
        self.stop_action.setEnabled(False)
        toolbar = QToolBar("Run")
        toolbar.setObjectName("run_toolbar")
        toolbar.addAction(self.start_action)
        toolbar.addAction(self.stop_action)
        self.addToolBar(toolbar)
        self.state_label = QLabel("idle")
        self.state_label.setObjectName("state")
        self.message_label = QLabel("")
        self.message_label.setObjectName("message")
        self.statusBar().addWidget(self.state_label)
        self.statusBar().addWidget(self.message_label, 1)

        self.panel.validity_changed.connect(self._update_actions)
        self.controller.state_changed.connect(self._on_state)
        self.controller.welcomed.connect(self.store.add)
        self.controller.messages.connect(self.store.add_many)
        self.controller.notice.connect(self.message_label.setText)
        self.controller.finished.connect(self._on_finished)
        self.last_result: dict[str, Any] | None = None

        # The charts (pyqtgraph: a third of the start-up time) are built just after the first
        # frame, so the window appears sooner; anything that needs them builds them at once.
        QTimer.singleShot(DASHBOARD_DELAY_MS, self, self._build_dashboard)  # dies with self
        if preset:
            self.panel.load_preset_from(preset)
        else:
            self._restore_form()
            if runs_dir != "runs":
                self.panel.runs_dir.setText(runs_dir)
        self._update_actions()

    def _build_dashboard(self) -> None:
        _ = self.dashboard

    @property
    def dashboard(self) -> Dashboard:
        if self._dashboard is None:
            from app.dashboard import Dashboard

            self._dashboard = Dashboard(self.store)
            current = self.tabs.currentIndex()
            placeholder = self.tabs.widget(0)
            self.tabs.removeTab(0)
            placeholder.deleteLater()
            self.tabs.insertTab(0, self._dashboard, "Dashboard")
            self.tabs.setCurrentIndex(current)
        return self._dashboard

    # ------------------------------------------------------------------------------ actions
    def start_run(self) -> Path | None:
        if self.controller.active:
            return None
        try:
            cfg = self.panel.config()
        except ConfigError as e:
            self.message_label.setText(f"not started: {e}")
            return None
        self._save_form(cfg)
        self.dashboard.reset()
        run_dir = self.controller.start(cfg)
        self.logs.follow(run_dir)
        self.setWindowTitle(f"Rankscope - {run_dir.name}")
        return run_dir

    def _update_actions(self, *_: object) -> None:
        active = self.controller.active
        self.start_action.setEnabled(self.panel.valid and not active)
        self.stop_action.setEnabled(active and self.controller.state != "stopping")
        self.panel.setEnabled(not active)

    def _on_state(self, state: str) -> None:
        self.state_label.setText(state)
        self._update_actions()

    def _on_finished(self, result: dict[str, Any]) -> None:
        self.last_result = result
        state = result.get("state")
        text = f"{state} at step {result.get('step')}"
        if result.get("reason"):
            text += f": {result['reason']}"
        leftover = result.get("leftover_pids") or []
        text += (f" | {len(leftover)} processes of the run could not be ended: {leftover}"
                 if leftover else " | no process of the run is left")
        self.message_label.setText(text)
        if state == "failed":
            codes = result.get("exit_codes") or {}
            detail = ", ".join(
                f"rank {r}: " + (f"signal {d['signal']}" if d.get("signal") else
                                 f"exit code {d.get('exit_code')}")
                for r, d in sorted((result.get("ranks") or {}).items())) or ", ".join(
                f"rank {r}: exit code {c}" for r, c in sorted(codes.items()))
            self.logs_tail = "\n".join(result.get("log_tail") or [])
            QMessageBox.warning(
                self, "Run failed",
                f"{result.get('reason', 'the run failed')}\n\n{detail}\n\nLast lines of rank "
                f"{result.get('log_rank')}'s log:\n{self.logs_tail}")
        self._update_actions()

    # ------------------------------------------------------------------------------ settings
    def _save_form(self, cfg: RunConfig) -> None:
        self.settings.setValue(SETTINGS_KEY, cfg.to_json())
        self.settings.sync()

    def _restore_form(self) -> None:
        raw = self.settings.value(SETTINGS_KEY)
        if not raw:
            return
        try:
            self.panel.set_config(RunConfig.from_dict(json.loads(str(raw)), source="settings"))
        except (ConfigError, ValueError):
            pass  # settings from an older version: keep the defaults

    # ------------------------------------------------------------------------------ closing
    def closeEvent(self, event: QCloseEvent) -> None:  # noqa: N802 (Qt's name)
        if not self.controller.active:
            try:
                self._save_form(self.panel.config())
            except ConfigError:
                pass
            event.accept()
            return
        box = QMessageBox(self)
        box.setWindowTitle("A run is active")
        box.setText("A run is training. Stop it, or leave it running in the background?")
        stop = box.addButton("Stop the run", QMessageBox.ButtonRole.DestructiveRole)
        leave = box.addButton("Leave it running", QMessageBox.ButtonRole.AcceptRole)
        box.addButton(QMessageBox.StandardButton.Cancel)
        box.exec()
        clicked = box.clickedButton()
        if clicked is leave:
            self.controller.detach()
            event.accept()
        elif clicked is stop:
            self.controller.stop()
            event.ignore()  # closes when the run has ended
            self.controller.finished.connect(lambda _r: self.close())
        else:
            event.ignore()
