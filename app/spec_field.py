"""A launch-form field for a model, dataset or loss: a built-in name, or a path or FILE.py:FUNC."""

from __future__ import annotations

from PySide6.QtCore import Signal
from PySide6.QtWidgets import (
    QComboBox,
    QFileDialog,
    QHBoxLayout,
    QLineEdit,
    QPushButton,
    QVBoxLayout,
    QWidget,
)

CUSTOM = "Custom..."


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
        self.path = QLineEdit()
        self.path.setObjectName(f"{name}_path")
        self.browse = QPushButton("...")
        self.browse.setFixedWidth(30)
        # The path on a line of its own under the combo: the field's whole width for it, in a
        # narrow form too (beside the combo it was a few characters wide).
        layout = QVBoxLayout(self)
        layout.setContentsMargins(0, 0, 0, 0)
        layout.setSpacing(2)
        layout.addWidget(self.combo)
        row = QHBoxLayout()
        row.addWidget(self.path, 1)
        row.addWidget(self.browse)
        layout.addLayout(row)
        self.combo.currentTextChanged.connect(self._update)
        self.path.textChanged.connect(lambda _t: self.changed.emit())
        self.browse.clicked.connect(self._pick)
        self._update()

    def _update(self) -> None:
        choice = self.combo.currentText()
        needs_path = choice in self.path_choices
        self.path.setVisible(needs_path)
        self.browse.setVisible(needs_path)
        self.path.setPlaceholderText("FILE.py:FUNC or package.module:FUNC" if choice == CUSTOM
                                     else "path")
        self.changed.emit()

    def _pick(self) -> None:
        choice = self.combo.currentText()
        if choice == "image folder...":
            path = QFileDialog.getExistingDirectory(self, "Image folder")
        else:
            path, _ = QFileDialog.getOpenFileName(self, "Choose a file")
        if path:
            self.path.setText(f"{path}:build" if choice == CUSTOM and path.endswith(".py")
                              else path)

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
