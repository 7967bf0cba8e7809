"""The window driven as a user would (pytest-qt, offscreen): validate, start, watch, stop."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from PySide6.QtWidgets import QLabel

from app.main_window import MainWindow
from ddp_engine.run_dir import read_rank_files, read_status
from tests.app.conftest import _make
from tests.conftest import REPO, processes_mentioning, wait_for

FAULTY = REPO / "tests" / "ddp_engine" / "plugins" / "faulty.py"


@pytest.fixture
def window(qtbot, tmp_path: Path):
    w = _make(qtbot, tmp_path, tmp_path / "runs")
    yield w
    if w.controller.active:
        w.controller.stop()
        wait_for(lambda: not w.controller.active or (w.controller.poll_once() and False), 60,
                 "the run to end at teardown")


def test_title_and_default_form_is_valid_on_this_machine(window: MainWindow) -> None:
    assert window.windowTitle().startswith("Rankscope")
    assert window.panel.valid and window.start_action.isEnabled()
    assert not window.stop_action.isEnabled()
    cfg = window.panel.config()
    assert cfg.device == "cpu" and cfg.nproc == 2 and cfg.model == "mlp"
    assert window.panel.findChild(QLabel, "no_gpu_note") is not None


def test_bad_values_are_marked_at_their_field_and_block_start(window: MainWindow) -> None:
    panel = window.panel
    panel.lr.setText("fast")
    assert not panel.valid and not window.start_action.isEnabled()
    assert "lr must be a number, got 'fast'" in panel.error.text()
    assert "d62728" in panel.lr.styleSheet() and "lr must be" in panel.lr.toolTip()
    panel.lr.setText("0.01")
    assert panel.valid and panel.lr.styleSheet() == ""
    panel.batch_size.setValue(0)
    assert "batch_size must be >= 1, got 0" in panel.error.text()
    assert "d62728" in panel.batch_size.styleSheet()
    panel.batch_size.setValue(16)
    panel.dataset.combo.setCurrentText("text file...")
    panel.dataset.path.setText("/nonexistent/corpus.txt")
    assert not panel.valid
    assert "dataset" in panel.error.text()
    panel.dataset.combo.setCurrentText("synthetic")
    panel.model.combo.setCurrentText("Custom...")
    panel.model.path.setText("nofile.py:build")
    assert "model: plugin file 'nofile.py'" in panel.error.text()
    assert "d62728" in panel.model.styleSheet()
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
    result = finished.args[0]
    assert result["state"] == "completed" and result["leftover_pids"] == []
    assert window.state_label.text() == "completed"
    assert "no process of the run is left" in window.message_label.text()
    store = window.store
    assert store.ranks() == [0, 1] and store.info.step == 60
    qtbot.waitUntil(lambda: window.dashboard.drawn_version == store.version
                    and window.dashboard.labels_version == store.version, timeout=5000)
    assert window.dashboard.loss.chart.points("rank 1") > 0
    assert window.dashboard.throughput.chart.points("all ranks") == 6
    assert window.dashboard.sync.sync.points("rank 0") == 6
    assert "step 60/60" in window.dashboard.progress_label.text()
    qtbot.waitUntil(lambda: window.logs.poll_once() or window.logs.rank.count() == 2,
                    timeout=5000)
    window.logs.filter.setText("rank 1/2")
    window.logs.rank.setCurrentIndex(window.logs.rank.findData(1))
    assert "rank 1/2 on cpu" in window.logs.text.toPlainText()
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
    assert not processes_mentioning(str(run_dir))


@pytest.mark.slow
def test_a_crashing_rank_shows_failed_with_its_log_tail(qtbot, window: MainWindow) -> None:
    window.panel.loss.combo.setCurrentText("Custom...")
    window.panel.loss.path.setText(f"{FAULTY}:raise_on_rank1")
    assert window.panel.valid, window.panel.error.text()
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
    assert not processes_mentioning(str(run_dir))


def test_the_gui_process_never_imports_torch(tmp_path: Path) -> None:
    code = ("import sys; from PySide6.QtWidgets import QApplication; app = QApplication([]);"
            "from app.main_window import MainWindow; "
            f"w = MainWindow(runs_dir={str(tmp_path)!r}); w.show(); app.processEvents();"
            "sys.exit(1 if 'torch' in sys.modules else 0)")
    proc = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True,
                          env={**__import__("os").environ, "QT_QPA_PLATFORM": "offscreen",
                               "HOME": str(tmp_path)}, timeout=60)
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
