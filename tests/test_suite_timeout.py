"""The suite's own per-test timeout ends a test stuck in C, not only one stuck in Python."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from tests.conftest import REPO

STUCK_IN_C = """
from PySide6.QtWidgets import QMessageBox


def test_a_question_nobody_answers(qtbot):
    box = QMessageBox()
    box.setText("nobody answers this")
    box.exec()  # Qt's modal loop: no Python runs here until the box closes
"""


def test_a_test_stuck_in_a_modal_dialog_is_ended_by_the_timeout(tmp_path: Path) -> None:
    test = tmp_path / "test_stuck.py"
    test.write_text(STUCK_IN_C)
    # The project's pytest settings (-c), with a 3 s timeout instead of 300 s. With the signal
    # method this run never ends (subprocess.run's timeout fails the test).
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-c",
         str(REPO / "pyproject.toml"), "--rootdir", str(tmp_path), "-o", "timeout=3", str(test)],
        capture_output=True, text=True, timeout=120, cwd=tmp_path,
        env={**os.environ, "QT_QPA_PLATFORM": "offscreen"})
    out = done.stdout + done.stderr
    assert done.returncode != 0, out
    assert "Timeout" in out and "box.exec()" in out, out  # the stack of the stuck test
