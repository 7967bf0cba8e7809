"""The window driven as a user would (pytest-qt, offscreen): validate, start, watch, stop."""

from __future__ import annotations

import os
import socket
import time
import zipfile
from pathlib import Path

import pytest
from PySide6.QtCore import Qt
from PySide6.QtGui import QPalette
from PySide6.QtWidgets import QDialogButtonBox, QLabel

from app.dialogs import RemoteAttachDialog
from app.form_errors import ERROR_BASE, refused
from app.main_window import MainWindow
from ddp_engine.common.protocol import read_monitor_file
from ddp_engine.common.run_dir import iter_metrics, read_rank_files, read_status
from ddp_engine.rank.telemetry import Telemetry
from tests.app.conftest import in_a_fresh_gui_process
from tests.conftest import (
    FAULTY,
    endless_run,
    free_port,
    make_run_folder,
    processes_mentioning,
    wait_for,
)


def test_title_and_default_form_is_valid_on_this_machine(window: MainWindow) -> None:
    assert window.windowTitle().startswith("Rankscope")
    assert window.panel.valid and window.start_action.isEnabled()
    assert not window.stop_action.isEnabled()
    cfg = window.panel.config()
    assert cfg.device == "cpu" and cfg.nproc == 2 and cfg.model == "mlp"
    assert window.panel.findChild(QLabel, "no_gpu_note") is not None


def test_bad_values_block_start_and_show_at_their_field_when_start_is_pressed(
        window: MainWindow) -> None:
    panel = window.panel
    panel.lr.setText("fast")
    assert not panel.valid and not window.start_action.isEnabled()
    assert panel.problem == "lr must be a number, got 'fast'"
    assert not refused(panel.lr)  # not touched by the user (set here): not shown yet
    assert window.start_run() is None  # F5 / Start: now it is, in the form's words
    assert refused(panel.lr) and panel.lr.toolTip() == "Learning rate must be a number, got 'fast'"
    assert window.message_label.text() == "not started: Learning rate must be a number, got 'fast'"
    panel.lr.setText("0.01")
    assert panel.valid and not refused(panel.lr)
    panel.batch_size.setValue(0)
    assert panel.last_error == "Batch size / device must be >= 1, got 0"
    assert refused(panel.batch_size)
    panel.batch_size.setValue(16)
    panel.dataset.combo.setCurrentText("text file...")
    panel.dataset.path.setText("/nonexistent/corpus.txt")
    assert not panel.valid and panel.problem.startswith("dataset")
    panel.dataset.combo.setCurrentText("synthetic")
    panel.model.combo.setCurrentText("Custom...")
    panel.model.path.setText("nofile.py:build")
    assert panel.last_error.startswith("Model: plugin file 'nofile.py'")
    assert refused(panel.model) and panel.model.styleSheet() == ""
    assert panel.model.path.palette().color(QPalette.ColorRole.Base).name() == ERROR_BASE
    assert window.start_run() is None  # nothing is launched
    assert window.controller.state == "idle"


def test_presets_round_trip_and_last_settings_come_back(qtbot, tmp_path: Path,
                                                        window: MainWindow) -> None:
    panel = window.panel
    panel.max_steps.setValue(77)
    panel.optimizer.setCurrentText("sgd")
    preset = tmp_path / "p.toml"
    panel.save_preset_to(preset)
    panel.max_steps.setValue(5)
    panel.load_preset_from(preset)
    assert panel.max_steps.value() == 77 and panel.optimizer.currentText() == "sgd"
    window.close()  # saves the form
    again = MainWindow(runs_dir=str(tmp_path / "runs"), settings=window.settings, gpus=[])
    qtbot.addWidget(again)
    assert again.panel.max_steps.value() == 77 and again.panel.optimizer.currentText() == "sgd"


