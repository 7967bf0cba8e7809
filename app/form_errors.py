"""How the launch form shows a bad value: in the form's own words ("Learning rate must be > 0",
not "lr must be"), once the field was edited (focus left it, or a choice was made) or Start
was pressed, never for a field the user has not touched yet; on the field alone (its editor's
background, by palette: a style sheet would spill into the field's file dialog and take the
spin boxes' arrows); and in a row under the field that comes and goes only when the focus
moves, so the form does not jump under the user's typing."""

from __future__ import annotations

import re

from PySide6.QtCore import QObject
from PySide6.QtGui import QColor, QPalette
from PySide6.QtWidgets import (
    QAbstractSpinBox,
    QApplication,
    QComboBox,
    QDialog,
    QFormLayout,
    QLabel,
    QLineEdit,
    QTableWidget,
    QWidget,
)

ERROR_BASE = "#ffe8e8"
"""An editor's background while its value is refused."""
EDITORS = (QLineEdit, QAbstractSpinBox, QComboBox, QTableWidget)
ALIASES = {"model_args": "model", "dataset_args": "dataset"}
"""ConfigError keys that belong to another field of the form."""


def editors(widget: QWidget) -> list[QWidget]:
    """The editors that make up a field: the widget itself if it is one, else those inside it
    (never inside a dialog it opened)."""
    if isinstance(widget, EDITORS):
        return [widget]
    return [w for w in widget.findChildren(QWidget)
            if isinstance(w, EDITORS) and not isinstance(w.window(), QDialog)
            and not isinstance(w.parentWidget(), QAbstractSpinBox | QComboBox)]


def mark(widget: QWidget, bad: bool) -> None:
    """Colour the field's editors (or give them back the application's colours)."""
    if bool(widget.property("refused")) == bad:
        return
    widget.setProperty("refused", bad)
    for editor in editors(widget):
        if bad:
            palette = QPalette(editor.palette())
            for role in (QPalette.ColorRole.Base, QPalette.ColorRole.Button):
                palette.setColor(role, QColor(ERROR_BASE))
            editor.setPalette(palette)
        else:
            editor.setPalette(QApplication.palette(editor))


def refused(widget: QWidget) -> bool:
    """Whether the field is shown as holding a refused value (tests)."""
    return bool(widget.property("refused"))


def leading_key(message: str) -> str:
    """The config key a ConfigError message starts with ("" where it starts otherwise)."""
    m = re.match(r"^([a-z_]+)", message)
    return m.group(1) if m else ""


def field_of(message: str, fields: dict[str, QWidget]) -> str | None:
    """The field a ConfigError message is about: messages start with the field's key."""
    key = leading_key(message)
    key = ALIASES.get(key, key)
    return key if key in fields else None


class FormErrors(QObject):
    """The display of the form's one current error. ``fields``: key -> widget; ``labels``:
    key -> the label the form shows for it; ``row``: the label put under the bad field;
    ``line``: the form's bottom line, for an error of no field the form shows."""

    def __init__(self, parent: QWidget, forms: list[QFormLayout], fields: dict[str, QWidget],
                 labels: dict[str, str], row: QLabel, line: QLabel) -> None:
        super().__init__(parent)  # its focus slot goes with the form
        self.forms, self.fields, self.labels, self.row, self.line = (
            forms, fields, labels, row, line)
        self.tips = {key: w.toolTip() for key, w in fields.items()}
        self.touched: set[str] = set()
        """Fields edited and left (or chosen): their errors are shown."""
        self.dirty: set[str] = set()
        """Fields the user changed (typing, maybe not finished)."""
        self.revealed = False
        """Start was pressed: every error is shown, touched or not."""
        self._row_in: QFormLayout | None = None
        self._row_for: str | None = None
        self.key: str | None = None
        self.message = ""
        app = QApplication.instance()
        if isinstance(app, QApplication):
            app.focusChanged.connect(self._focus_moved)

    def words(self, message: str) -> str:
        """``message`` with its leading key in the form's words ("lr must be" -> "Learning
        rate must be", "script_cwd: ..." -> "Working folder: ...")."""
        key = leading_key(message)
        label = self.labels.get(key) or self.labels.get(ALIASES.get(key, key))
        return label + message[len(key):] if label else message

    def edited(self) -> None:
        """A value changed: the field holding the focus is the one the user edits (none: the
        form was filled by a preset, a resume or a switch of source). A choice (a combo, a
        check box, the device table) is a finished edit; typing finishes when focus leaves."""
        focus = QApplication.focusWidget()
        key = self._key_of(focus)
        if key is None or focus is None:
            return
        self.dirty.add(key)
        if not isinstance(focus, QLineEdit | QAbstractSpinBox):  # (an editable combo's focus
            self.touched.add(key)                              # is its line edit: typing)

    def reveal(self) -> None:
        """Start was pressed: show the error whatever was touched."""
        self.revealed = True
        self.show(self.key, self.message, settle=True)

    def visible(self, key: str | None) -> bool:
        return bool(self.message) and (key is None or key in self.touched or self.revealed)

    def show(self, key: str | None, message: str, settle: bool = False) -> str:
        """Make ``message`` (about field ``key``; "" for none) the current error; returns
        what the user is shown of it ("" when the field is untouched). The row under a field
        moves only when ``settle`` (the focus moved, or Start was pressed)."""
        self.key, self.message = key, message
        shown = self.visible(key)
        text = self.words(message) if shown else ""
        for k, widget in self.fields.items():
            bad = shown and k == key
            mark(widget, bad)
            widget.setToolTip(text if bad else self.tips.get(k, ""))
        in_row = shown and key is not None and self._form_of(self.fields[key]) is not None
        self.line.setText(text if shown and not in_row else "")
        self.line.setVisible(bool(self.line.text()))
        if settle or (in_row and self._row_for is None):  # a new row: the user just left a
            self._place(key if in_row else None)          # field or pressed Start
        self.row.setText(text if in_row and self._row_for == key else "")
        return text

    def _form_of(self, field: QWidget) -> QFormLayout | None:
        for form in self.forms:
            if form.getWidgetPosition(field)[0] >= 0:
                return form
        return None

    def _place(self, key: str | None) -> None:
        """The row under ``key``'s field (None: no row)."""
        if key == self._row_for:
            return
        if self._row_in is not None:
            self._row_in.takeRow(self.row)
            self._row_in = self._row_for = None
        self.row.hide()
        if key is None:
            return
        field = self.fields[key]
        form = self._form_of(field)
        if form is not None:
            form.insertRow(form.getWidgetPosition(field)[0] + 1, self.row)
            self.row.show()
            self._row_in, self._row_for = form, key

    def _key_of(self, widget: QWidget | None) -> str | None:
        for key, field in self.fields.items():
            if widget is not None and (widget is field or field.isAncestorOf(widget)):
                return key
        return None

    def _focus_moved(self, old: QWidget | None, _new: QWidget | None) -> None:
        """Leaving a field the user changed finishes its edit; the row under a field moves
        only now, when the user's eyes leave the field."""
        key = self._key_of(old)
        if key is None:
            return
        if key in self.dirty:
            self.touched.add(key)
        self.show(self.key, self.message, settle=True)
