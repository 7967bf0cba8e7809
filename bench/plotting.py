"""Saving a benchmark's plot: the app's own Chart, shown offscreen and exported as PNG."""

from __future__ import annotations

from pathlib import Path
from typing import Any


def save_chart(app: Any, chart: Any, path: Path, size: tuple[int, int] = (800, 460)) -> None:
    """Lay ``chart`` out at ``size``, paint it once and write it to ``path``."""
    chart.resize(*size)
    chart.show()
    app.processEvents()
    chart.export(path)
    chart.close()
    print(f"plot: {path}")
