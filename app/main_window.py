"""The Rankscope window: launch panel, live dashboard, logs, run control and the status bar."""

from __future__ import annotations

import contextlib
from pathlib import Path
from typing import TYPE_CHECKING, Any

from PySide6.QtCore import QSettings, Qt, QTimer
from PySide6.QtGui import QCloseEvent, QKeySequence, QShortcut, QShowEvent
from PySide6.QtWidgets import (
    QLabel,
    QMainWindow,
    QMessageBox,
    QScrollArea,
    QTabWidget,
    QToolBar,
    QWidget,
)

from app import remote_attach
from app.alerts import Alerts
from app.desktop import app_icon
from app.dialogs import (
    RemoteAttachDialog,
    action,
    ask_about_active_run,
    dock,
    dock_toggle,
    warn,
)
from app.doctor_dialog import open_for
from app.export_dialog import ask_and_export
from app.first_run import FirstRun
from app.launch_panel import LaunchPanel
from app.logs_view import LogsView
from app.menus import Menus
from app.metric_store import MetricStore
from app.run_banner import previous_run
from app.run_controller import RunController
from app.run_model import (
    REMOTE_LOGS_NOTE,
    RUNS_DIR_KEY,
    choose_runs_dir,
    failure_text,
    finished_text,
    left_text,
    preset_runs_dir,
    record_text,
    restored_form,
    save_form,
)
from app.runs_panel import RunsPanel
from app.script_source import refill_config
from app.sweep_watch import SweepWatch
from app.window_layout import first_sizes, restore_layout, save_layout
from ddp_engine.common.config import ConfigError, RunConfig
from ddp_engine.common.gpus import GpuInfo
from ddp_engine.common.runs import RunIndex, RunSummary, walk
from ddp_engine.common.sweep_plan import is_group

if TYPE_CHECKING:
    from app.compare import CompareView
    from app.dashboard import Dashboard
    from app.scaling import ScalingView

DASHBOARD_DELAY_MS = 50
"""How long attaching to a remote rank 0 tries the address and token before it says why not."""