@pytest.mark.slow
def test_a_whole_run_from_the_gui_to_completion(qtbot, window: MainWindow) -> None:
    window.panel.max_steps.setValue(60)
    with qtbot.waitSignal(window.controller.finished, timeout=180_000) as finished:
        run_dir = window.start_run()
        assert run_dir is not None and window.controller.state == "starting"
        assert not window.start_action.isEnabled() and window.stop_action.isEnabled()
        window.dashboard.redraw(budget_s=None)  # where the start-up is, in words
        assert window.dashboard.progress_label.text() == "launching torchrun: starting the ranks..."
    result = finished.args[0]
    assert result["state"] == "completed" and result["leftover_pids"] == []
    assert window.state_label.text() == "completed"
    assert "no process of the run is left" in window.message_label.text()
    store = window.store
    assert store.ranks() == [0, 1] and store.info.step == 60
    qtbot.waitUntil(lambda: window.dashboard.drawn_version == store.version
                    and window.dashboard.labels_version == store.version, timeout=5000)
    assert window.dashboard.loss.chart.points("rank 1") > 0
    # every report drawn: the run's reports are paced (multiples of 10 steps, 0.2 s apart)
    reports = [m["step"] for m in iter_metrics(run_dir) if m["type"] == "metrics"]
    assert reports[0] == 10 and reports[-1] == 60
    assert window.dashboard.throughput.chart.points("all ranks") == len(reports)
    assert window.dashboard.sync.sync.points("rank 0") == len(reports)
    dash = window.dashboard  # the end, said once and nothing live left on screen
    assert dash.progress_label.text().startswith("step 60/60  epoch 0  completed")
    assert "ETA" not in dash.progress_label.text() and not dash.stacks.button.isEnabled()
    assert dash.banner.isVisible() and dash.banner.headline.text() == "Completed at step 60/60"
    assert f"Checkpoint (step 60): {run_dir / 'checkpoints' / 'last.pt'}" in \
        dash.banner.detail.text()
    assert window.runs.summary(run_dir) is None or window.runs.summary(run_dir).state in (
        "completed", "running")  # the panel may not have rescanned yet; never another word
    logs = window.logs
    qtbot.waitUntil(lambda: logs.poll_once() or [logs.rank.itemText(i) for i in range(
        logs.rank.count())] == ["all", "launcher", "rank 0", "rank 1"], timeout=5000)
    logs.filter.setText("RANK 1/2")  # any case
    logs.show_log("rank 1")
    assert "rank 1/2 on cpu" in logs.text.toPlainText()
    logs.show_log("launcher")  # the launcher's progress lines and how the run ended
    assert logs.text.toPlainText() == "" and logs.note.text() == (
        "no line of launcher has 'RANK 1/2'")
    logs.filter.setText("completed at step 60")
    assert logs.text.toPlainText() == "[rankscope] completed at step 60" and not logs.note.text()
    logs.show_log("all")  # every log, each line named
    shown = logs.text.toPlainText()
    assert "[launcher] [rankscope] completed at step 60" in shown
    logs.filter.setText("no such line anywhere")
    assert logs.text.toPlainText() == ""
    assert logs.note.text() == "no line of any log has 'no such line anywhere'"
    assert not processes_mentioning(str(run_dir))


@pytest.mark.slow
def test_stop_mid_run_ends_stopped_with_nothing_left(qtbot, window: MainWindow) -> None:
    window.panel.max_steps.setValue(50_000)  # long enough to stop mid-run; ends by itself
    run_dir = window.start_run()
    assert run_dir is not None
    qtbot.waitUntil(lambda: window.store.info.step >= 20, timeout=120_000)
    with qtbot.waitSignal(window.controller.finished, timeout=120_000) as finished:
        window.stop_action.trigger()
        assert window.controller.state == "stopping"
    result = finished.args[0]
    assert result["state"] == "stopped" and result["leftover_pids"] == []
    ranks = read_rank_files(run_dir)
    assert len({d["step"] for d in ranks.values()}) == 1
    assert (run_dir / "checkpoints" / "last.pt").is_file()
    assert read_status(run_dir)["state"] == "stopped"
    banner = window.dashboard.banner
    step = next(iter(ranks.values()))["step"]
    assert banner.headline.text() == f"Stopped at step {step}/50000"
    assert str(run_dir / "checkpoints" / "last.pt") in banner.detail.text()
    assert banner.resume.isEnabled()
    with qtbot.waitSignal(banner.resume_requested):  # Resume fills the form from it
        banner.resume.click()
    assert window.panel.resume.text() == str(run_dir / "checkpoints" / "last.pt")
    assert not processes_mentioning(str(run_dir))


