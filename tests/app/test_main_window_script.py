"""The window with the launch form's script source: a user's own script, started and stopped
from the form (a real 2-process gloo run)."""

from __future__ import annotations

from pathlib import Path

import pytest
from PySide6.QtCore import Qt

from app.main_window import MainWindow
from ddp_engine.common.run_dir import read_status
from tests.conftest import REPO, processes_mentioning


@pytest.mark.slow
def test_your_own_script_from_the_form_stops_with_a_checkpoint_and_comes_back(
        qtbot, window: MainWindow, tmp_path: Path) -> None:
    """Issue 19: examples/ddp_train.py, unchanged, started from the form on 2 CPU processes;
    Stop ends it at an agreed step with its model in checkpoints/last.pt, and Resume... puts
    the script back in the form to run again."""
    panel = window.panel
    qtbot.mouseClick(panel.source.script, Qt.MouseButton.LeftButton)
    panel.script.path.setText(str(REPO / "examples" / "ddp_train.py"))
    panel.script_args.setText(f"--epochs 50 --samples 4096 --checkpoint {tmp_path}/ck.pt")
    assert panel.valid and window.start_action.isEnabled(), panel.problem
    cfg = panel.config()
    assert (cfg.device, cfg.nproc, cfg.max_steps, cfg.model) == ("cpu", 2, None, "mlp")
    assert cfg.script_cwd == str(REPO / "examples")  # the app has no caller's folder: explicit
    run_dir = window.start_run()
    assert run_dir is not None and run_dir.parent == (tmp_path / "runs").resolve()
    assert run_dir.name.startswith("ddp_train-")  # the script's name
    qtbot.waitUntil(lambda: window.store.ranks() == [0, 1] and window.store.info.step > 0,
                    timeout=120_000)
    with qtbot.waitSignal(window.controller.finished, timeout=120_000) as finished:
        window.stop_action.trigger()
    assert finished.args[0]["state"] == "stopped" and finished.args[0]["leftover_pids"] == []
    assert read_status(run_dir)["state"] == "stopped"
    assert (run_dir / "checkpoints" / "last.pt").is_file()
    assert not (tmp_path / "ck.pt").exists()  # stopped before the script's own final save
    assert not processes_mentioning(str(run_dir))
    panel.source.builtin.setChecked(True)
    assert window.resume_from(run_dir) is not None
    assert panel.source.value() == "script" and panel.config().script_args == cfg.script_args
    assert panel.config().script_cwd == cfg.script_cwd  # the folder it ran in, kept
    assert window.message_label.text().startswith(f"{run_dir.name} ran your script ddp_train.py")
