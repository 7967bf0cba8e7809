"""Every rank's stack in the dashboard: a Stacks button for the run shown, and a panel under
the hang hint that shows the grouped stacks (taken once, automatically, when the run looks
hung). The stacks are taken off the GUI thread (:func:`ddp_engine.common.stacks.take_stacks`:
it signals the ranks and waits up to a few seconds for their dumps) and saved by it in the run
folder, whose file the panel names."""

from __future__ import annotations

import threading
from pathlib import Path

from PySide6.QtCore import QObject, Qt, Signal
from PySide6.QtGui import QFontDatabase
from PySide6.QtWidgets import (
    QHBoxLayout,
    QLabel,
    QPlainTextEdit,
    QPushButton,
    QVBoxLayout,
    QWidget,
)

from ddp_engine.common.stacks import NotARunFolder, StackReport, take_stacks

TAKE_TIMEOUT_S = 10.0
"""How long each rank gets to write its stacks."""
TEXT_HEIGHT = 260
"""The stacks' text area, in pixels (the charts keep the rest; it scrolls)."""


class StacksTaker(QObject):
    """:func:`take_stacks` on a daemon thread; the report arrives as ``taken``, a failure's
    one-line reason as ``failed``."""

    taken = Signal(object)  # StackReport
    failed = Signal(str)

    def start(self, run_dir: Path) -> None:
        threading.Thread(target=self._take, args=(run_dir,), daemon=True,
                         name="rankscope-stacks").start()

    def _take(self, run_dir: Path) -> None:
        try:
            self.taken.emit(take_stacks(run_dir, timeout_s=TAKE_TIMEOUT_S))
        except (NotARunFolder, OSError) as e:
            self.failed.emit(str(e))


STACKS_TIP = ("Take the stack of every rank of the run shown (faulthandler, or py-spy where "
              "allowed) without stopping it, grouped by where the ranks stand; saved in its "
              "folder under ranks/")


class StacksPanel(QWidget):
    """The grouped stacks of the run shown, hidden until some are taken. ``button`` (Stacks)
    takes them; :meth:`take` with ``automatic`` does once per run (the hang alert)."""

    shown = Signal(object)
    """The StackReport just shown (for tests and the status bar)."""

    def __init__(self) -> None:
        super().__init__()
        self.button = QPushButton("Stacks")
        self.button.setObjectName("stacks_button")
        self.button.setToolTip(STACKS_TIP)
        self.button.setEnabled(False)
        self.button.clicked.connect(lambda: self.take(self.run_dir))
        self.header = QLabel("")
        self.header.setObjectName("stacks_header")
        self.header.setWordWrap(True)
        self.header.setTextInteractionFlags(Qt.TextInteractionFlag.TextSelectableByMouse)
        hide = QPushButton("Hide")
        hide.clicked.connect(self.hide)
        self.text = QPlainTextEdit()
        self.text.setObjectName("stacks_text")
        self.text.setReadOnly(True)
        self.text.setLineWrapMode(QPlainTextEdit.LineWrapMode.NoWrap)
        self.text.setFont(QFontDatabase.systemFont(QFontDatabase.SystemFont.FixedFont))
        self.text.setFixedHeight(TEXT_HEIGHT)
        row = QHBoxLayout()
        row.setContentsMargins(0, 0, 0, 0)
        row.addWidget(self.header, 1)
        row.addWidget(hide)
        layout = QVBoxLayout(self)
        layout.setContentsMargins(0, 0, 0, 0)
        layout.addLayout(row)
        layout.addWidget(self.text)
        self.hide()
        self.run_dir: Path | None = None
        self.busy = False
        self.ended = False  # the run shown ended: no process to take stacks of
        self._automatic_for: set[Path] = set()  # runs whose stacks the hang alert took
        self.taker = StacksTaker(self)
        self.taker.taken.connect(self._taken)
        self.taker.failed.connect(self._failed)

    def set_run(self, run_dir: Path | None) -> None:
        """The run shown (None: a remote run, whose ranks are not on this machine)."""
        if run_dir != self.run_dir:
            self.run_dir = run_dir
            self.hide()
        self._enable()

    def set_ended(self, ended: bool) -> None:
        """Whether the run shown has ended (Stacks is disabled then: no rank is left)."""
        if ended != self.ended:
            self.ended = ended
            self._enable()

    def _enable(self) -> None:
        self.button.setEnabled(self.run_dir is not None and not self.busy and not self.ended)
        self.button.setToolTip(STACKS_TIP if not self.ended else
                               "The run has ended: no process is left to take stacks of "
                               "(those taken are under ranks/ in its folder)")

    def take(self, run_dir: Path | None, automatic: bool = False) -> bool:
        """Take the stacks of ``run_dir``'s ranks (off the GUI thread); False if nothing was
        started (no local run, one take under way, or ``automatic`` and already taken)."""
        if run_dir is None or self.busy or (automatic and run_dir in self._automatic_for):
            return False
        if automatic:
            self._automatic_for.add(run_dir)
        self.busy = True
        self.button.setEnabled(False)
        self.header.setText("taking the stack of every rank..."
                            + (" (the run looks hung)" if automatic else ""))
        self.text.setPlainText("")
        self.show()
        self.taker.start(run_dir)
        return True

    def _done(self) -> None:
        self.busy = False
        self._enable()

    def _taken(self, report: StackReport) -> None:
        self._done()
        if report.run_dir != self.run_dir:
            return  # another run is shown now
        if not report.ranks:
            why = "; ".join(report.notes) or "the run has ended, or not started its ranks yet"
            self.header.setText(f"No live rank to take stacks from: {why}")
        else:
            self.header.setText(f"Stacks ({report.mechanism}), saved in {report.path}")
            self.text.setPlainText(report.text)
        self.shown.emit(report)

    def _failed(self, why: str) -> None:
        self._done()
        self.header.setText(f"Stacks not taken: {why}")