@pytest.mark.slow
def test_a_crashing_rank_shows_failed_with_its_log_tail(qtbot, window: MainWindow) -> None:
    window.panel.loss.combo.setCurrentText("Custom...")
    window.panel.loss.path.setText(f"{FAULTY}:raise_on_rank1")
    assert window.panel.valid, window.panel.problem
    with qtbot.waitSignal(window.controller.finished, timeout=180_000) as finished:
        run_dir = window.start_run()
    result = finished.args[0]
    assert result["state"] == "failed" and window.state_label.text() == "failed"
    assert "rank 1" in result["reason"] and "boom from the test plugin" in result["reason"]
    assert result["log_rank"] == 1
    assert any("RuntimeError: boom" in line for line in result["log_tail"])
    shown = window.failure_box.text()
    assert window.failure_box.isVisible() and "boom from the test plugin" in shown
    assert "rank 1" in shown
    banner = window.dashboard.banner
    assert banner.headline.text().startswith("Failed at step")
    assert "boom from the test plugin" in banner.detail.text()
    assert "background: #fdecea" in banner.styleSheet()
    assert not processes_mentioning(str(run_dir))


def test_the_gui_process_never_imports_torch(tmp_path: Path) -> None:
    proc = in_a_fresh_gui_process(
        "import sys; from app.main_window import MainWindow; "
        f"w = MainWindow(runs_dir={str(tmp_path)!r}); w.show(); _ = w.dashboard; "
        "w.menus.show_about(); app.processEvents();"
        "sys.exit(1 if 'torch' in sys.modules else 0)", tmp_path)
    assert proc.returncode == 0, "the GUI imported torch: " + proc.stderr[-2000:]


@pytest.mark.slow
def test_closing_during_a_run_can_leave_it_training(qtbot, window: MainWindow) -> None:
    from PySide6.QtCore import QTimer
    from PySide6.QtWidgets import QApplication, QMessageBox

    from tests.conftest import run_engine

    window.panel.max_steps.setValue(50_000)
    run_dir = window.start_run()
    assert run_dir is not None
    qtbot.waitUntil(lambda: window.store.info.step >= 10, timeout=120_000)
    asked: list[str] = []

    def answer() -> None:
        box = QApplication.activeModalWidget()
        assert isinstance(box, QMessageBox)
        asked.append(box.text())
        leave = next(b for b in box.buttons() if b.text() == "Leave it running")
        leave.click()

    QTimer.singleShot(200, answer)
    window.close()
    assert asked and "Stop it, or leave it running" in asked[0]
    assert not window.isVisible() and window.controller.state == "idle"
    step = read_status(run_dir)["step"]
    wait_for(lambda: (read_status(run_dir) or {}).get("step", 0) > step + 50, 60,
             "the run to keep training without its window")
    stopped = run_engine("stop", str(run_dir), timeout=120)
    assert stopped.returncode == 0 and stopped.stdout.startswith("stopped")
    assert not processes_mentioning(str(run_dir))


def _submit(dialog: RemoteAttachDialog, host: str, port: str, token: str) -> None:
    dialog.host.setText(host)
    dialog.port.setText(port)
    dialog.token.setText(token)
    dialog.buttons.button(QDialogButtonBox.StandardButton.Ok).click()


