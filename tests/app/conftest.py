"""Helpers for the window tests."""

from __future__ import annotations

from pathlib import Path

from PySide6.QtCore import QSettings

from app.main_window import MainWindow


def open_window(qtbot, tmp_path: Path, runs_dir: Path) -> MainWindow:
    """A shown MainWindow on ``runs_dir`` with settings of its own (no GPUs: CPU processes)."""
    settings = QSettings(str(tmp_path / "settings.ini"), QSettings.Format.IniFormat)
    w = MainWindow(runs_dir=str(runs_dir), settings=settings, gpus=[])
    qtbot.addWidget(w)
    w.show()
    return w
