"""Render icons/rankscope.svg as the PNG sizes desktops look for: ``python resources/make_icons.py``
(Qt's own SVG renderer, offscreen; the PNGs are committed, so users need not run this)."""

from __future__ import annotations

import os
import sys
from pathlib import Path

SIZES = (16, 24, 32, 48, 64, 128, 256)
HERE = Path(__file__).resolve().parent


def main() -> int:
    os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")
    from PySide6.QtCore import Qt
    from PySide6.QtGui import QGuiApplication, QImage, QPainter
    from PySide6.QtSvg import QSvgRenderer

    _app = QGuiApplication(sys.argv[:1])
    renderer = QSvgRenderer(str(HERE / "icons" / "rankscope.svg"))
    if not renderer.isValid():
        print("icons/rankscope.svg does not parse", file=sys.stderr)
        return 1
    for size in SIZES:
        image = QImage(size, size, QImage.Format.Format_ARGB32)
        image.fill(Qt.GlobalColor.transparent)
        painter = QPainter(image)
        painter.setRenderHint(QPainter.RenderHint.Antialiasing)
        renderer.render(painter)
        painter.end()
        out = HERE / "icons" / f"rankscope-{size}.png"
        if not image.save(str(out)):
            print(f"cannot write {out}", file=sys.stderr)
            return 1
        print(out.relative_to(HERE.parent))
    return 0


if __name__ == "__main__":
    sys.exit(main())