@pytest.mark.parametrize(("host", "port", "token", "field", "message"), [
    ("127.0.0.1", "0", "abc", "port", "port must be a whole number between 1 and 65535, got 0"),
    ("127.0.0.1", "http", "abc", "port",
     "port must be a whole number between 1 and 65535, got 'http'"),
    ("127.0.0.1", "29600", "", "token",
     "token must be the non-empty token of the run's monitor.json, got ''"),
    ("", "29600", "abc", "host", "host must be a host name or IP address, got ''"),
])
def test_attach_dialog_names_the_bad_field_and_attaches_nothing(
        window: MainWindow, host: str, port: str, token: str, field: str, message: str) -> None:
    window.attach_action.trigger()
    dialog = window.attach_dialog
    assert dialog is not None and dialog.isVisible()
    _submit(dialog, host, port, token)
    assert dialog.isVisible() and dialog.error.text() == message  # stays open, says why
    for name in ("host", "port", "token"):
        assert refused(getattr(dialog, name)) == (name == field), name
    assert window.controller.state == "idle" and window.controller.client is None
    assert window.windowTitle() == "Rankscope" and window.start_action.isEnabled()
    dialog.reject()
    assert window.attach_remote(host, int(port) if port.isdigit() else 0, token) is False
    assert window.message_label.text().startswith("not attached: ")
    assert window.controller.state == "idle"


def test_attach_dialog_attaches_to_a_remote_rank_0_and_stop_goes_over_the_socket(
        qtbot, window: MainWindow, tmp_path: Path) -> None:
    """Against a real in-process rank-0 server: the window as while a remote run trains, then
    the end as the run's final events say."""
    stops: list[str] = []
    server = Telemetry(tmp_path, welcome_extra={"world_size": 2}, on_stop=stops.append)
    try:
        server.publish({"type": "metrics", "step": 10, "total_steps": 100,
                        "ranks": [{"rank": 0, "loss": 1.0}, {"rank": 1, "loss": 1.1}]})
        window.attach_action.trigger()
        assert window.attach_dialog is not None
        _submit(window.attach_dialog, "127.0.0.1", str(server.port), server.token)
        assert not window.attach_dialog.isVisible()
        address = f"127.0.0.1:{server.port}"
        assert window.windowTitle() == f"Rankscope - {address}"
        assert window.controller.remote == address and window.viewing is None
        qtbot.waitUntil(lambda: window.controller.state == "running", timeout=30_000)
        assert window.store.ranks() == [0, 1] and window.store.info.step == 10
        assert not window.start_action.isEnabled() and window.stop_action.isEnabled()
        note = window.logs.text.placeholderText()
        assert "on another machine: its ranks' logs are there" in note
        window.logs.poll_once()  # nothing to follow, nothing breaks
        window.stop_action.trigger()
        qtbot.waitUntil(lambda: len(stops) == 1, timeout=30_000)
        assert stops == [f"stop command from the Rankscope window (pid {os.getpid()} on "
                         f"{socket.gethostname()})"]  # the reason every viewer will see
        assert "no SIGTERM/SIGKILL from here" in window.message_label.text()
        assert not window.stop_action.isEnabled()
        server.publish({"type": "event", "kind": "stopping", "step": 12, "reason": stops[0]})
        server.publish({"type": "event", "kind": "stopped", "step": 12})
        with qtbot.waitSignal(window.controller.finished, timeout=30_000):
            server.close()
    finally:
        server.close()
    assert window.state_label.text() == "stopped"
    assert window.message_label.text() == (
        f"at step 12: stopped from this window | rank 0 was at {address}; the run's "
        "processes are on that machine (not checked from here)")
    assert window.start_action.isEnabled() and not window.stop_action.isEnabled()


def test_a_lost_remote_connection_says_disconnected_not_failed(
        qtbot, window: MainWindow, tmp_path: Path) -> None:
    server = Telemetry(tmp_path, welcome_extra={"world_size": 2}, on_stop=lambda _why: None)
    try:
        assert window.attach_remote("127.0.0.1", server.port, server.token)
        qtbot.waitUntil(lambda: window.controller.state == "running", timeout=30_000)
        for step in (1, 2):
            server.publish({"type": "metrics", "step": step, "epoch": 0, "total_steps": 10,
                            "ranks": [{"rank": 0, "loss": 1.0}]})
        qtbot.waitUntil(lambda: window.store.info.step == 2, timeout=30_000)
        assert window.store.stall_s(time.time() + 3600) is not None  # reports had been coming
        with qtbot.waitSignal(window.controller.finished, timeout=30_000):
            server.close()  # no final event: the run may still be training
    finally:
        server.close()
    assert window.state_label.text() == "disconnected" and window.failure_box is None
    assert (f"lost the connection to rank 0 at 127.0.0.1:{server.port} before the run ended "
            "(it may still be training)") in window.message_label.text()
    assert window.store.stall_s(time.time() + 3600) is None  # no "looks hung" alert later


