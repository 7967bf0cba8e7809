"""The Runs panel and what it leads to: open, re-attach, compare, resume, export, delete."""

from __future__ import annotations

import csv
import subprocess
import sys
import time
from pathlib import Path

import pytest
from PySide6.QtCore import QSettings
from PySide6.QtWidgets import QMessageBox

from app.main_window import MainWindow
from ddp_engine.common.run_dir import read_rank_files, read_status
from ddp_engine.common.runs import RunIndex
from tests.conftest import (
    FAULTY,
    endless_run,
    make_run_folder,
    processes_mentioning,
    run_engine,
    wait_for,
)

SLOW_LOSS = f"{FAULTY}:slow"


def _scanned(qtbot, w: MainWindow) -> None:
    """Wait for a scan that started after now."""
    before = w.runs.scans
    w.runs.refresh()
    qtbot.waitUntil(lambda: w.runs.scans >= before + 2, timeout=10_000)


def _names(w: MainWindow) -> list[str]:
    tree = w.runs.tree
    return [tree.topLevelItem(i).text(0) for i in range(tree.topLevelItemCount())]


@pytest.fixture
def runs(tmp_path: Path) -> Path:
    d = tmp_path / "runs"
    d.mkdir()
    make_run_folder(d, "first", state="completed", started=1_000.0, steps=30)
    make_run_folder(d, "second", state="stopped", started=2_000.0, steps=50,
                    losses=lambda step, rank: 1.0 + rank + 1.0 / step)
    make_run_folder(d, "third", state="failed", started=3_000.0, steps=20)
    return d


def test_the_panel_lists_every_run_newest_first_and_keeps_up(qtbot, open_window,
                                                            runs: Path, fake_launcher) -> None:
    w = open_window(runs)
    _scanned(qtbot, w)
    assert _names(w) == ["third", "second", "first"]
    second = w.runs.item(runs / "second")
    assert second.text(1) == "stopped" and second.text(4) == "cpu x2"
    assert second.text(5) == "50/50" and second.text(6) == "1.52"  # mean of 1+1/50 and 2+1/50
    w.runs.select([runs / "second"])
    make_run_folder(runs, "fourth", state="running", launcher_pid=fake_launcher.pid,
                    started=time.time())
    _scanned(qtbot, w)
    assert _names(w)[0] == "fourth" and w.runs.item(runs / "fourth").text(1) == "running (live)"
    assert [s.name for s in w.runs.selected()] == ["second"]  # the selection survived
    assert not w.viewing  # only the first scan after start-up attaches a live run


def test_opening_a_finished_run_draws_its_record(qtbot, open_window, runs: Path) -> None:
    w = open_window(runs)
    assert w.open_run(runs / "second") == "record"
    assert w.store.info.step == 50 and w.store.info.state == "stopped"
    assert not w.controller.active and not w.stop_action.isEnabled()
    w.dashboard.redraw(budget_s=None)
    assert w.dashboard.loss.chart.points("rank 1") == 5
    assert w.windowTitle() == "Rankscope - second"
    assert "stopped at step 50" in w.message_label.text()


def test_delete_asks_first_and_never_deletes_a_live_run(qtbot, open_window,
                                                        runs: Path, fake_launcher) -> None:
    w = open_window(runs)
    _scanned(qtbot, w)  # after the first scan: the live fixture is not re-attached at start
    live = make_run_folder(runs, "live", state="running", launcher_pid=fake_launcher.pid,
                           started=time.time())
    _scanned(qtbot, w)
    w.runs.select([runs / "first"])
    w.runs.confirm_delete()
    w.runs.confirm_box.button(QMessageBox.StandardButton.Cancel).click()
    assert (runs / "first").exists()
    w.runs.confirm_delete()
    assert "first" in w.runs.confirm_box.text()
    w.runs.confirm_box.button(QMessageBox.StandardButton.Yes).click()
    assert not (runs / "first").exists()
    assert w.runs.folder.text() == "deleted first"  # said, not done in silence
    _scanned(qtbot, w)
    assert "first" not in _names(w)
    w.runs.select([live, runs / "third"])
    assert not w.runs.buttons["delete"].isEnabled()
    w.runs.confirm_delete()
    assert "live is live (here or on another machine)" in w.runs.folder.text()
    assert live.exists() and (runs / "third").exists()


