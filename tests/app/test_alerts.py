"""Desktop alerts (app/alerts.py): a run that ends or looks hung while the window is not in
front is told to the desktop (a tray message where there is a tray, else the status bar), once
per event; a window in front gets none.

Offscreen Qt has no system tray, so the status-bar path runs as is and the tray path runs with
its availability given (``tray_available=True``: a real QSystemTrayIcon, its messages recorded).
"""

from __future__ import annotations

import re
import time
from collections.abc import Callable
from pathlib import Path

import pytest
from PySide6.QtWidgets import QSystemTrayIcon, QWidget

from app.alerts import end_text
from app.main_window import MainWindow
from ddp_engine.rank.telemetry import Telemetry
from tests.conftest import FAULTY, make_run_folder

Open = Callable[[Path], MainWindow]


def _behind_another(qtbot, window: MainWindow) -> QWidget:
    """Another window of the desktop, active, in front of ``window``."""
    other = QWidget()
    qtbot.addWidget(other)
    other.show()
    other.activateWindow()
    qtbot.waitUntil(lambda: other.isActiveWindow() and not window.isActiveWindow(),
                    timeout=5000)
    return other


def _in_front(qtbot, window: MainWindow) -> None:
    window.showNormal()
    window.activateWindow()
    qtbot.waitUntil(window.isActiveWindow, timeout=5000)


def _report(server: Telemetry, step: int, when: float) -> None:
    server.publish({"type": "metrics", "time": when, "step": step, "epoch": 0,
                    "total_steps": 100, "ranks": [{"rank": 0, "loss": 1.0},
                                                  {"rank": 1, "loss": 1.1}]})


def _stall_s(window: MainWindow) -> int:
    """The seconds of the stall the dashboard's alert line says now (-1: no stall)."""
    found = re.search(r"no progress for (\d+) s", window.dashboard.alert.text())
    return int(found.group(1)) if found else -1


@pytest.mark.slow
def test_a_run_that_completes_while_minimised_is_told_in_the_status_bar_once(
        qtbot, open_window: Open, tmp_path: Path) -> None:
    window = open_window(tmp_path / "runs")
    alerts = window.alerts  # offscreen: no tray, the status bar only
    assert not QSystemTrayIcon.isSystemTrayAvailable()
    window.panel.max_steps.setValue(20)
    window.showMinimized()
    qtbot.waitUntil(window.isMinimized, timeout=5000)
    with qtbot.waitSignal(window.controller.finished, timeout=180_000) as finished:
        run_dir = window.start_run()
    assert run_dir is not None and finished.args[0]["state"] == "completed"
    assert len(alerts.said) == 1 and alerts.sent == [] and alerts.tray is None
    assert re.fullmatch(rf"{re.escape(run_dir.name)}: completed in \d+:\d\d", alerts.said[0])
    assert alerts.label.isVisibleTo(window) and alerts.label.toolTip() == alerts.said[0]
    assert alerts.label.text() == alerts.said[0]  # short enough to show whole


@pytest.mark.slow
def test_a_run_that_fails_behind_another_window_is_a_tray_message_once(
        qtbot, open_window: Open, tmp_path: Path) -> None:
    window = open_window(tmp_path / "runs")
    alerts = window.alerts
    alerts.tray_available = True  # as on a desktop with a tray
    window.panel.loss.combo.setCurrentText("Custom...")
    window.panel.loss.path.setText(f"{FAULTY}:raise_on_rank1")
    assert window.panel.valid, window.panel.problem
    _behind_another(qtbot, window)
    with qtbot.waitSignal(window.controller.finished, timeout=180_000) as finished:
        run_dir = window.start_run()
    assert run_dir is not None and finished.args[0]["state"] == "failed"
    assert window.failure_box is not None  # the window says it too, in its own box
    assert alerts.sent == alerts.said and len(alerts.sent) == 1
    assert alerts.sent[0].startswith(f"{run_dir.name} failed at step ")
    assert "rank 1" in alerts.sent[0] and "boom from the test plugin" in alerts.sent[0]
    assert "\n" not in alerts.sent[0]  # one line; the box has the log
    assert alerts.tray is not None and alerts.tray.isVisible()
    assert alerts.tray.toolTip() == "Rankscope"


def test_a_window_in_front_gets_no_alert_when_its_run_ends(
        qtbot, window: MainWindow, tmp_path: Path) -> None:
    alerts = window.alerts
    alerts.tray_available = True  # as on a desktop with a tray
    server = Telemetry(tmp_path, welcome_extra={"world_size": 2}, on_stop=lambda _why: None)
    try:
        assert window.attach_remote("127.0.0.1", server.port, server.token)
        qtbot.waitUntil(lambda: window.controller.state == "running", timeout=30_000)
        _in_front(qtbot, window)
        server.publish({"type": "event", "kind": "failed", "step": 12, "rank": 1,
                        "error": "rank 1 exited with code 1"})
        with qtbot.waitSignal(window.controller.finished, timeout=30_000):
            server.close()
    finally:
        server.close()
    assert window.state_label.text() == "failed"
    assert window.failure_box is not None  # it opened as the run ended: not an alert's cause
    assert alerts.said == [] and alerts.tray is None and not alerts.label.isVisibleTo(window)