@pytest.mark.slow
def test_attach_to_a_run_by_address_and_token_then_stop_it(qtbot, window: MainWindow,
                                                           tmp_path: Path) -> None:
    """A user on another machine: rank 0's port forwarded (here: the same machine), the token
    copied from monitor.json; the window attaches by host, port and token, not the folder."""
    from tests.ddp_engine.launch.test_launcher import assert_no_process_left  # imports torch

    with endless_run(tmp_path, "--log-every", "5") as (proc, run_dir):
        wait_for(lambda: (run_dir / "monitor.json").exists(), 120, "monitor.json")
        info = read_monitor_file(run_dir)
        assert window.attach_remote("127.0.0.1", info["port"], info["token"])
        assert window.controller.run_dir is None and window.controller.launcher is None
        assert window.windowTitle() == f"Rankscope - 127.0.0.1:{info['port']}"
        loss = window.dashboard.loss.chart
        qtbot.waitUntil(lambda: window.store.ranks() == [0, 1] and loss.points("rank 0") > 0
                        and loss.points("rank 1") > 0, timeout=120_000)
        assert window.controller.state == "running"
        assert not window.start_action.isEnabled() and window.stop_action.isEnabled()
        with qtbot.waitSignal(window.controller.finished, timeout=120_000) as finished:
            window.stop_action.trigger()
            assert window.controller.state == "stopping"
        assert proc.wait(timeout=120) == 0
    result = finished.args[0]
    assert result["state"] == "stopped" and result["leftover_pids"] == []
    assert result["remote"] == f"127.0.0.1:{info['port']}"
    assert f"stop command from the Rankscope window (pid {os.getpid()} " in result["reason"]
    assert "stopped from this window" in window.message_label.text()
    status = read_status(run_dir)
    assert status["state"] == "stopped" and status["step"] == result["step"]
    assert window.state_label.text() == "stopped"
    assert_no_process_left(run_dir)


@pytest.mark.slow
def test_a_two_node_run_started_here_shows_every_rank_and_stops_both_nodes(
        qtbot, window: MainWindow, tmp_path: Path) -> None:
    """Start with 2 nodes makes this machine node 0; node 1 is a second launcher (here on
    127.0.0.1, as a user would start it on the other machine). The charts get all four ranks
    from rank 0; Stop stops both nodes after one step."""
    from tests.conftest import free_port, start_engine
    from tests.ddp_engine.launch.test_launcher import assert_no_process_left

    endpoint = f"127.0.0.1:{free_port()}"
    window.panel.max_steps.setValue(0)  # until stopped
    window.panel.epochs.setValue(1000)
    window.panel.nnodes.setValue(2)
    window.panel.rdzv_endpoint.setText(endpoint)
    run_dir = window.start_run()
    assert run_dir is not None
    node1 = start_engine("launch", "--config", str(run_dir / "launch.toml"), "--node-rank", "1",
                         "--rdzv-endpoint", endpoint, "--run-dir", str(run_dir),
                         log=tmp_path / "node-1.log")
    try:
        qtbot.waitUntil(lambda: window.store.ranks() == [0, 1, 2, 3]
                        and window.store.info.step >= 20, timeout=180_000)
        with qtbot.waitSignal(window.controller.finished, timeout=120_000) as finished:
            window.stop_action.trigger()
        assert node1.wait(timeout=60) == 0, (tmp_path / "node-1.log").read_text()
    finally:
        node1.kill()
    assert finished.args[0]["state"] == "stopped"
    ranks = {**read_rank_files(run_dir), **read_rank_files(run_dir / "node-1")}
    assert {d["state"] for d in ranks.values()} == {"stopped"}
    assert len({d["step"] for d in ranks.values()}) == 1
    assert read_status(run_dir / "node-1")["state"] == "stopped"
    assert_no_process_left(run_dir)


