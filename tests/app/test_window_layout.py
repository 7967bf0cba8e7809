"""The window's layout: on the first start the Runs panel takes a fifth of the height (a small
window keeps room for the charts); then the size, docks and Runs columns as the user left
them, kept per user; the Runs columns widen as a live run's text grows."""

from __future__ import annotations

from pathlib import Path

from PySide6.QtCore import QSettings, Qt

from app.main_window import MainWindow
from app.window_layout import RUNS_MAX_PX, RUNS_MIN_PX
from tests.conftest import make_run_folder


def _window(qtbot, tmp_path: Path, width: int, height: int) -> MainWindow:
    settings = QSettings(str(tmp_path / "settings.ini"), QSettings.Format.IniFormat)
    w = MainWindow(runs_dir=str(tmp_path / "runs"), settings=settings, gpus=[])
    qtbot.addWidget(w)
    w.resize(width, height)
    w.show()
    qtbot.waitExposed(w)
    return w


def test_the_first_start_fits_the_docks_to_the_window_and_the_next_keeps_them(
        qtbot, tmp_path: Path) -> None:
    w = _window(qtbot, tmp_path, 1000, 700)
    # The dock settles once the window is laid out: a fifth of the height, not a third.
    qtbot.waitUntil(lambda: RUNS_MIN_PX - 10 <= w.runs_dock.height() <= 700 // 5 + 10)
    assert w.runs_dock.height() <= RUNS_MAX_PX
    w.resizeDocks([w.runs_dock], [300], Qt.Orientation.Vertical)  # the user drags it
    w.runs.tree.setColumnWidth(2, 211)
    qtbot.waitUntil(lambda: abs(w.runs_dock.height() - 300) < 15)
    kept = w.runs_dock.height()
    w.close()
    again = _window(qtbot, tmp_path, 1000, 700)
    qtbot.waitUntil(lambda: again.runs_dock.height() > 0)
    assert abs(again.runs_dock.height() - kept) <= 2  # as the user left it
    assert again.runs.tree.columnWidth(2) == 211
    again.close()


def test_a_column_widens_as_its_text_grows(qtbot, tmp_path: Path) -> None:
    runs = tmp_path / "runs"
    run = make_run_folder(runs, "r", steps=20)
    w = _window(qtbot, tmp_path, 1000, 700)
    qtbot.waitUntil(lambda: w.runs.item(run) is not None, timeout=10_000)
    summary = w.runs.summaries[0]
    summary.step, summary.total_steps = 123_456_789, 987_654_321  # a long run, far along
    w.runs.show_runs([summary])
    item = w.runs.item(run)
    steps = item.text(5)
    assert steps == "123456789/987654321"
    needed = w.runs.tree.fontMetrics().horizontalAdvance(steps)
    assert w.runs.tree.columnWidth(5) >= needed  # the whole text, not "1234..."
    w.close()
