"""The window's layout as the user left it: its size and place, the docks' sizes and the Runs
columns, kept per user in the window's QSettings; on the first start, dock sizes that fit the
screen (the Runs panel a fifth of the height, between RUNS_MIN_PX and RUNS_MAX_PX)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from PySide6.QtCore import QByteArray, Qt

if TYPE_CHECKING:
    from app.main_window import MainWindow

GEOMETRY_KEY, STATE_KEY, COLUMNS_KEY = "window/geometry", "window/state", "window/runs_columns"
LAUNCH_DOCK_WIDTH = 340
"""The launch panel's width at the first start, in pixels."""
RUNS_MIN_PX, RUNS_MAX_PX = 120, 220


def _saved(window: MainWindow, key: str) -> QByteArray | None:
    value = window.settings.value(key)
    return value if isinstance(value, QByteArray) and not value.isEmpty() else None


def restore_layout(window: MainWindow) -> bool:
    """Put back the layout saved at the last close; False when there is none (first start)."""
    geometry, state = _saved(window, GEOMETRY_KEY), _saved(window, STATE_KEY)
    if geometry is None or state is None:
        return False
    window.restoreGeometry(geometry)
    window.restoreState(state)
    columns = _saved(window, COLUMNS_KEY)
    if columns is not None:
        window.runs.tree.header().restoreState(columns)
    return True


def first_sizes(window: MainWindow) -> None:
    """The docks' sizes for a window that has no saved layout, from its height."""
    height = window.height()
    runs = max(RUNS_MIN_PX, min(RUNS_MAX_PX, height // 5))
    window.resizeDocks([window.runs_dock], [runs], Qt.Orientation.Vertical)
    window.resizeDocks([window.launch_dock], [LAUNCH_DOCK_WIDTH], Qt.Orientation.Horizontal)


def save_layout(window: MainWindow) -> None:
    window.settings.setValue(GEOMETRY_KEY, window.saveGeometry())
    window.settings.setValue(STATE_KEY, window.saveState())
    window.settings.setValue(COLUMNS_KEY, window.runs.tree.header().saveState())
    window.settings.sync()
