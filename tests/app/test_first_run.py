"""The first window's page: what Start will do with the form as it is, how to run one's own
script and where runs are kept; gone once a run is shown."""

from __future__ import annotations

from pathlib import Path

from app.first_run import what_start_does
from app.main_window import MainWindow
from ddp_engine.common.config import RunConfig
from tests.conftest import make_run_folder


def test_the_first_window_says_what_start_will_do_and_follows_the_form(
        qtbot, window: MainWindow, tmp_path: Path) -> None:
    dash = window.dashboard
    qtbot.waitExposed(window)
    assert dash.welcome.isVisible() and not dash.scroll.isVisible()  # no empty 0-1 axes
    assert not dash.progress.isVisible() and not dash.stacks.button.isVisible()
    page = dash.welcome.text()
    assert "trains mlp on synthetic data with 2 CPU processes for 200 steps" in page
    assert "python -m ddp_engine launch --script train.py" in page
    assert f"Runs are kept in</b> {tmp_path / 'runs'}" in page
    window.panel.max_steps.setValue(500)
    window.panel.devices.count.setValue(1)  # (this machine may have 2 cores only)
    assert "with 1 CPU process for 500 steps" in dash.welcome.text()
    window.panel.lr.setText("fast")
    assert "Start</b> waits for the launch form: Learning rate must be a number" in \
        dash.welcome.text()
    window.panel.lr.setText("0.001")
    run = make_run_folder(tmp_path / "runs", "seen")
    window.open_run(run)
    assert not dash.welcome.isVisible() and dash.scroll.isVisible()
    assert dash.progress.isVisible()


def test_what_start_does_in_words() -> None:
    cfg = RunConfig(model="convnet", dataset="digits", device="cuda", gpus=[2, 5],
                    max_steps=None, epochs=3)
    assert what_start_does(cfg) == "convnet on digits data with GPUs 2, 5 for 3 epochs"
    cfg = RunConfig(script="train.py", nproc=1, device="cpu", max_steps=None)
    assert what_start_does(cfg) == "your script train.py with 1 CPU process until it ends"
