"""The window's dialogs: attach to a remote rank 0, what to do with a run on closing, and the
launch form's presets (a menu, and Load/Save preset... with their file dialogs)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from PySide6.QtCore import Qt
from PySide6.QtGui import QAction, QKeySequence
from PySide6.QtWidgets import (
    QComboBox,
    QDialog,
    QDialogButtonBox,
    QDockWidget,
    QFileDialog,
    QFormLayout,
    QHBoxLayout,
    QLabel,
    QLineEdit,
    QMainWindow,
    QMessageBox,
    QPushButton,
    QWidget,
)

from app.desktop import default_presets
from app.form_errors import mark
from app.run_model import parse_remote
from ddp_engine.common.config import ConfigError


class RemoteAttachDialog(QDialog):
    """Host, port and token of a rank 0 on another machine; bad input keeps it open, with the
    reason and the field outlined."""

    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.setWindowTitle("Attach to remote rank 0")
        self.host = QLineEdit("127.0.0.1")
        self.host.setObjectName("remote_host")
        self.port = QLineEdit()
        self.port.setObjectName("remote_port")
        self.port.setPlaceholderText("the run's --monitor-port, e.g. 29600")
        self.token = QLineEdit()
        self.token.setObjectName("remote_token")
        self.token.setEchoMode(QLineEdit.EchoMode.Password)
        self.token.setPlaceholderText('"token" of RUN_DIR/monitor.json on rank 0\'s machine')
        for field in (self.port, self.token):  # wide enough for the whole placeholder
            field.setToolTip(field.placeholderText())
            field.setMinimumWidth(field.fontMetrics().horizontalAdvance(
                field.placeholderText()) + 24)
        self.error = error_label("remote_error")
        hint = QLabel("Forward rank 0's telemetry port first. A run started with<br>"
                      "&nbsp;&nbsp;<code>--monitor-port 29600</code><br>is forwarded by<br>"
                      "&nbsp;&nbsp;<code>ssh -L 29600:127.0.0.1:29600 node0</code><br>"
                      "then give Host 127.0.0.1.<br><br>"
                      "On a network you trust, start the run with<br>&nbsp;&nbsp;"
                      "<code>--monitor-host 0.0.0.0</code> (or node 0's address)<br>"
                      "and give node 0's address as Host.")
        hint.setWordWrap(True)
        buttons = QDialogButtonBox(QDialogButtonBox.StandardButton.Ok
                                   | QDialogButtonBox.StandardButton.Cancel)
        buttons.accepted.connect(self.accept)
        buttons.rejected.connect(self.reject)
        self.buttons = buttons
        form = QFormLayout(self)
        form.addRow(hint)
        form.addRow("Host", self.host)
        form.addRow("Port", self.port)
        form.addRow("Token", self.token)
        form.addRow(self.error)
        form.addRow(buttons)

    def values(self) -> tuple[str, int, str]:
        """(host, port, token); ValueError naming the field when one is bad."""
        return parse_remote(self.host.text(), self.port.text(), self.token.text())

    def accept(self) -> None:
        fields = {"host": self.host, "port": self.port, "token": self.token}
        for field in fields.values():
            mark(field, False)
        try:
            self.values()
        except ValueError as e:
            self.error.setText(str(e))
            bad = fields.get(str(e).split(" ", 1)[0])
            if bad is not None:
                mark(bad, True)
            return
        self.error.setText("")
        super().accept()


def error_label(name: str) -> QLabel:
    """An empty, word-wrapped, red label named ``name``: where a bad value's reason goes."""
    label = QLabel("")
    label.setObjectName(name)
    label.setWordWrap(True)
    label.setStyleSheet("color: #d62728;")
    return label


def ask_about_active_run(parent: QWidget) -> str:
    """Ask, on closing the window, what becomes of the run it is watching: "stop", "leave"
    (it trains on in the background) or "cancel" (the window stays)."""
    box = QMessageBox(parent)
    box.setWindowTitle("A run is active")
    box.setText("A run is training. Stop it, or leave it running in the background?")
    stop = box.addButton("Stop the run", QMessageBox.ButtonRole.DestructiveRole)
    leave = box.addButton("Leave it running", QMessageBox.ButtonRole.AcceptRole)
    box.addButton(QMessageBox.StandardButton.Cancel)
    box.exec()
    clicked = box.clickedButton()
    return "stop" if clicked is stop else "leave" if clicked is leave else "cancel"


def tell(widget: QWidget, text: str) -> None:
    """Say ``text`` in the status line of ``widget``'s window (its QLabel "message"), if it
    has one: where a saved file went, say."""
    label = widget.window().findChild(QLabel, "message")
    if label is not None:
        label.setText(text)


