"""The launch form's errors as a user meets them: nothing before a field is touched, the
form's own words, on the field alone (no style sheet spilling into its dialog or taking the
spin boxes' arrows), and a row under the field that moves only when the focus does."""

from __future__ import annotations

from PySide6.QtCore import Qt
from PySide6.QtGui import QPalette
from PySide6.QtWidgets import QApplication

from app.form_errors import ERROR_BASE, editors, refused
from app.launch_panel import LaunchPanel


def _shown_panel(qtbot) -> LaunchPanel:
    panel = LaunchPanel(gpus=[])
    qtbot.addWidget(panel)
    panel.resize(340, 900)
    panel.show()
    qtbot.waitExposed(panel)
    panel.activateWindow()
    qtbot.waitUntil(panel.isActiveWindow, timeout=5000)
    return panel


def _base(widget) -> str:
    return widget.palette().color(QPalette.ColorRole.Base).name()


def test_typing_a_bad_value_shows_it_when_the_field_is_left_in_the_forms_words(qtbot) -> None:
    panel = _shown_panel(qtbot)
    form = panel.lr.parentWidget().layout()
    rows_before = form.rowCount()
    panel.lr.setFocus()
    panel.lr.selectAll()
    qtbot.keyClicks(panel.lr, "-1")
    assert not panel.valid and panel.problem.startswith("lr must be a finite number > 0")
    # Mid-typing: nothing said yet, no row comes, the form does not move under the user.
    assert not refused(panel.lr) and form.rowCount() == rows_before
    qtbot.keyClick(panel.lr, Qt.Key.Key_Tab)  # the user leaves the field: now it is said
    assert QApplication.focusWidget() is not panel.lr
    assert refused(panel.lr) and _base(panel.lr) == ERROR_BASE
    assert panel.field_error.isVisible() and form.rowCount() == rows_before + 1
    assert panel.field_error.text().startswith("Learning rate must be a finite number > 0")
    assert "lr must" not in panel.field_error.text()
    assert panel.lr.styleSheet() == "" and panel.lr.toolTip().startswith("Learning rate")
    # Fixing it while typing: the colour goes at once, the row stays until the field is left.
    panel.lr.setFocus()
    panel.lr.selectAll()
    qtbot.keyClicks(panel.lr, "0.01")
    assert panel.valid and not refused(panel.lr) and _base(panel.lr) != ERROR_BASE
    assert form.rowCount() == rows_before + 1 and panel.field_error.text() == ""
    qtbot.keyClick(panel.lr, Qt.Key.Key_Tab)
    assert form.rowCount() == rows_before and not panel.field_error.isVisible()


def test_switching_to_your_script_says_nothing_until_start_is_pressed(qtbot) -> None:
    panel = _shown_panel(qtbot)
    panel.source.script.click()  # a choice; the script field is still untouched
    assert not panel.valid and panel.problem.startswith("script")
    assert not refused(panel.script) and not panel.field_error.isVisible()
    assert not panel.error.isVisible()
    panel.errors.reveal()  # Start pressed (the window calls this): now say it, at the field
    assert refused(panel.script) and panel.field_error.isVisible()
    assert panel.field_error.text().startswith("Script")


def test_the_error_colours_the_fields_editors_only(qtbot) -> None:
    panel = _shown_panel(qtbot)
    panel.source.script.click()
    panel.errors.reveal()
    field = panel.script
    assert [w.objectName() for w in editors(field)] == ["script_path"]
    assert _base(field.path) == ERROR_BASE
    assert _base(field.browse) != ERROR_BASE  # the "..." button keeps its look
    assert field.styleSheet() == field.path.styleSheet() == field.browse.styleSheet() == ""
    # A dialog the field opens is a window of its own: it inherits none of it.
    from PySide6.QtWidgets import QFileDialog

    dialog = QFileDialog(field)
    assert dialog.styleSheet() == "" and _base(dialog) != ERROR_BASE
    dialog.deleteLater()
    panel.source.builtin.click()
    panel.batch_size.setValue(0)
    panel.errors.reveal()
    assert refused(panel.batch_size) and panel.batch_size.styleSheet() == ""  # arrows stay
    assert panel.batch_size.buttonSymbols() == panel.batch_size.ButtonSymbols.UpDownArrows