def test_the_reason_shows_under_its_field_and_f5_says_why_it_cannot_start(
        qtbot, window: MainWindow) -> None:
    panel = window.panel
    panel.lr.setText("fast")
    window.activateWindow()
    qtbot.waitUntil(window.isActiveWindow, timeout=5000)
    qtbot.keyClick(window, Qt.Key.Key_F5)
    assert window.message_label.text().startswith("not started: Learning rate must be a number")
    training = panel.lr.parentWidget().layout()
    lr_row = training.getWidgetPosition(panel.lr)[0]
    assert training.getWidgetPosition(panel.field_error)[0] == lr_row + 1
    assert panel.field_error.isVisible() and panel.field_error.text().startswith(
        "Learning rate must be a number, got 'fast'")
    assert not window.start_action.isEnabled()
    panel.lr.setText("0.01")
    panel.lr.setFocus()
    panel.name.setFocus()  # the row goes when the focus leaves the field, not mid-typing
    assert not panel.field_error.isVisible() and training.indexOf(panel.field_error) < 0
    assert window.start_action.isEnabled()


def test_a_resume_with_nothing_left_to_train_is_refused_at_max_steps(
        window: MainWindow, tmp_path: Path) -> None:
    run = make_run_folder(tmp_path / "runs", "done", steps=300)
    with zipfile.ZipFile(run / "checkpoints" / "last.pt", "w") as z:  # as torch.save writes
        z.writestr("last/data.pkl", b"")
    cfg = window.resume_from(run)
    assert cfg is not None and cfg.max_steps == 300
    panel = window.panel
    assert not panel.valid and not window.start_action.isEnabled()
    assert panel.problem == ("max_steps: the checkpoint is at step 300 and max_steps is "
                                  "300, so there is nothing left to train; raise max_steps "
                                  "above 300")
    window.start_run()
    assert refused(panel.max_steps)
    panel.max_steps.setValue(400)
    assert panel.valid


def test_attach_with_a_wrong_token_fails_fast_and_leaves_the_view_alone(
        qtbot, window: MainWindow, tmp_path: Path) -> None:
    server = Telemetry(tmp_path, welcome_extra={"world_size": 2}, on_stop=lambda _why: None)
    try:
        title = window.windowTitle()
        started = time.monotonic()
        assert not window.attach_remote("127.0.0.1", server.port, "not-the-token")
        assert time.monotonic() - started < 10
        assert window.windowTitle() == title and window.controller.state == "idle"
        assert window.controller.remote is None
        box = window.attach_failed_box
        assert box is not None and box.isVisible()
        assert "closed the connection instead of" in box.text() and "token" in box.text()
        assert window.message_label.text().startswith("not attached: ")
        port = free_port()  # nothing listens there
        assert not window.attach_remote("127.0.0.1", port, server.token)
        assert "cannot connect" in window.message_label.text()
    finally:
        server.close()


def test_saves_open_in_the_runs_folder_and_say_where_they_went(
        window: MainWindow, tmp_path: Path) -> None:
    from app.dialogs import save_folder, tell

    chart = window.dashboard.loss.chart
    (tmp_path / "runs").mkdir(exist_ok=True)
    assert save_folder(chart) == window.runs.runs_dir == (tmp_path / "runs").resolve()
    run = make_run_folder(tmp_path / "runs", "seen")
    window.open_run(run)
    assert save_folder(chart) == run.resolve()  # the run on screen
    tell(window.panel, f"preset saved to {tmp_path / 'p.toml'}")
    assert window.message_label.text() == f"preset saved to {tmp_path / 'p.toml'}"