class MainWindow(QMainWindow):
    def __init__(self, runs_dir: str | None = None, preset: str | None = None,
                 settings: QSettings | None = None, gpus: list[GpuInfo] | None = None,
                 grace_s: float = 30.0) -> None:
        super().__init__()
        self.setWindowTitle("Rankscope")
        self.setWindowIcon(app_icon())
        self.resize(1400, 900)
        self.settings = settings if settings is not None else QSettings("Rankscope", "Rankscope")
        remembered = self.settings.value(RUNS_DIR_KEY)
        runs_dir = choose_runs_dir(runs_dir, preset_runs_dir(preset),
                                   str(remembered) if remembered else None)
        self.store = MetricStore()
        self.controller = RunController(self, grace_s=grace_s)
        self.panel = LaunchPanel(runs_dir=runs_dir, gpus=gpus)
        self._dashboard: Dashboard | None = None
        self._compare: CompareView | None = None
        self._scaling: ScalingView | None = None
        self.sweeps = SweepWatch(self)
        self.first_run = FirstRun(self)  # the empty dashboard's page, the start-up's words
        self.logs = LogsView()
        self.tabs = QTabWidget()
        self.tabs.addTab(QLabel("loading the charts..."), "Dashboard")
        self.tabs.addTab(self.logs, "Logs")
        self.tabs.addTab(QLabel(""), "Scaling")  # built on first use (pyqtgraph)
        self.tabs.currentChanged.connect(self._tab_shown)
        self.setCentralWidget(self.tabs)
        self.runs = RunsPanel(runs_dir)
        self.runs_dock = runs_dock = dock(self, "Runs", self.runs,
                                          Qt.DockWidgetArea.BottomDockWidgetArea)
        scroll = QScrollArea()
        scroll.setWidget(self.panel)
        scroll.setWidgetResizable(True)
        # The form wraps its rows to the dock's width (a field under its label): it scrolls
        # down, never sideways.
        scroll.setHorizontalScrollBarPolicy(Qt.ScrollBarPolicy.ScrollBarAlwaysOff)
        self.launch_dock = dock(self, "Launch", scroll, Qt.DockWidgetArea.LeftDockWidgetArea)

        self.start_action = action(self, "Start", "F5", self.start_run)
        # F5 while Start is disabled (a bad value in the form): say why instead of nothing.
        self.explain_start = QShortcut(QKeySequence("F5"), self)
        self.explain_start.activated.connect(self.start_run)
        self.stop_action = action(self, "Stop", "Shift+F5", self.stop_run)
        self.stop_action.setEnabled(False)
        self.attach_action = action(self, "Attach to remote rank 0...", None,
                                    self.show_attach_dialog)
        self.attach_action.setToolTip("Watch and stop a run whose rank 0 is on another "
                                      "machine, through a forwarded port and its token")
        self.attach_dialog: RemoteAttachDialog | None = None
        self.attach_failed_box: QMessageBox | None = None
        toolbar = QToolBar("Run")
        toolbar.setObjectName("run_toolbar")
        toolbar.addActions([self.start_action, self.stop_action])
        toolbar.addSeparator()
        toolbar.addAction(self.attach_action)
        self.doctor_action = action(self, "Check devices...", "Ctrl+Shift+D", lambda: open_for(
            self, self.runs.runs_dir, self.panel.devices, self.dashboard.load_reference))
        toolbar.addAction(self.doctor_action)
        toolbar.addSeparator()
        self.launch_toggle = dock_toggle(self.launch_dock, "Launch panel", "Ctrl+1")
        self.runs_toggle = dock_toggle(runs_dock, "Runs panel", "Ctrl+2")
        toolbar.addActions([self.launch_toggle, self.runs_toggle])
        self.addToolBar(toolbar)
        self.menus = Menus(self)  # the same actions, with their keys, in a menu bar
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
        self.controller.messages.connect(self.dashboard.profile_events)
        self.controller.notice.connect(self.message_label.setText)
        self.controller.finished.connect(self._on_finished)
        self.last_result: dict[str, Any] | None = None
        self.failure_box: QMessageBox | None = None
        self.viewing: Path | None = None  # the run whose charts the dashboard shows
        self.runs.open_requested.connect(self.open_run)
        self.runs.compare_requested.connect(self.compare_runs)
        self.runs.resume_requested.connect(self.resume_from)
        self.runs.export_requested.connect(
            lambda path, kind: ask_and_export(self, Path(path), kind, self.export_run))
        self._reattach_pending = True
        self.runs.scanned.connect(self._reattach_on_start)

        # The charts (pyqtgraph: a third of the start-up time) are built just after the first
        # frame, so the window appears sooner; anything that needs them builds them at once.
        QTimer.singleShot(DASHBOARD_DELAY_MS, self, self._build_dashboard)  # dies with self
        if preset:
            self.panel.load_preset_from(preset)
        else:
            self._restore_form()
        self.set_runs_folder(runs_dir)  # the last form's own folder gives way to this one
        self.panel.runs_dir_changed.connect(self.set_runs_folder)
        self.panel.told.connect(self.message_label.setText)
        self.runs.folder_chosen.connect(self.set_runs_folder)
        self.alerts = Alerts(self)  # a run's end or hang said when the window is not in front
        self._update_actions()
        self._laid_out = restore_layout(self)  # as the user left it; else sized at first show

    def showEvent(self, event: QShowEvent) -> None:  # noqa: N802 (Qt's name)
        if not self._laid_out:  # the first start: the docks sized to the window's height
            self._laid_out = True
            first_sizes(self)
        super().showEvent(event)

    def set_runs_folder(self, folder: str | Path) -> None:
        """Make ``folder`` the runs folder: the Runs panel lists it, new runs go there (the
        form's field), and the next start opens on it."""
        text = str(folder).strip() or "runs"
        if self.panel.runs_dir.text().strip() != text:
            self.panel.runs_dir.setText(text)  # the form validates on every change
        self.runs.set_runs_dir(text)
        self.settings.setValue(RUNS_DIR_KEY, str(Path(text).resolve()))
        self.settings.sync()

    def _build_dashboard(self) -> None:
        _ = self.dashboard

    @property
    def dashboard(self) -> Dashboard:
        if self._dashboard is None:
            from app.dashboard import Dashboard

            self._dashboard = Dashboard(self.store)
            self._dashboard.banner.resume_requested.connect(self.resume_from)
            self._dashboard.banner.compare_requested.connect(self.compare_runs)
            self._replace_tab(0, self._dashboard, "Dashboard")
            self.first_run.update()
        return self._dashboard

    def _replace_tab(self, index: int, widget: QWidget, title: str) -> None:
        """Put a built widget where its placeholder tab was (the current tab stays)."""
        current = self.tabs.currentIndex()
        self.tabs.blockSignals(True)
        placeholder = self.tabs.widget(index)
        self.tabs.removeTab(index)
        placeholder.deleteLater()
        self.tabs.insertTab(index, widget, title)
        self.tabs.setCurrentIndex(current)
        self.tabs.blockSignals(False)

    @property
    def scaling(self) -> ScalingView:
        if self._scaling is None:
            from app.scaling import ScalingView

            self._scaling = ScalingView()
            self._scaling.start_button.clicked.connect(self.start_sweep)
            self._scaling.started.connect(lambda _g: self.runs.refresh())
            self._scaling.said.connect(self.sweeps.said)
            self._scaling.current_run.connect(self.sweeps.follow)
            self._replace_tab(2, self._scaling, "Scaling")
        return self._scaling

    def _tab_shown(self, index: int) -> None:
        if index == 2 and self._scaling is None:
            _ = self.scaling

    def start_sweep(self) -> Path | None:
        """Run the launch form's config on 1, 2, ... N devices (Scaling tab)."""
        return self.sweeps.start()

    def stop_run(self) -> None:
        """Stop (Shift+F5): the run watched; when that is a count of a sweep, the sweep (its
        count stops at an agreed step and no further count starts)."""
        if self.sweeps.watching_sweep():
            self.scaling.stop()
            self.stop_action.setEnabled(False)
            self.message_label.setText("stopping the scaling sweep...")
            return
        self.controller.stop()

    @property
    def compare(self) -> CompareView:
        if self._compare is None:
            from app.compare import CompareView

            self._compare = CompareView()
            self.tabs.addTab(self._compare, "Compare")
        return self._compare

    # ------------------------------------------------------------------------------ actions
    def start_run(self) -> Path | None:
        if self._scaling is not None and self._scaling.busy:
            self.message_label.setText("not started: a scaling sweep is training (Scaling tab);"
                                       " stop it first, or its numbers mean nothing")
            return None
        if self.controller.active:
            self.message_label.setText("not started: a run is active here; stop it first "
                                       "(Shift+F5), or open another run to leave it training")
            return None
        try:
            cfg = self.panel.config()
        except ConfigError as e:
            self.panel.errors.reveal()  # Start pressed: the bad field is shown, touched or not
            self.message_label.setText(f"not started: {self.panel.errors.words(str(e))}")
            return None
        save_form(self.settings, cfg)
        self.panel.resume.clear()  # a resume is for this one start, not the next
        self.dashboard.reset()
        run_dir = self.controller.start(cfg)
        self._viewing(run_dir)
        self.runs.set_runs_dir(run_dir.parent if not cfg.run_dir else self.runs.runs_dir)
        self.runs.refresh()
        return run_dir

    def _viewing(self, run_dir: Path | None, title: str | None = None) -> None:
        """Show ``run_dir``'s run; None: a remote run (no folder here, ``title`` names it)."""
        self.viewing = run_dir
        self.alerts.clear()  # an alert of the run shown before is old news
        self.dashboard.show_welcome(False)
        self.dashboard.run_dir = run_dir
        self.logs.follow(run_dir)
        self.logs.text.setPlaceholderText(REMOTE_LOGS_NOTE if run_dir is None else "")
        self.setWindowTitle(f"Rankscope - {title or (run_dir.name if run_dir else '')}")
        self.tabs.setCurrentWidget(self.dashboard)

    # ------------------------------------------------------------------------------ remote
    def show_attach_dialog(self) -> RemoteAttachDialog:
        """Ask for a remote rank 0's host, port and token (:mod:`app.remote_attach`)."""
        return remote_attach.show_dialog(self)

    def attach_remote(self, host: str, port: int, token: str) -> bool:
        """Watch a run whose rank 0 is on another machine (:func:`app.remote_attach.attach`)."""
        return remote_attach.attach(self, host, port, token)

    def _leave_current(self) -> bool:
        """Stop watching the active run, leaving it training. False (and why in the status
        bar) while a Stop pressed here on a local run is under way: its escalation needs this
        window. A remote run's stop needs nothing more from here."""
        if not self.controller.active:
            return True
        left = self.controller.run_dir
        if self.controller.stop_requested and self.controller.remote is None:
            self.message_label.setText(f"{left.name if left else 'the run'} is stopping: "
                                       "open another run when it has ended")
            return False
        remote = self.controller.remote
        self.controller.detach()
        self.message_label.setText(left_text(left, remote))
        return True

    # ------------------------------------------------------------------------------ runs
    def open_run(self, path: Path | str) -> str:
        """Show a run: attach to it if it is live (Stop then works on it), else draw its record
        from metrics.jsonl. A run being watched is left training. Returns "live", "record" or
        "group" (a scaling sweep: its own tab)."""
        path = Path(path).resolve()
        if is_group(path):
            self.scaling.show_group(path)
            self.tabs.setCurrentWidget(self.scaling)
            return "group"
        if self.controller.active and self.controller.run_dir == path:
            self.tabs.setCurrentWidget(self.dashboard)
            return "live"
        if not self._leave_current():
            return "busy"
        self.dashboard.reset()
        if self.controller.attach(path):
            self._viewing(path)
            return "live"
        self.store.load_run(path)
        self._viewing(path)
        summary = RunIndex(path.parent).summarize(path)
        self.store.info.state = summary.state
        self.state_label.setText(summary.state)
        self.message_label.setText(record_text(path, summary, self.store.info.step))
        self._show_end(path, summary)
        return "record"

    def _show_end(self, path: Path, summary: RunSummary | None = None) -> None:
        """The dashboard's banner for ``path``'s run, which has ended (or was left)."""
        summary = summary or RunIndex(path.parent).summarize(path)
        if not summary.live:
            self.dashboard.banner.show_run(summary, previous_run(path))

    def _reattach_on_start(self, summaries: list[RunSummary]) -> None:
        """On the first scan after start-up: attach to the newest live run, so a run left by a
        closed (or killed) window is shown again."""
        if not self._reattach_pending:
            return
        self._reattach_pending = False
        if self.controller.active or self.viewing is not None:
            return
        live = [s for s in walk(summaries) if s.live and s.kind == "run"]
        if live:
            newest = max(live, key=lambda s: s.started or 0.0)
            self.open_run(newest.path)
            self.message_label.setText(
                f"re-attached to the live run {newest.name}"
                + (f" ({len(live) - 1} more live in the Runs panel)" if len(live) > 1 else ""))

    def compare_runs(self, paths: list[Path]) -> None:
        self.compare.set_runs([Path(p) for p in paths])
        self.tabs.setCurrentWidget(self.compare)

    def resume_from(self, path: Path | str) -> RunConfig | None:
        """Fill the launch form with a stopped or failed run's config, resuming from its last
        checkpoint into a new run folder (linked to this one), or a script run's to run again;
        the user edits and presses Start."""
        try:
            cfg, text = refill_config(Path(path).resolve(), Path(self.runs.runs_dir))
        except ValueError as e:
            self.message_label.setText(str(e))
            return None
        self.panel.set_config(cfg)
        self.launch_dock.raise_()
        self.message_label.setText(text)
        return cfg

    def export_run(self, path: Path, kind: str, dest: Path | None = None) -> Path | None:
        """Export a run's metrics (see :func:`app.export.export_run`); what was written, or
        why not, goes to the status bar."""
        from app import export

        out, text = export.export_run(path, kind, dest)
        self.message_label.setText(text)
        return out

    def _update_actions(self, *_: object) -> None:
        active = self.controller.active
        self.start_action.setEnabled(self.panel.valid and not active)
        self.explain_start.setEnabled(not self.start_action.isEnabled())
        self.stop_action.setEnabled(active and not self.controller.stop_requested)
        self.panel.setEnabled(not active)

    def _on_state(self, state: str) -> None:
        self.state_label.setText(state)
        self._update_actions()

    def _on_finished(self, result: dict[str, Any]) -> None:
        self.last_result = result
        if result.get("state") == "disconnected":  # no final event came: the store cannot know
            self.store.info.state = "disconnected"
        self.message_label.setText(self.sweeps.end_text(self.controller.run_dir,
                                                         finished_text(result)))
        if self.viewing is not None and self.viewing == self.controller.run_dir:
            self._show_end(self.viewing)
        if result.get("state") == "failed":
            self.failure_box = warn(self, "Run failed", failure_text(result))
        self._update_actions()

    # ------------------------------------------------------------------------------ settings
    def _restore_form(self) -> None:
        cfg = restored_form(self.settings)
        if cfg is not None:
            self.panel.set_config(cfg)

    # ------------------------------------------------------------------------------ closing
    def closeEvent(self, event: QCloseEvent) -> None:  # noqa: N802 (Qt's name)
        save_layout(self)
        if not self.controller.active:
            with contextlib.suppress(ConfigError):  # a form that is not valid is not kept
                save_form(self.settings, self.panel.config())
            self.runs.stop_watching()
            event.accept()
            return
        answer = ask_about_active_run(self)
        if answer == "leave":
            self.controller.detach()
            self.runs.stop_watching()
            event.accept()
        elif answer == "stop":
            self.controller.stop()
            event.ignore()  # closes when the run has ended
            self.controller.finished.connect(lambda _r: self.close())
        else:
            event.ignore()

