"""Desktop alerts: when a run completes, fails, stops or looks hung while the window is not in
front (minimised, or behind another window), say so where the user will see it.

Where the desktop has a system tray, a tray message (Qt's QSystemTrayIcon.showMessage, with the
app icon; clicking it brings the window back); where it has none, the status bar only. Either
way the status bar keeps the last alert until the next run starts, for the user who comes back.
A window in front gets no alert: it already shows the end (the status bar, the "Run failed"
box) and the hang (the dashboard's alert line).

Each event is said once: a run's end once (the controller's ``finished``), a hang once per
stall (the dashboard's ``looks_hung``, emitted again only after the run reported once more and
stalled again).
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from PySide6.QtCore import QObject, Qt
from PySide6.QtWidgets import QLabel, QSystemTrayIcon

from app.desktop import app_icon
from app.run_controller import DISCONNECTED
from app.run_model import reason_text
from ddp_engine.common.runs import fmt_duration

if TYPE_CHECKING:
    from app.main_window import MainWindow

TRAY_MESSAGE_MS = 15_000
"""How long a tray message stays up (where the desktop honours it)."""
REASON_CHARS = 200
"""A reason longer than this is cut in an alert: the window has the whole of it."""
LINE_PX = 480
"""The status bar's alert line is elided to this width (its tooltip has the whole alert)."""

Icon = QSystemTrayIcon.MessageIcon
ICONS = {"completed": Icon.Information, "failed": Icon.Critical, "stopped": Icon.Warning}


def short_reason(reason: Any) -> str:
    """A run's reason on one line, cut to REASON_CHARS (an alert is a glance, not a log)."""
    return reason_text(str(reason or ""), REASON_CHARS)


def duration_s(result: Mapping[str, Any], started: float | None) -> float | None:
    """How long the run ran: from its status (started to its last update, written as it
    ended), else from ``started`` (the run_start event the window saw) until now."""
    begin, end = result.get("started"), result.get("updated")
    if isinstance(begin, int | float) and isinstance(end, int | float):
        return float(end) - float(begin)
    return time.time() - started if started is not None else None


def end_text(name: str, result: Mapping[str, Any], started: float | None = None) -> str:
    """The alert for a run that ended: "mlp-digits-...: completed in 2:31", "... failed: rank 1
    exited with code 1 ...", "... stopped at step 120: stopped from this window"."""
    state = str(result.get("state") or "ended")
    step = result.get("step")
    reason = short_reason(result.get("reason"))
    if state == "completed":
        took = duration_s(result, started)
        return f"{name}: completed" + (f" in {fmt_duration(took)}" if took is not None
                                        else f" at step {step}" if step is not None else "")
    if state == DISCONNECTED:  # the reason says it: the connection to rank 0 was lost
        return f"{name}: {reason or 'lost the connection to rank 0'}"
    at = f" at step {step}" if step is not None else ""
    return f"{name} {state}{at}" + (f": {reason}" if reason else "")


class Alerts(QObject):
    """Watches the window's run and tells the desktop when it ends or hangs unseen.

    Args:
        window: the main window; its controller (``finished``, ``state_changed``) and its
            dashboard (``looks_hung``, hooked once a run starts: the dashboard is built late).
        tray_available: for tests only: stands in for QSystemTrayIcon.isSystemTrayAvailable()
            (None: ask Qt, at each alert).
    """

    def __init__(self, window: MainWindow, tray_available: bool | None = None) -> None:
        super().__init__(window)
        self.window = window
        self.tray_available = tray_available
        self.tray: QSystemTrayIcon | None = None
        """Made at the first tray message (none on a desktop without a tray)."""
        self.said: list[str] = []
        """Every alert given, in order (to the tray or the status bar)."""
        self.sent: list[str] = []
        """The alerts also requested as tray messages."""
        self.label = QLabel("")
        self.label.setObjectName("desktop_alert")
        self.label.hide()
        window.statusBar().addPermanentWidget(self.label)
        self._hooked = False
        window.controller.state_changed.connect(self._on_state)
        window.controller.finished.connect(self._on_finished)

    def in_front(self) -> bool:
        """The window is seen: not minimised and active (it, or a dialog of its own)."""
        return not self.window.isMinimized() and self.window.isActiveWindow()

    def run_name(self) -> str:
        controller = self.window.controller
        if controller.run_dir is not None:
            return controller.run_dir.name
        return f"the run of rank 0 at {controller.remote}" if controller.remote else "the run"

    def _on_state(self, state: str) -> None:
        if state == "starting":  # a run is taken on: the last one's alert is old news
            self._show_line("")
            if not self._hooked:  # the window built its dashboard before taking on a run
                self._hooked = True
                self.window.dashboard.looks_hung.connect(self._on_hung)

    def clear(self) -> None:
        """Take the status bar's alert away (another run is shown)."""
        self._show_line("")

    def _on_finished(self, result: dict[str, Any]) -> None:
        if self.in_front():  # its "Run failed" box is the window's own: still in front
            return
        text = end_text(self.run_name(), result, self.window.store.info.start_time)
        self.alert(text, ICONS.get(str(result.get("state")), Icon.Warning))

    def _on_hung(self, stall: str) -> None:
        if self.window.controller.active and not self.in_front():
            self.alert(f"{self.run_name()} looks hung: {stall}", Icon.Warning)

    def alert(self, text: str, icon: QSystemTrayIcon.MessageIcon = Icon.Information) -> None:
        """Say ``text``: as a tray message where the desktop has a tray, and in the status
        bar."""
        self.said.append(text)
        self._show_line(text)
        available = (QSystemTrayIcon.isSystemTrayAvailable() if self.tray_available is None
                     else self.tray_available)
        if not available:
            return
        if self.tray is None:
            self.tray = QSystemTrayIcon(app_icon(), self)
            self.tray.setToolTip("Rankscope")
            self.tray.messageClicked.connect(self._bring_back)
            self.tray.activated.connect(self._bring_back)
            self.tray.show()  # a tray message needs a shown icon
        self.sent.append(text)
        self.tray.showMessage("Rankscope", text, icon, TRAY_MESSAGE_MS)

    def _show_line(self, text: str) -> None:
        self.label.setText(self.label.fontMetrics().elidedText(
            text, Qt.TextElideMode.ElideRight, LINE_PX))
        self.label.setToolTip(text)
        self.label.setVisible(bool(text))

    def _bring_back(self, *_: object) -> None:
        """The user clicked the message or the icon: the window, in front."""
        self.window.showNormal()
        self.window.raise_()
        self.window.activateWindow()
