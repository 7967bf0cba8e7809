"""A caption that never cuts a line silently: each line too long for the label's width ends in
an ellipsis, and the whole text is in its tooltip."""

from __future__ import annotations

from PySide6.QtCore import Qt
from PySide6.QtGui import QResizeEvent
from PySide6.QtWidgets import QLabel, QSizePolicy

ELLIPSIS = "\u2026"


class ElidedLabel(QLabel):
    """Plain-text lines, each elided on the right to the label's width. :meth:`full_text` is
    the text as set; ``text()`` is what is shown. The tooltip holds the whole text whenever a
    line is elided (and is empty otherwise). Its width is the layout's to give: it never asks
    for the width of its longest line (a wrapping label would make the grid give its row the
    height first, squeezing the charts)."""

    def __init__(self, text: str = "") -> None:
        super().__init__()
        self.setTextFormat(Qt.TextFormat.PlainText)
        self.setSizePolicy(QSizePolicy.Policy.Ignored, QSizePolicy.Policy.Preferred)
        self._full = ""
        self.set_full_text(text)

    def full_text(self) -> str:
        return self._full

    def set_full_text(self, text: str) -> None:
        if text == self._full and self.text():
            return
        self._full = text
        self._elide()

    def elided(self) -> bool:
        """Whether a line is shown cut (its end an ellipsis)."""
        return self.text() != self._full

    def resizeEvent(self, event: QResizeEvent) -> None:  # noqa: N802 (Qt's name)
        super().resizeEvent(event)
        self._elide()

    def _elide(self) -> None:
        metrics = self.fontMetrics()
        width = self.contentsRect().width() - 2 * self.margin()
        lines = [metrics.elidedText(line, Qt.TextElideMode.ElideRight, max(width, 1))
                 if metrics.horizontalAdvance(line) > width else line
                 for line in self._full.split("\n")]
        shown = "\n".join(lines)
        if shown != self.text():
            QLabel.setText(self, shown)
        tip = self._full if shown != self._full else ""
        if tip != self.toolTip():
            self.setToolTip(tip)