def test_a_hung_run_is_told_once_per_stall_and_not_while_the_window_is_in_front(
        qtbot, window: MainWindow, tmp_path: Path) -> None:
    """Rank 0 in this process: its reports' times say when the run last progressed."""
    alerts = window.alerts
    alerts.tray_available = True  # as on a desktop with a tray
    server = Telemetry(tmp_path, welcome_extra={"world_size": 2}, on_stop=lambda _why: None)
    name = f"the run of rank 0 at 127.0.0.1:{server.port}"
    try:
        assert window.attach_remote("127.0.0.1", server.port, server.token)
        window.showMinimized()
        now = time.time()
        for step in range(1, 6):  # one a second, the last 96 s ago
            _report(server, step, now - 101 + step)
        qtbot.waitUntil(lambda: len(alerts.sent) == 1, timeout=30_000)
        assert re.fullmatch(rf"{re.escape(name)} looks hung: no progress for 9\d s \(typical "
                            r"report interval 1\.0 s\); every rank last reported step 5: .+",
                            alerts.sent[0]), alerts.sent[0]
        first = _stall_s(window)
        qtbot.waitUntil(lambda: _stall_s(window) > first, timeout=10_000)  # looked again
        assert len(alerts.sent) == 1  # the same stall: said once

        _report(server, 6, time.time())  # it progressed...
        qtbot.waitUntil(lambda: window.store.info.step == 6 and _stall_s(window) == -1,
                        timeout=30_000)
        assert len(alerts.sent) == 1
        _report(server, 7, time.time() - 40)  # ... and stalled again
        qtbot.waitUntil(lambda: len(alerts.sent) == 2, timeout=30_000)
        assert "looks hung: no progress for" in alerts.sent[1]
        assert "every rank last reported step 7" in alerts.sent[1]

        _in_front(qtbot, window)
        _report(server, 8, time.time() - 40)  # stalled again, with the window in front
        qtbot.waitUntil(lambda: "last reported step 8" in window.dashboard.alert.text(),
                        timeout=30_000)
        assert len(alerts.sent) == 2
        with qtbot.waitSignal(window.controller.finished, timeout=30_000):
            server.close()
    finally:
        server.close()
    assert alerts.said == alerts.sent and alerts.label.toolTip() == alerts.sent[1]
    assert alerts.label.isVisibleTo(window)  # kept for the user who comes back
    (tmp_path / "later").mkdir()
    later = Telemetry(tmp_path / "later", welcome_extra={"world_size": 2},
                      on_stop=lambda _why: None)
    try:  # the next run: the last one's alert is old news
        assert window.attach_remote("127.0.0.1", later.port, later.token)
        assert alerts.label.text() == "" and not alerts.label.isVisibleTo(window)
        _report(later, 1, time.time())
        qtbot.waitUntil(lambda: window.store.info.step == 1, timeout=30_000)  # connected
        with qtbot.waitSignal(window.controller.finished, timeout=30_000):
            later.close()
    finally:
        later.close()


def test_a_dead_run_opened_from_its_record_is_no_hung_run(
        qtbot, window: MainWindow, tmp_path: Path) -> None:
    """A run whose launcher died unrecorded reads as stalled on the dashboard, but nothing of
    it is live here to alert about."""
    alerts = window.alerts
    alerts.tray_available = True  # as on a desktop with a tray
    server = Telemetry(tmp_path, welcome_extra={"world_size": 2}, on_stop=lambda _why: None)
    try:  # a run watched first: its end is told, and the dashboard is hooked
        assert window.attach_remote("127.0.0.1", server.port, server.token)
        _report(server, 1, time.time())
        qtbot.waitUntil(lambda: window.store.info.step == 1, timeout=30_000)
        _behind_another(qtbot, window)
        with qtbot.waitSignal(window.controller.finished, timeout=30_000):
            server.close()
    finally:
        server.close()
    assert len(alerts.said) == 1 and "lost the connection to rank 0" in alerts.said[0]
    run = make_run_folder(tmp_path / "runs", "dead", state="running")
    assert window.open_run(run) == "record"
    qtbot.waitUntil(lambda: _stall_s(window) > 0, timeout=10_000)
    assert len(alerts.said) == 1


def test_the_end_in_words() -> None:
    started = {"started": 1000.0, "updated": 1151.0}
    assert end_text("mlp-1", {"state": "completed", "step": 60, **started}) == (
        "mlp-1: completed in 2:31")
    assert end_text("mlp-1", {"state": "completed", "step": 60}) == "mlp-1: completed at step 60"
    assert end_text("mlp-1", {"state": "failed", "step": 4, "reason": "rank 1 exited with code "
                              "1\n  Traceback ..."}) == (
        "mlp-1 failed at step 4: rank 1 exited with code 1")
    assert end_text("mlp-1", {"state": "stopped", "step": 9, "reason": "x" * 300}) == (
        "mlp-1 stopped at step 9: " + "x" * 199 + "…")
    assert end_text("r", {"state": "disconnected", "step": 2, "reason": "lost the connection "
                          "to rank 0 at h:1 before the run ended"}) == (
        "r: lost the connection to rank 0 at h:1 before the run ended")