def test_compare_overlays_runs_by_step_or_by_time(qtbot, open_window, runs: Path) -> None:
    w = open_window(runs)
    w.compare_runs([runs / "first", runs / "second"])
    view = w.compare
    assert w.tabs.currentWidget() is view
    assert view.loss.points("first") == 3 and view.loss.points("second") == 5
    x, y = view.loss.curves["second"].getData()
    assert list(x) == [10, 20, 30, 40, 50] and y[0] == pytest.approx(1.6)
    view.axis.setCurrentText("time since start (s)")
    x, _ = view.throughput.curves["first"].getData()
    assert list(x) == [10, 20, 30]  # seconds after run_start, from the fixtures' clocks
    _, thr = view.throughput.curves["first"].getData()
    assert list(thr) == [300.0, 300.0, 300.0]  # 100 + 200 samples/s


def test_exports_from_the_window(open_window, tmp_path: Path, runs: Path) -> None:
    w = open_window(runs)
    out = w.export_run(runs / "first", "csv", tmp_path / "first.csv")
    rows = list(csv.DictReader(open(out)))
    assert len(rows) == 3 * 2 + 1 and rows[0]["rank"] == "0" and rows[-1]["val_loss"] == "0.5"
    assert w.export_run(tmp_path / "missing", "csv", tmp_path / "x.csv") is None
    assert "metrics.jsonl" in w.message_label.text() and "missing" in w.message_label.text()
    pytest.importorskip("tensorboard")
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    event_file = w.export_run(runs / "first", "tensorboard")
    acc = EventAccumulator(str(event_file))
    acc.Reload()
    assert [e.step for e in acc.Scalars("loss/rank0")] == [10, 20, 30]
    w.dashboard.loss.chart.export(tmp_path / "loss.svg")
    assert (tmp_path / "loss.svg").read_text().lstrip().startswith("<?xml")


@pytest.mark.slow
def test_a_terminal_run_is_reattached_at_start_with_its_history_and_stopped(
        qtbot, open_window, tmp_path: Path) -> None:
    with endless_run(tmp_path, "--log-every", "5") as (_proc, run_dir):
        wait_for(lambda: (read_status(run_dir) or {}).get("step", 0) >= 30, 120,
                 "the terminal run to train 30 steps")
        w = open_window(tmp_path)  # the runs folder holding it
        qtbot.waitUntil(lambda: w.controller.active, timeout=20_000)
        assert w.viewing == run_dir.resolve() and "re-attached" in w.message_label.text()
        assert w.controller.launcher.proc is None  # adopted, not our child
        qtbot.waitUntil(lambda: w.store.info.step >= 40, timeout=60_000)
        assert w.store.mean_loss.x[0] == 5  # the full history, from the first report
        assert w.stop_action.isEnabled()
        other = make_run_folder(tmp_path / "elsewhere", "done")
        with qtbot.waitSignal(w.controller.finished, timeout=120_000) as sig:
            w.stop_action.trigger()
            assert not w.stop_action.isEnabled()
            assert w.open_run(other) == "busy"  # the stop's escalation needs this window
        result = sig.args[0]
        assert result["state"] == "stopped" and result["leftover_pids"] == []
        steps = {r["step"] for r in read_rank_files(run_dir).values()}
        assert len(steps) == 1  # every rank stopped at the same step
        assert not processes_mentioning(str(run_dir))


@pytest.mark.slow
def test_resume_relaunches_from_the_last_checkpoint_as_a_linked_run(qtbot, open_window,
                                                                   tmp_path: Path) -> None:
    runs_dir = tmp_path / "runs"
    parent = runs_dir / "parent"
    done = run_engine("launch", "--nproc", "2", "--max-steps", "20", "--log-every", "5",
                      "--eval-every", "0", "--run-dir", str(parent))
    assert done.returncode == 0, done.stderr
    w = open_window(runs_dir)
    _scanned(qtbot, w)
    w.runs.select([parent])
    assert w.runs.buttons["resume"].isEnabled()
    cfg = w.resume_from(parent)
    assert cfg is not None and w.panel.resume.text() == str(parent / "checkpoints" / "last.pt")
    assert not w.panel.valid  # max_steps 20 leaves nothing to train after step 20
    assert w.panel.problem.startswith("max_steps: the checkpoint is at step 20")
    w.panel.max_steps.setValue(35)  # editable before the relaunch
    assert w.panel.config().log_every == 5  # fields the form does not show are kept
    with qtbot.waitSignal(w.controller.finished, timeout=180_000) as sig:
        child = w.start_run()
    assert sig.args[0]["state"] == "completed" and sig.args[0]["step"] == 35
    assert child != parent and child.parent == runs_dir
    starts = [e for e in w.store.events if e.get("kind") == "run_start"]
    assert starts[-1]["start_step"] == 20 and w.store.mean_loss.x[0] == 25
    summary = next(s for s in RunIndex(runs_dir).refresh() if s.path == child)
    assert summary.parent == parent
    _scanned(qtbot, w)
    assert w.runs.item(child).text(10) == "parent"


