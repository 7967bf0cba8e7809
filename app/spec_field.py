"""Launch-form fields: a path typed or chosen (:class:`PathField`); a model, dataset or loss
(:class:`SpecField`): a built-in name, or a path or FILE.py:FUNC; what to train
(:class:`SourceSwitch`). The rows of a user's own script: :mod:`app.script_source`."""

from __future__ import annotations

from PySide6.QtCore import Signal
from PySide6.QtWidgets import (
    QButtonGroup,
    QComboBox,
    QFileDialog,
    QHBoxLayout,
    QLineEdit,
    QPushButton,
    QRadioButton,
    QVBoxLayout,
    QWidget,
)

CUSTOM = "Custom..."
BUILTIN, SCRIPT = "builtin", "script"
"""The form's sources of what to train: Rankscope's own loop, or the user's own script."""


class PathField(QWidget):
    """A path: typed in the line, or chosen with the "..." button beside it (a file, or a
    folder when ``folder``; a chosen ``.py`` file gets ``py_suffix`` appended)."""

    changed = Signal()

    def __init__(self, name: str, *, folder: bool = False, file_filter: str = "",
                 placeholder: str = "") -> None:
        super().__init__()
        self.setObjectName(name)
        self.folder = folder
        self.file_filter = file_filter
        self.py_suffix = ""
        self.path = QLineEdit()
        self.path.setObjectName(f"{name}_path")
        self.path.setPlaceholderText(placeholder)
        self.browse = QPushButton("...")
        self.browse.setObjectName(f"{name}_browse")
        self.browse.setFixedWidth(30)
        self.browse.setToolTip("choose a folder" if folder else "choose a file")
        row = QHBoxLayout(self)
        row.setContentsMargins(0, 0, 0, 0)
        row.addWidget(self.path, 1)
        row.addWidget(self.browse)
        self.path.textChanged.connect(lambda _t: self.changed.emit())
        self.browse.clicked.connect(self._pick)

    def _pick(self) -> None:
        start = self.path.text().strip()
        if self.folder:
            path = QFileDialog.getExistingDirectory(self, "Choose a folder", start)
        else:
            path, _ = QFileDialog.getOpenFileName(self, "Choose a file", start, self.file_filter)
        if path:
            self.path.setText(f"{path}{self.py_suffix}" if path.endswith(".py") else path)

    def value(self) -> str:
        return self.path.text().strip()


class SpecField(QWidget):
    """A combo of built-in names plus choices that need a path or FILE.py:FUNC."""

    changed = Signal()

    def __init__(self, name: str, choices: list[str], path_choices: dict[str, str]) -> None:
        super().__init__()
        self.setObjectName(name)
        self.path_choices = path_choices  # choice -> prefix ("text:", "" for plugins)
        self.combo = QComboBox()
        self.combo.setObjectName(f"{name}_combo")
        self.combo.addItems(choices)
        self.where = PathField(name)
        self.where.setObjectName(f"{name}_where")
        self.path = self.where.path
        self.browse = self.where.browse
        # The path on a line of its own under the combo: the field's whole width for it, in a
        # narrow form too (beside the combo it was a few characters wide).
        layout = QVBoxLayout(self)
        layout.setContentsMargins(0, 0, 0, 0)
        layout.setSpacing(2)
        layout.addWidget(self.combo)
        layout.addWidget(self.where)
        self.combo.currentTextChanged.connect(self._update)
        self.where.changed.connect(self.changed.emit)
        self._update()

    def _update(self) -> None:
        choice = self.combo.currentText()
        self.where.setVisible(choice in self.path_choices)
        self.where.folder = choice == "image folder..."
        self.where.py_suffix = ":build" if choice == CUSTOM else ""
        self.path.setPlaceholderText("FILE.py:FUNC or package.module:FUNC" if choice == CUSTOM
                                     else "path")
        self.changed.emit()

    def value(self) -> str:
        choice = self.combo.currentText()
        if choice in self.path_choices:
            return self.path_choices[choice] + self.path.text().strip()
        return choice

    def set_value(self, spec: str) -> None:
        if self.combo.findText(spec) >= 0 and spec not in self.path_choices:
            self.combo.setCurrentText(spec)
            return
        for choice, prefix in self.path_choices.items():
            if prefix and spec.startswith(prefix):
                self.combo.setCurrentText(choice)
                self.path.setText(spec[len(prefix):])
                return
        self.combo.setCurrentText(CUSTOM)
        self.path.setText(spec)


class SourceSwitch(QWidget):
    """What the form trains: Built-in (BUILTIN) or Your script (SCRIPT)."""

    changed = Signal()

    def __init__(self) -> None:
        super().__init__()
        self.setObjectName("source")
        self.builtin = QRadioButton("Built-in")
        self.builtin.setObjectName("source_builtin")
        self.builtin.setToolTip("Rankscope's own training loop: a model, data set and loss of "
                                "its lists, or plugins")
        self.script = QRadioButton("Your script")
        self.script.setObjectName("source_script")
        self.script.setToolTip("your own torchrun training script, run unchanged on every rank")
        self._group = QButtonGroup(self)
        row = QHBoxLayout(self)
        row.setContentsMargins(0, 0, 0, 0)
        for button in (self.builtin, self.script):
            self._group.addButton(button)
            row.addWidget(button)
        row.addStretch(1)
        self.builtin.setChecked(True)
        self.script.toggled.connect(lambda _on: self.changed.emit())

    def value(self) -> str:
        return SCRIPT if self.script.isChecked() else BUILTIN

    def set_value(self, source: str) -> None:
        (self.script if source == SCRIPT else self.builtin).setChecked(True)
