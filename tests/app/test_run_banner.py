"""The end-of-run banner: the state in words, the reason, the checkpoint's path, and Resume /
Open folder / Compare; one state word for a run in the status bar, the Runs panel, the banner
and status.json; nothing live left on screen for a run that ended."""

from __future__ import annotations

import json
import os
import signal
from pathlib import Path

import pytest
from PySide6.QtCore import QUrl

from app.main_window import MainWindow
from app.run_banner import banner_text, previous_run
from ddp_engine.common.run_dir import read_status
from ddp_engine.common.runs import RunIndex
from tests.conftest import make_run_folder, processes_mentioning


@pytest.fixture
def runs(tmp_path: Path) -> Path:
    d = tmp_path / "runs"
    d.mkdir()
    make_run_folder(d, "first", state="completed", started=1_000.0, steps=30)
    make_run_folder(d, "second", state="stopped", started=2_000.0, steps=50)
    make_run_folder(d, "third", state="failed", started=3_000.0, steps=20, checkpoint=False)
    return d


def _failed_reason(run: Path, reason: str) -> None:
    import json

    status = read_status(run) or {}
    status["reason"] = reason
    (run / "status.json").write_text(json.dumps(status))


def test_each_ended_run_opened_says_how_it_ended_where_its_checkpoint_is_and_what_next(
        qtbot, open_window, runs: Path) -> None:
    _failed_reason(runs / "third", "rank 1 exited with code 1: RuntimeError: boom")
    w: MainWindow = open_window(runs)
    banner = w.dashboard.banner
    assert not banner.isVisible()  # nothing shown yet: no banner

    assert w.open_run(runs / "second") == "record"
    ckpt = runs / "second" / "checkpoints" / "last.pt"
    assert banner.isVisible() and banner.headline.text() == "Stopped at step 50/50"
    assert banner.detail.text() == f"Checkpoint (step 50): {ckpt}"
    assert w.state_label.text() == "stopped" and "second: stopped at step 50" in \
        w.message_label.text()
    assert banner.resume.isEnabled() and banner.compare.isEnabled()
    assert banner.compare.toolTip() == "Compare this run with first"
    opened: list[QUrl] = []
    banner.open_url = opened.append  # the desktop's file manager is not ours to open here
    banner.open_folder.click()
    assert opened == [QUrl.fromLocalFile(str((runs / "second").resolve()))]
    banner.compare.click()  # this run beside the one before it
    assert w.tabs.currentWidget() is w.compare
    assert w.compare.names() == ["first", "second"]
    banner.resume.click()
    assert w.panel.resume.text() == str(ckpt.resolve())

    assert w.open_run(runs / "third") == "record"
    assert banner.headline.text() == "Failed at step 20/20"
    assert banner.detail.text().splitlines() == [
        "rank 1 exited with code 1: RuntimeError: boom", "No checkpoint was saved."]
    assert not banner.resume.isEnabled() and "no checkpoint" in banner.resume.toolTip()
    assert "#fdecea" in banner.styleSheet()  # failed: the red look

    assert w.open_run(runs / "first") == "record"
    assert banner.headline.text() == "Completed at step 30/30"
    assert not banner.compare.isEnabled()  # nothing started before it
    dash = w.dashboard
    dash.redraw(budget_s=None)
    assert dash.progress_label.text().startswith("step 30/30  epoch 0  completed")
    assert not dash.stacks.button.isEnabled() and "has ended" in dash.stacks.button.toolTip()

    dash.reset()  # a new run starts: no banner of the last one
    assert not banner.isVisible()


def test_the_banner_words_a_run_without_a_step_or_reason(tmp_path: Path) -> None:
    run = make_run_folder(tmp_path, "r", state="stopped", steps=40)
    summary = RunIndex(tmp_path).summarize(run)
    summary.step = None
    assert banner_text(summary)[0] == "Stopped"
    summary.step, summary.total_steps, summary.state = 40, None, "completed"
    summary.reason = "a reason only a stop or a failure is worded with"
    headline, detail = banner_text(summary)
    assert headline == "Completed at step 40" and "reason" not in detail


def test_compare_takes_the_newest_ended_run_that_started_before(tmp_path: Path) -> None:
    make_run_folder(tmp_path, "a", started=1_000.0)
    make_run_folder(tmp_path, "b", started=2_000.0, state="failed")
    make_run_folder(tmp_path, "live", started=2_500.0, state="running")
    c = make_run_folder(tmp_path, "c", started=3_000.0)
    make_run_folder(tmp_path, "later", started=4_000.0)
    (tmp_path / "not a run").mkdir()
    assert previous_run(c) == tmp_path / "b"
    assert previous_run(tmp_path / "a") is None


@pytest.mark.slow
def test_a_launcher_killed_under_the_window_is_failed_everywhere_alike(
        qtbot, window: MainWindow) -> None:
    """Issue 30 item 9: the launcher SIGKILLed (by the OOM killer, say) left status.json saying
    running; the window's word for the run must be the Runs panel's and status.json's."""
    window.panel.max_steps.setValue(50_000)
    run_dir = window.start_run()
    assert run_dir is not None
    qtbot.waitUntil(lambda: window.store.info.step >= 10, timeout=120_000)
    pid = read_status(run_dir)["launcher_pid"]
    with qtbot.waitSignal(window.controller.finished, timeout=120_000) as finished:
        os.kill(pid, signal.SIGKILL)
    assert finished.args[0]["state"] == "failed"
    status = read_status(run_dir)
    assert status["state"] == "failed" and "launcher exited with code -9" in status["reason"]
    assert RunIndex(run_dir.parent).summarize(run_dir).state == "failed"
    assert window.state_label.text() == "failed"
    assert window.dashboard.banner.headline.text().startswith("Failed at step")
    assert not processes_mentioning(str(run_dir))


def test_an_ended_script_runs_steps_say_no_question_mark(tmp_path: Path) -> None:
    from app.runs_panel import _cell_texts

    run = make_run_folder(tmp_path, "script", steps=3840)
    summary = RunIndex(tmp_path).summarize(run)
    summary.total_steps = None
    assert _cell_texts(summary)[5] == "3840"
    summary.live = True
    assert _cell_texts(summary)[5] == "3840/?"


def test_a_script_runs_banner_does_not_say_no_checkpoint_was_saved(tmp_path: Path) -> None:
    """A script saves its checkpoints itself, where Rankscope cannot know; one Rankscope saved
    (status.json names it) is still shown."""
    run = make_run_folder(tmp_path, "script", checkpoint=False)
    config = json.loads((run / "config.json").read_text())
    (run / "config.json").write_text(json.dumps({**config, "script": "/home/u/train.py"}))
    detail = banner_text(RunIndex(tmp_path).summarize(run))[1]
    assert "No checkpoint was saved" not in detail and "the script's own" in detail
    builtin = make_run_folder(tmp_path, "builtin", checkpoint=False)
    assert banner_text(RunIndex(tmp_path).summarize(builtin))[1] == "No checkpoint was saved."
    (run / "checkpoints" / "last.pt").write_bytes(b"")
    assert "Checkpoint" in banner_text(RunIndex(tmp_path).summarize(run))[1]