def test_opening_an_interrupted_run_says_how_it_ended(open_window, tmp_path: Path,
                                                      runs: Path) -> None:
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    make_run_folder(runs, "killed", state="running", launcher_pid=dead.pid, started=4_000.0)
    w = open_window(runs)
    assert w.open_run(runs / "killed") == "record"
    assert w.store.info.state == "interrupted"
    assert "killed: interrupted at step 30" in w.message_label.text()
    assert "launcher is gone" in w.message_label.text()


@pytest.mark.slow
def test_a_run_without_telemetry_is_followed_through_its_metrics_file(
        qtbot, open_window, tmp_path: Path) -> None:
    with endless_run(tmp_path, "--log-every", "5", "--no-telemetry") as (_proc, run_dir):
        wait_for(lambda: (read_status(run_dir) or {}).get("step", 0) >= 20, 120,
                 "the terminal run to train 20 steps")
        assert not (run_dir / "monitor.json").exists()
        w = open_window(tmp_path)
        qtbot.waitUntil(lambda: w.controller.active, timeout=20_000)
        qtbot.waitUntil(lambda: w.store.info.step >= 30, timeout=60_000)
        assert w.store.mean_loss.x[0] == 5  # from the first report
        with qtbot.waitSignal(w.controller.finished, timeout=120_000) as sig:
            w.stop_action.trigger()  # no socket: SIGTERM to the launcher, an agreed stop
        assert sig.args[0]["state"] == "stopped" and sig.args[0]["leftover_pids"] == []
        assert not processes_mentioning(str(run_dir))


# ------------------------------------------------------------------------ the runs folder
def _window(qtbot, settings: Path, **kwargs) -> MainWindow:
    w = MainWindow(settings=QSettings(str(settings), QSettings.Format.IniFormat), gpus=[],
                   **kwargs)
    qtbot.addWidget(w)
    return w


def test_the_runs_folder_comes_from_the_command_line_then_the_preset_then_the_last_one(
        qtbot, tmp_path: Path) -> None:
    ini = tmp_path / "settings.ini"
    named, plain = tmp_path / "named.toml", tmp_path / "plain.toml"
    named.write_text(f'runs_dir = "{tmp_path / "from-preset"}"\nbatch_size = 8\n')
    plain.write_text("batch_size = 8\n")
    w = _window(qtbot, ini, preset=str(named))
    assert w.runs.runs_dir == (tmp_path / "from-preset").resolve()
    assert w.panel.runs_dir.text() == str(tmp_path / "from-preset")
    w = _window(qtbot, ini, preset=str(named), runs_dir=str(tmp_path / "cli"))
    assert w.runs.runs_dir == (tmp_path / "cli").resolve()  # the command line wins
    assert w.panel.config().runs_dir == str(tmp_path / "cli")
    w = _window(qtbot, ini, preset=str(plain), runs_dir=str(tmp_path / "cli2"))
    assert w.panel.config().runs_dir == str(tmp_path / "cli2")  # not ./runs
    w.close()
    again = _window(qtbot, ini)  # no --runs-dir, no preset: the one used last
    assert again.runs.runs_dir == (tmp_path / "cli2").resolve()
    assert again.panel.config().runs_dir == str((tmp_path / "cli2").resolve())


def test_the_list_follows_the_form_the_presets_and_the_folder_button(
        qtbot, tmp_path: Path) -> None:
    w = _window(qtbot, tmp_path / "settings.ini", runs_dir=str(tmp_path / "a"))
    w.panel.runs_dir.setText(str(tmp_path / "typed"))
    w.panel.runs_dir.editingFinished.emit()
    assert w.runs.runs_dir == (tmp_path / "typed").resolve()
    preset = tmp_path / "p.toml"
    preset.write_text(f'runs_dir = "{tmp_path / "preset-runs"}"\n')
    w.panel.load_preset_from(preset)
    assert w.runs.runs_dir == (tmp_path / "preset-runs").resolve()
    preset.write_text("max_steps = 12\n")
    w.panel.load_preset_from(preset)  # names none: the folder stays
    assert w.runs.runs_dir == (tmp_path / "preset-runs").resolve()
    w.runs.folder_chosen.emit(tmp_path / "chosen")  # as the Folder... dialog does
    assert w.panel.config().runs_dir == str(tmp_path / "chosen")
    assert w.runs.folder.text() == f"runs in {(tmp_path / 'chosen').resolve()}"
