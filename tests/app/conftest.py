"""Helpers for the window tests."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from PySide6.QtCore import QSettings

from app.charts.base import Chart
from app.main_window import MainWindow
from tests.conftest import REPO, wait_for

FREED = """
import gc
from PySide6.QtCore import QCoreApplication, QEvent
gc.collect()
QCoreApplication.sendPostedEvents(None, QEvent.Type.DeferredDelete.value)  # what deleteLater left
print("freed")
"""
"""The end of a :func:`in_a_fresh_gui_process` snippet that dropped its last reference to a
widget: the objects deleteLater() left are deleted now."""


def in_a_fresh_gui_process(code: str, tmp_path: Path) -> subprocess.CompletedProcess[str]:
    """``code`` run by a new Python (Qt offscreen, the repository importable, HOME in
    ``tmp_path``) after ``app = QApplication([])``: for what would end the test's own process,
    a crash in Qt's destructors."""
    head = "from PySide6.QtWidgets import QApplication\napp = QApplication([])\n"
    return subprocess.run([sys.executable, "-c", head + code], cwd=REPO, capture_output=True,
                          text=True, timeout=120,
                          env={**os.environ, "QT_QPA_PLATFORM": "offscreen",
                               "HOME": str(tmp_path)})


def shown_chart(qtbot, width: int = 500, height: int = 300) -> Chart:
    """An empty Chart titled "Loss", shown at ``width`` x ``height`` and exposed."""
    chart = Chart("Loss", "loss")
    qtbot.addWidget(chart)
    chart.resize(width, height)
    chart.show()
    qtbot.waitExposed(chart)
    return chart


def rank_rows(n: int, step: int) -> list[dict]:
    """One metrics report's rank rows: ``n`` ranks on GPUs, every field filled; rank r is
    a little slower and its loss a little higher than rank r - 1."""
    return [{"rank": r, "loss": 2.0 - step / 100 + r / 100, "step_time_s": 0.010 + r / 1000,
             "samples_per_s": 6400.0 - r, "sync_time_s": 0.003, "sync_exposed_s": 0.001,
             "data_wait_s": 0.0004, "forward_s": 0.002, "backward_s": 0.005,
             "optimizer_s": 0.001, "gpu_util_pct": 90.0 + r / 10, "gpu_mem_used_bytes": 2**34,
             "gpu_mem_total_bytes": 2**36, "gpu_temp_c": 60.0 + r, "gpu_power_w": 500.0,
             "device": f"GPU {gpu_index(r)}", "local_rank": r % 8,
             "gpu": {"index": gpu_index(r), "uuid": f"GPU-{gpu_index(r):08d}-0000-0000-0000-"
                     "000000000000", "name": "NVIDIA H200", "pci_bus_id": "00000000:01:00.0"}}
            for r in range(n)]


def gpu_index(rank: int) -> int:
    """The NVML index of rank ``rank``'s GPU in :func:`rank_rows`: local rank r on GPU 7 - r,
    so a view that shows the local rank (or CUDA's number) instead of the GPU is caught."""
    return 7 - rank % 8


def _stop_watched(w: MainWindow) -> None:
    """A run the window still watches is stopped (and seen to end) before the window closes,
    so closing never waits on the "leave it running?" question: a failed test fails, not
    hangs. pytest-qt closes the windows before the fixtures' own teardown runs."""
    if w.controller.active:
        w.controller.stop()
        wait_for(lambda: w.controller.poll_once() or not w.controller.active, 90,
                 "the watched run to end at teardown")


def _make(qtbot, tmp_path: Path, runs_dir: Path) -> MainWindow:
    settings = QSettings(str(tmp_path / "settings.ini"), QSettings.Format.IniFormat)
    w = MainWindow(runs_dir=str(runs_dir), settings=settings, gpus=[])
    qtbot.addWidget(w, before_close_func=_stop_watched)
    w.show()
    return w


@pytest.fixture
def open_window(qtbot, tmp_path: Path) -> Iterator[Callable[[Path], MainWindow]]:
    """``open_window(runs_dir)``: a shown MainWindow with settings of its own (no GPUs: CPU
    processes). A run still watched at teardown is stopped before the window closes
    (:func:`_stop_watched`)."""
    windows: list[MainWindow] = []

    def make(runs_dir: Path) -> MainWindow:
        windows.append(_make(qtbot, tmp_path, runs_dir))
        return windows[-1]

    yield make
    for w in windows:
        w.runs.stop_watching()


@pytest.fixture
def window(qtbot, tmp_path: Path):
    """A shown MainWindow on tmp_path/runs (see :func:`open_window`)."""
    return _make(qtbot, tmp_path, tmp_path / "runs")
