"""The window's menu bar: every action with its shortcut (Run, View, Tools, Help), shortcuts
named in the tooltips, and the About box with the versions in use."""

from __future__ import annotations

import platform
from importlib import metadata
from pathlib import Path
from typing import TYPE_CHECKING

from PySide6 import __version__ as pyside_version
from PySide6.QtCore import QUrl, qVersion
from PySide6.QtGui import QAction, QDesktopServices, QKeySequence, QShortcut
from PySide6.QtWidgets import QMenu, QMessageBox

from app.dialogs import action

if TYPE_CHECKING:
    from app.main_window import MainWindow

DOCS = Path(__file__).resolve().parent.parent / "docs"
GUIDE = DOCS / "USER_GUIDE.md"
REFERENCE = DOCS / "REFERENCE.md"


def tip(item: QAction, text: str) -> QAction:
    """``item`` with ``text`` as its tooltip, its shortcut named after it (toolbar buttons
    show the tooltip: a user finds the key there)."""
    keys = item.shortcut().toString(QKeySequence.SequenceFormat.NativeText)
    item.setToolTip(f"{text} ({keys})" if keys else text)
    item.setStatusTip(text)
    return item


def versions() -> list[tuple[str, str]]:
    """What this window runs on, and the PyTorch its runs use (read from the installed
    package's metadata: the window never imports torch)."""
    def installed(name: str) -> str:
        try:
            return metadata.version(name)
        except metadata.PackageNotFoundError:
            return "not installed"

    import numpy
    import pyqtgraph

    return [("Rankscope", installed("rankscope")), ("Python", platform.python_version()),
            ("Qt", qVersion()), ("PySide6", pyside_version),
            ("pyqtgraph", pyqtgraph.__version__), ("NumPy", numpy.__version__),
            ("PyTorch (the runs')", installed("torch")),
            ("nvidia-ml-py", installed("nvidia-ml-py")), ("psutil", installed("psutil"))]


def about_text() -> str:
    rows = "".join(f"<tr><td>{name}</td><td>&nbsp;{version}</td></tr>"
                   for name, version in versions())
    return ("<b>Rankscope</b>: launch PyTorch DDP training on this machine and watch every "
            f"rank live.<br><br><table>{rows}</table><br>Documentation: {DOCS}")


class Menus:
    """Builds ``window``'s menu bar from its actions (the toolbar shares them)."""

    def __init__(self, window: MainWindow) -> None:
        self.window = w = window
        bar = w.menuBar()
        self.run = bar.addMenu("&Run")
        tip(w.start_action, "Start a run with the launch form's settings")
        tip(w.stop_action, "Stop the run watched: every rank stops at the same step and rank 0 "
                           "saves a checkpoint")
        w.attach_action.setShortcut(QKeySequence("Ctrl+Shift+A"))
        tip(w.attach_action, "Watch and stop a run whose rank 0 is on another machine, "
                             "through a forwarded port and its token")
        self.sweep = tip(action(w, "Scaling sweep", "Ctrl+Shift+S", self._sweep),
                         "Run the form's config on 1, 2, ... N devices and plot throughput "
                         "and efficiency (Scaling tab)")
        self.quit = tip(action(w, "Quit", "Ctrl+Q", w.close), "Close the window (a run "
                        "being watched: you are asked whether to leave it training)")
        self.run.addActions([w.start_action, w.stop_action])
        self.run.addSeparator()
        self.run.addActions([w.attach_action, self.sweep])
        self.run.addSeparator()
        self.run.addAction(self.quit)

        self.view = bar.addMenu("&View")
        self.tabs = [tip(action(w, name, f"Alt+{i + 1}",
                                lambda i=i: w.tabs.setCurrentIndex(i)), f"Show the {name} tab")
                     for i, name in enumerate(("Dashboard", "Logs", "Scaling"))]
        self.view.addActions(self.tabs)
        self.view.addSeparator()
        self.view.addActions([w.launch_toggle, w.runs_toggle])

        self.tools = bar.addMenu("&Tools")
        tip(w.doctor_action, "Measure this machine's devices and all-reduce bandwidth "
                             "(doctor): what the sync charts are compared with")
        self.stacks = tip(action(w, "Take stacks", "Ctrl+T", self._stacks),
                          "Take the stack of every rank of the run shown, without stopping it")
        self.profile = tip(action(w, "Profile steps", "Ctrl+Shift+P", self._profile),
                           "Profile the same steps on every rank of the run shown, and read "
                           "where each rank's time goes")
        self.folder = tip(action(w, "Runs folder...", "Ctrl+O", w.runs.choose_folder),
                          "Choose the folder whose runs the Runs panel lists")
        self.tools.addActions([w.doctor_action, self.stacks, self.profile, self.folder])

        self.help = bar.addMenu("&Help")
        self.guide = tip(action(w, "User guide", "F1", lambda: self.open_doc(GUIDE)),
                         "Open the user guide (docs/USER_GUIDE.md)")
        self.reference = tip(action(w, "Reference", None, lambda: self.open_doc(REFERENCE)),
                             "Open the reference: command line, config keys, run folder")
        self.about = tip(action(w, "About Rankscope", None, self.show_about),
                         "Versions of Rankscope and what it runs on")
        self.help.addActions([self.guide, self.reference])
        self.help.addSeparator()
        self.help.addAction(self.about)
        self.about_box: QMessageBox | None = None
        self.open_url = QDesktopServices.openUrl
        """How a document is opened (the desktop's viewer for Markdown or text)."""
        for menu in (self.run, self.view, self.tools, self.help):
            menu.setToolTipsVisible(True)
        # F10 opens the menu bar, as in GNOME and KDE applications (Alt+letter opens a menu).
        self.f10 = QShortcut(QKeySequence("F10"), w)
        self.f10.activated.connect(self.open_menu_bar)

    def open_menu_bar(self) -> None:
        bar = self.window.menuBar()
        bar.setFocus()
        bar.setActiveAction(self.run.menuAction())

    def menus(self) -> list[QMenu]:
        return [self.run, self.view, self.tools, self.help]

    def _sweep(self) -> None:
        w = self.window
        w.tabs.setCurrentWidget(w.scaling)
        w.start_sweep()

    def _stacks(self) -> None:
        w = self.window
        if w.viewing is None or not w.dashboard.stacks.button.isEnabled():
            w.message_label.setText("no stacks to take: no local run is training in view")
            return
        w.tabs.setCurrentWidget(w.dashboard)
        w.dashboard.stacks.take(w.viewing)

    def _profile(self) -> None:
        w = self.window
        if w.viewing is None or not w.dashboard.profile.button.isEnabled():
            w.message_label.setText("no profile to take: no local run is training in view")
            return
        w.tabs.setCurrentWidget(w.dashboard)
        w.dashboard.profile.take()

    def open_doc(self, path: Path) -> None:
        if not self.open_url(QUrl.fromLocalFile(str(path))):
            self.window.message_label.setText(f"no viewer opened {path}: read it there")

    def show_about(self) -> QMessageBox:
        box = QMessageBox(QMessageBox.Icon.Information, "About Rankscope", about_text(),
                          QMessageBox.StandardButton.Ok, self.window)
        box.setWindowModality(box.windowModality().WindowModal)
        box.show()
        self.about_box = box
        return box
