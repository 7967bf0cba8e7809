"""The app's command (app/cli.py): its flags, and settings kept where they are asked to be."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from PySide6.QtCore import QSettings

from app.cli import open_window, parse_args
from tests.conftest import REPO, TEST_CONFIG_HOME


def test_the_tests_never_touch_the_users_own_settings(qtbot) -> None:
    users = QSettings("Rankscope", "Rankscope").fileName()
    assert users.startswith(str(TEST_CONFIG_HOME)), users


def test_settings_flag_keeps_the_last_form_in_that_file(qtbot, tmp_path: Path) -> None:
    ini = tmp_path / "my-settings.ini"
    preset = tmp_path / "p.toml"
    preset.write_text('batch_size = 48\nmax_steps = 77\n')
    window = open_window(parse_args(["--settings", str(ini), "--config", str(preset),
                                     "--runs-dir", str(tmp_path / "runs")]))
    qtbot.addWidget(window)
    window.close()  # the form is remembered on closing
    assert ini.is_file()
    form = json.loads(str(QSettings(str(ini), QSettings.Format.IniFormat).value("last_form")))
    assert (form["batch_size"], form["max_steps"]) == (48, 77)
    assert not Path(QSettings("Rankscope", "Rankscope").fileName()).exists()


def test_a_bad_preset_on_the_command_line_is_one_line_and_exit_2(tmp_path: Path) -> None:
    bad = tmp_path / "bad.toml"
    bad.write_text('batch_size = "big"\n')
    for preset, says in ((tmp_path / "missing.toml", "does not exist"),
                         (bad, "batch_size must be an integer, got 'big'")):
        proc = subprocess.run([sys.executable, "main.py", "--config", str(preset)], cwd=REPO,
                              capture_output=True, text=True, timeout=60,
                              env={**os.environ, "QT_QPA_PLATFORM": "offscreen"})
        assert proc.returncode == 2 and proc.stderr.count("\n") == 1, proc.stderr
        assert proc.stderr.startswith("error: ") and says in proc.stderr