def save_folder(widget: QWidget) -> Path:
    """Where a save dialog opens: the folder of the run ``widget``'s window shows, else its
    runs folder, else the working folder."""
    window = widget.window()
    for folder in (getattr(window, "viewing", None),
                   getattr(getattr(window, "runs", None), "runs_dir", None)):
        if isinstance(folder, Path) and folder.is_dir():
            return folder
    return Path.cwd()


def warn(parent: QWidget, title: str, text: str) -> QMessageBox:
    """A warning box, window-modal but not blocking (open, not exec): timers, the Runs panel
    and other runs' charts keep going while it is up. Returns it (tests read it)."""
    box = QMessageBox(QMessageBox.Icon.Warning, title, text, QMessageBox.StandardButton.Ok,
                      parent)
    box.open()
    return box


def dock(window: QMainWindow, title: str, widget: QWidget,
         area: Qt.DockWidgetArea) -> QDockWidget:
    """``widget`` in a fixed dock of ``window`` (not movable or floatable; it can be hidden,
    and its ``toggleViewAction`` shows it again: room for the charts in a small window)."""
    box = QDockWidget(title, window)
    box.setObjectName(f"{title.lower()}_dock")
    box.setWidget(widget)
    box.setFeatures(QDockWidget.DockWidgetFeature.DockWidgetClosable)
    window.addDockWidget(area, box)
    return box


def dock_toggle(box: QDockWidget, text: str, keys: str) -> QAction:
    """The action that shows and hides ``box`` (checked while shown), named ``text``."""
    toggle = box.toggleViewAction()
    toggle.setText(text)
    toggle.setShortcut(keys)
    toggle.setToolTip(f"Show or hide the {text.lower()}: more room for the charts in a small "
                      f"window ({keys})")
    return toggle


def action(parent: QWidget, text: str, shortcut: str | None,
           slot: Callable[[], object]) -> QAction:
    """A QAction with its shortcut, triggering ``slot``."""
    item = QAction(text, parent)
    if shortcut:
        item.setShortcut(QKeySequence(shortcut))
    item.triggered.connect(lambda _checked=False: slot())
    return item


class Presets:
    """The launch form's presets: ``menu``, Rankscope's own (choosing one loads it), and the
    ``buttons`` Load preset... and Save preset... (TOML files of the user's own). ``load`` and
    ``save`` take a path and do the work; what goes wrong there is said through ``say``."""

    def __init__(self, parent: QWidget, load: Callable[[str], None],
                 save: Callable[[str], None], say: Callable[[str], None]) -> None:
        self.parent, self.load, self.save, self.say = parent, load, save, say
        self.menu = QComboBox()
        self.menu.setObjectName("presets")
        self.menu.setToolTip("fill the form with one of Rankscope's presets (the runs folder "
                             "stays as it is)")
        # Sized by a short text, not the longest title (the popup shows the titles whole).
        self.menu.setSizeAdjustPolicy(
            QComboBox.SizeAdjustPolicy.AdjustToMinimumContentsLengthWithIcon)
        self.menu.setMinimumContentsLength(12)
        self.menu.addItem("Presets...")
        for preset in default_presets():
            self.menu.addItem(preset.title, str(preset.path))
        self.menu.activated.connect(self._chosen)
        self.save_button = QPushButton("Save preset...")
        self.load_button = QPushButton("Load preset...")
        self.buttons = QHBoxLayout()
        self.buttons.addWidget(self.load_button)
        self.buttons.addWidget(self.save_button)
        self.save_button.clicked.connect(self._save_dialog)
        self.load_button.clicked.connect(self._load_dialog)

    def _chosen(self, index: int) -> None:
        path = self.menu.itemData(index)
        self.menu.setCurrentIndex(0)  # a menu of presets, not a state of the form
        if path:
            self._load(path)

    def _load(self, path: str) -> None:
        try:
            self.load(path)
        except ConfigError as e:
            self.say(str(e))

    def _save_dialog(self) -> None:
        path, _ = QFileDialog.getSaveFileName(self.parent, "Save preset",
                                              str(save_folder(self.parent) / "run.toml"),
                                              "TOML (*.toml)")
        if path:
            try:
                self.save(path)
                tell(self.parent, f"preset saved to {path}")
            except (ConfigError, OSError) as e:
                self.say(f"not saved: {e}")

    def _load_dialog(self) -> None:
        path, _ = QFileDialog.getOpenFileName(self.parent, "Load preset",
                                              str(save_folder(self.parent)), "TOML (*.toml)")
        if path:
            self._load(path)
