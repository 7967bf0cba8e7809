"""Export... from the Runs panel: where a CSV goes is asked; TensorBoard event files go into the
run's own folder."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from PySide6.QtWidgets import QFileDialog, QWidget


def ask_and_export(parent: QWidget, path: Path, kind: str,
                   export: Callable[[Path, str, Path | None], object]) -> None:
    """Export ``path``'s run as ``kind`` ("csv": to a file the user picks) through
    ``export`` (the window's, which says in the status bar what was written)."""
    if kind == "csv":
        dest, _ = QFileDialog.getSaveFileName(parent, "Export CSV", str(path / "metrics.csv"),
                                              "CSV (*.csv)")
        if dest:
            export(path, "csv", Path(dest))
    else:
        export(path, kind, None)
