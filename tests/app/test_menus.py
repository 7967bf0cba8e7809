"""The menu bar (Run, View, Tools, Help): every action with its shortcut, the shortcut named in
its tooltip, the keys doing what the menu says, Help's documents and About's versions, and a
keyboard path through the dashboard's controls."""

from __future__ import annotations

import sys
from pathlib import Path

from PySide6.QtCore import Qt, QUrl
from PySide6.QtGui import QKeySequence
from PySide6.QtWidgets import QApplication, QCheckBox, QSlider, QToolBar, QWidget

from app.main_window import MainWindow
from app.menus import GUIDE, REFERENCE, versions
from tests.conftest import make_run_folder


def _menu_actions(window: MainWindow) -> dict[str, list]:
    return {menu.title().replace("&", ""): [a for a in menu.actions() if not a.isSeparator()]
            for menu in window.menus.menus()}


def test_every_action_is_in_a_menu_with_a_unique_shortcut_named_in_its_tooltip(
        window: MainWindow) -> None:
    menus = _menu_actions(window)
    assert list(menus) == ["Run", "View", "Tools", "Help"]
    assert [a.text() for a in menus["Run"]] == [
        "Start", "Stop", "Attach to remote rank 0...", "Scaling sweep", "Quit"]
    assert [a.text() for a in menus["View"]] == [
        "Dashboard", "Logs", "Scaling", "Launch panel", "Runs panel"]
    assert [a.text() for a in menus["Tools"]] == [
        "Check devices...", "Take stacks", "Profile steps", "Runs folder..."]
    assert [a.text() for a in menus["Help"]] == ["User guide", "Reference", "About Rankscope"]
    toolbar = window.findChild(QToolBar, "run_toolbar")
    in_menus = {a for actions in menus.values() for a in actions}
    buttons = {a for a in toolbar.actions() if not a.isSeparator()}
    assert buttons - in_menus == set()  # the toolbar's actions are the menus' own
    keys = {}
    for item in in_menus:
        key = item.shortcut().toString(QKeySequence.SequenceFormat.NativeText)
        if item.text() in ("Reference", "About Rankscope"):
            continue
        assert key, f"{item.text()} has no shortcut"
        assert key not in keys, f"{key} is both {keys[key]} and {item.text()}"
        keys[key] = item.text()
        assert item.toolTip().endswith(f"({key})"), (item.text(), item.toolTip())
        assert item.toolTip().split(" (")[0] != item.text()  # it says more than the label
    assert keys["F5"] == "Start" and keys["Shift+F5"] == "Stop"


def test_the_view_keys_switch_tabs_and_panels(qtbot, window: MainWindow) -> None:
    qtbot.waitExposed(window)
    window.activateWindow()
    _ = window.dashboard
    qtbot.keyClick(window, Qt.Key.Key_2, Qt.KeyboardModifier.AltModifier)
    assert window.tabs.currentWidget() is window.logs
    qtbot.keyClick(window, Qt.Key.Key_1, Qt.KeyboardModifier.AltModifier)
    assert window.tabs.currentWidget() is window.dashboard
    qtbot.keyClick(window, Qt.Key.Key_2, Qt.KeyboardModifier.ControlModifier)
    assert not window.runs_dock.isVisible()
    qtbot.keyClick(window, Qt.Key.Key_2, Qt.KeyboardModifier.ControlModifier)
    assert window.runs_dock.isVisible()


def test_f10_opens_the_menu_bar(qtbot, window: MainWindow) -> None:
    qtbot.waitExposed(window)
    window.activateWindow()
    qtbot.keyClick(window, Qt.Key.Key_F10)
    assert window.menuBar().activeAction() is window.menus.run.menuAction()


def test_help_opens_the_guide_and_reference_and_about_says_the_versions(
        qtbot, window: MainWindow) -> None:
    opened: list[QUrl] = []
    window.menus.open_url = lambda url: opened.append(url) or True  # not the desktop's viewer
    window.menus.guide.trigger()
    window.menus.reference.trigger()
    assert opened == [QUrl.fromLocalFile(str(GUIDE)), QUrl.fromLocalFile(str(REFERENCE))]
    assert GUIDE.is_file() and REFERENCE.is_file()
    window.menus.open_url = lambda url: False  # no viewer on this desktop: say where it is
    window.menus.guide.trigger()
    assert str(GUIDE) in window.message_label.text()
    box = window.menus.show_about()
    shown = dict(versions())
    assert shown["Python"] == ".".join(map(str, sys.version_info[:3]))
    assert shown["PyTorch (the runs')"] != "not installed"  # read from its metadata
    assert shown["PyTorch (the runs')"] in box.text() and "PySide6" in box.text()
    box.close()


def test_take_stacks_says_why_not_when_no_run_trains(window: MainWindow) -> None:
    window.menus.stacks.trigger()
    assert window.message_label.text() == "no stacks to take: no local run is training in view"


def test_tab_reaches_every_dashboard_control_and_skips_the_charts(
        qtbot, window: MainWindow, tmp_path: Path) -> None:
    run = make_run_folder(tmp_path / "runs", "seen")
    window.open_run(run)
    dash = window.dashboard
    dash.redraw(budget_s=None)
    dash.stacks.set_ended(False)  # as for a live run: Stacks can be pressed
    assert dash.stacks.button.isEnabled()
    qtbot.waitExposed(window)
    qtbot.waitUntil(lambda: dash.loss.toggles[1].isVisible())  # shown by the layout, queued
    window.panel.presets.setFocus()
    reached: list[QWidget] = []
    for _ in range(120):
        widget = QApplication.focusWidget()
        if widget in reached:
            break
        reached.append(widget)
        window.focusNextChild()
    assert dash.stacks.button in reached
    assert any(isinstance(w, QSlider) for w in reached)  # the smoothing
    boxes = {w.text() for w in reached if isinstance(w, QCheckBox)}
    assert {"log", "0", "1"} <= boxes  # the log axis and each rank's toggle
    assert not any(w in dash.charts for w in reached)  # nothing to do there by keys
    window.tabs.setCurrentWidget(window.logs)
    window.logs.filter.setFocus()
    names = []
    for _ in range(60):
        names.append(QApplication.focusWidget().objectName())
        window.focusNextChild()
    assert {"log_rank", "log_filter", "log_text"} <= set(names)


def test_the_launch_and_runs_panels_can_be_hidden_for_room_and_shown_again(
        window: MainWindow) -> None:
    """Issue 18 item 10: in a small window the charts get the room of the docks."""
    toolbar = window.findChild(QToolBar, "run_toolbar")
    toggles = {a.text(): a for a in toolbar.actions()}
    for text, box in (("Launch panel", window.launch_dock), ("Runs panel", window.runs_dock)):
        toggle = toggles[text]
        assert toggle.isEnabled() and toggle.isChecked() and box.isVisible()
        toggle.trigger()
        assert not box.isVisible() and not toggle.isChecked()
        toggle.trigger()
        assert box.isVisible()
    scroll = window.launch_dock.widget()
    assert scroll.horizontalScrollBarPolicy() == Qt.ScrollBarPolicy.ScrollBarAlwaysOff
