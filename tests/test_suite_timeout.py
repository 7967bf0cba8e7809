"""The suite's own per-test timeout ends a test stuck in C, not only one stuck in Python."""

from __future__ import annotations

import os
import re
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
    # The project's pytest settings (-c) in one xdist worker, as make test runs, with 2 s and
    # 4 s instead of 280 s and 300 s. With the signal method this run never ends
    # (subprocess.run's timeout fails the test).
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-n", "1", "-p", "no:cacheprovider", "-c",
         str(REPO / "pyproject.toml"), "--rootdir", str(tmp_path), "-o", "timeout=4", "-o",
         "faulthandler_timeout=2", str(test)],
        capture_output=True, text=True, timeout=120, cwd=tmp_path,
        env={**os.environ, "QT_QPA_PLATFORM": "offscreen"})
    out = done.stdout + done.stderr
    assert done.returncode != 0, out
    assert "crashed while running 'test_stuck.py::test_a_question_nobody_answers'" in out, out
    # faulthandler's stack of the stuck test, printed before the worker was ended
    assert re.search(r"Timeout \(0:00:02\)!.*test_stuck\.py\", line \d+ in "
                     r"test_a_question_nobody_answers", out, re.DOTALL), out
