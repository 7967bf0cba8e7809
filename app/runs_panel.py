"""The Runs panel: every run folder under the runs folder, newest first, live runs marked.

The folder is rescanned on a worker thread (``RunsWatcher``) every ``interval_s``, so a runs
folder with many long runs never stalls the window; the table is updated in place, so the
selection survives a refresh.
"""

from __future__ import annotations

import shutil
import threading
import time
from pathlib import Path

from PySide6.QtCore import QObject, Signal
from PySide6.QtGui import QBrush, QColor, QFont
from PySide6.QtWidgets import (
    QAbstractItemView,
    QHBoxLayout,
    QLabel,
    QMessageBox,
    QPushButton,
    QTreeWidget,
    QTreeWidgetItem,
    QVBoxLayout,
    QWidget,
)

from app.run_model import plural, reason_text
from ddp_engine.common.runs import RunIndex, RunSummary, find, fmt_duration

COLUMNS = ("Name", "State", "Model", "Dataset", "Devices", "Steps", "Best loss", "Val loss",
           "Started", "Duration", "Resumed from")
STATE_COLORS = {"running": "#2ca02c", "starting": "#2ca02c", "stopping": "#ff7f0e",
                "completed": "#1f77b4", "stopped": "#555555", "failed": "#d62728",
                "interrupted": "#d62728"}


MESSAGE_S = 10.0


class RunsWatcher(QObject):
    """Rescans a runs folder every ``interval_s`` (or at once on :meth:`wake`) on a daemon
    thread; results arrive in the GUI thread as the ``scanned`` signal (a queued connection).

    A daemon thread rather than a QThread: the window may be destroyed without being closed
    (the process exiting), and a running QThread destroyed that way aborts the process.
    """

    scanned = Signal(object)  # list[RunSummary]
    failed = Signal(str)

    def __init__(self, runs_dir: Path, interval_s: float = 2.0) -> None:
        super().__init__()
        self.index = RunIndex(runs_dir)
        self.interval_s = interval_s
        self._stop = threading.Event()
        self._wake = threading.Event()
        self._thread = threading.Thread(target=self.run, name="rankscope-runs-watcher",
                                        daemon=True)

    def start(self) -> None:
        self._thread.start()

    def wait(self, timeout_ms: int) -> bool:
        self._thread.join(timeout_ms / 1000)
        return not self._thread.is_alive()

    def wake(self) -> None:
        self._wake.set()

    def request_stop(self) -> None:
        self._stop.set()
        self._wake.set()

    def run(self) -> None:
        while not self._stop.is_set():
            try:
                summaries, error = self.index.refresh(), None
            except Exception as e:  # noqa: BLE001 - a scan error must not end the watcher
                summaries, error = None, f"runs folder {self.index.runs_dir}: {e}"
            try:
                if error is None:
                    self.scanned.emit(summaries)
                else:
                    self.failed.emit(error)
            except RuntimeError:
                return  # the Qt side was deleted: the process is exiting
            self._wake.wait(0.05 if self.index.pending else self.interval_s)
            self._wake.clear()


def _cell_texts(s: RunSummary) -> list[str]:
    steps = "" if s.step is None else str(s.step)  # an ended script: the steps it took
    if s.step is not None and (s.total_steps or s.live):
        steps += f"/{s.total_steps or '?'}"
    if s.kind != "run":
        steps = f"{s.total_steps} per count" if s.total_steps else ""
    started = time.strftime("%Y-%m-%d %H:%M", time.localtime(s.started)) if s.started else ""
    state = s.state + (" (live)" if s.live else "")
    name = s.name if s.kind == "run" else f"{s.name} [scaling sweep]"
    return [name, state, s.model or "", s.dataset or "", s.devices, steps,
            "" if s.best_loss is None else f"{s.best_loss:.4g}",
            "" if s.val_loss is None else f"{s.val_loss:.4g}", started,
            fmt_duration(s.duration_s) if s.started else "",
            s.parent.name if s.parent else ""]


NAME_MAX_PX = 380
"""The widest the Name column fits itself to (the user may drag it wider)."""


class RunsPanel(QWidget):
    """Lists the runs; the window connects the ``*_requested`` signals to its actions."""

    open_requested = Signal(object)  # Path
    compare_requested = Signal(object)  # list[Path]
    resume_requested = Signal(object)  # Path
    export_requested = Signal(object, str)  # Path, "csv" | "tensorboard"
    deleted = Signal(object)  # list[Path]
    scanned = Signal(object)  # list[RunSummary], after the table was updated
    folder_chosen = Signal(object)  # Path: the user chose another runs folder (Folder...)

    def __init__(self, runs_dir: str | Path, interval_s: float = 2.0) -> None:
        super().__init__()
        self.summaries: list[RunSummary] = []
        self.scans = 0
        self._items: dict[Path, QTreeWidgetItem] = {}
        self.folder = QLabel("")
        self.folder.setObjectName("runs_folder")
        self.tree = QTreeWidget()
        self.tree.setObjectName("runs_tree")
        self.tree.setColumnCount(len(COLUMNS))
        self.tree.setHeaderLabels(list(COLUMNS))
        self.tree.setRootIsDecorated(True)
        self.tree.setUniformRowHeights(True)
        self.tree.setSelectionMode(QAbstractItemView.SelectionMode.ExtendedSelection)
        self.tree.header().setStretchLastSection(False)
        self.tree.setColumnWidth(0, 260)
        self._grown: set[int] = set()  # the columns whose text changed (refresh fits them)
        self.buttons: dict[str, QPushButton] = {}
        self.choose = QPushButton("Folder...")
        self.choose.setObjectName("runs_choose")
        self.choose.setToolTip("the runs folder: the runs listed here, and where new runs go")
        self.choose.clicked.connect(self.choose_folder)
        row = QHBoxLayout()
        row.addWidget(self.choose)
        row.addWidget(self.folder, 1)
        for key, text, tip in (
                ("open", "Open", "show the run's charts; a live run is attached, so Stop works"),
                ("compare", "Compare", "overlay the loss, validation loss and throughput of "
                 "the selected runs; their settings side by side, differences highlighted"),
                ("resume", "Resume...", "relaunch from the last checkpoint as a new run"),
                ("csv", "Export CSV...", "the run's metrics as CSV"),
                ("tensorboard", "Export TensorBoard", "event files in RUN/tensorboard"),
                ("delete", "Delete...", "delete the selected run folders (never a live run)")):
            b = QPushButton(text)
            b.setObjectName(f"runs_{key}")
            b.setToolTip(tip)
            self.buttons[key] = b
            row.addWidget(b)
        layout = QVBoxLayout(self)
        layout.setContentsMargins(2, 2, 2, 2)
        layout.addLayout(row)
        layout.addWidget(self.tree)
        self.buttons["open"].clicked.connect(self._open)
        self.buttons["compare"].clicked.connect(
            lambda: self.compare_requested.emit([s.path for s in self.selected()]))
        self.buttons["resume"].clicked.connect(
            lambda: self.resume_requested.emit(self.selected()[0].path))
        self.buttons["csv"].clicked.connect(
            lambda: self.export_requested.emit(self.selected()[0].path, "csv"))
        self.buttons["tensorboard"].clicked.connect(
            lambda: self.export_requested.emit(self.selected()[0].path, "tensorboard"))
        self.buttons["delete"].clicked.connect(self.confirm_delete)
        self.tree.itemSelectionChanged.connect(self._update_buttons)
        self.tree.itemDoubleClicked.connect(lambda *_: self._open())
        self.confirm_box: QMessageBox | None = None
        self.watcher: RunsWatcher | None = None
        self.interval_s = interval_s
        self.set_runs_dir(runs_dir)

    # ------------------------------------------------------------------------------ folder
    def choose_folder(self) -> None:
        from PySide6.QtWidgets import QFileDialog

        chosen = QFileDialog.getExistingDirectory(self, "Runs folder", str(self.runs_dir))
        if chosen:
            self.folder_chosen.emit(Path(chosen))

    def set_runs_dir(self, runs_dir: str | Path) -> None:
        """Watch another runs folder (the table empties until its first scan)."""
        runs_dir = Path(runs_dir).resolve()
        if self.watcher is not None and self.watcher.index.runs_dir == runs_dir:
            return
        self.stop_watching()
        self.runs_dir = runs_dir
        self._folder_text = f"runs in {runs_dir}"
        self._message_until = 0.0
        self.folder.setText(self._folder_text)
        self.tree.clear()
        self._items.clear()
        self.summaries = []
        self.watcher = RunsWatcher(runs_dir, self.interval_s)
        self.watcher.scanned.connect(self.show_runs)
        self.watcher.failed.connect(self.folder.setText)
        self.watcher.start()
        self._update_buttons()

    def refresh(self) -> None:
        """Rescan now (after a start, a delete...)."""
        if self.watcher is not None:
            self.watcher.wake()

    def stop_watching(self) -> None:
        if self.watcher is not None:
            self.watcher.request_stop()
            self.watcher.wait(5000)
            self.watcher = None

    # ------------------------------------------------------------------------------ table
    def show_runs(self, summaries: list[RunSummary]) -> None:
        if self.watcher is None or (summaries and summaries[0].path.parent != self.runs_dir):
            return  # a late scan of the folder watched before
        self.summaries = summaries
        self.scans += 1
        if time.monotonic() > self._message_until:
            self.folder.setText(self._folder_text)
        wanted: set[Path] = set()
        for i, s in enumerate(summaries):
            self._update_item(s, None, i, wanted)
        for path in set(self._items) - wanted:
            item = self._items.pop(path)
            parent = item.parent()
            if parent is not None:
                parent.removeChild(item)
            else:
                self.tree.takeTopLevelItem(self.tree.indexOfTopLevelItem(item))
        self._fit_columns()
        self._update_buttons()
        self.scanned.emit(summaries)

    def _fit_columns(self) -> None:
        """Widen a column whose text grew past it (a live run's steps), and fit a new one's
        (a name wider than NAME_MAX_PX ends in an ellipsis; its tooltip is the whole path)."""
        for col in sorted(self._grown):
            before = self.tree.columnWidth(col)
            self.tree.resizeColumnToContents(col)
            fitted = self.tree.columnWidth(col)
            if col == 0:
                fitted = min(fitted, NAME_MAX_PX)
            self.tree.setColumnWidth(col, max(before, fitted) if col else fitted)
        self._grown.clear()

    def _update_item(self, s: RunSummary, parent: QTreeWidgetItem | None, index: int,
                     wanted: set[Path]) -> None:
        wanted.add(s.path)
        item = self._items.get(s.path)
        if item is None:
            item = QTreeWidgetItem()
            self._items[s.path] = item
            if parent is None:
                self.tree.insertTopLevelItem(index, item)
            else:
                parent.insertChild(index, item)
        elif parent is None and self.tree.indexOfTopLevelItem(item) != index:
            selected = item.isSelected()
            self.tree.takeTopLevelItem(self.tree.indexOfTopLevelItem(item))
            self.tree.insertTopLevelItem(index, item)
            item.setSelected(selected)
        for col, text in enumerate(_cell_texts(s)):
            if item.text(col) != text:
                item.setText(col, text)
                self._grown.add(col)
        item.setToolTip(0, str(s.path))
        item.setToolTip(1, reason_text(s.reason or ""))
        item.setForeground(1, QBrush(QColor(STATE_COLORS.get(s.state, "#000000"))))
        font = QFont(item.font(0))
        font.setBold(s.live)
        item.setFont(0, font)
        for i, child in enumerate(s.children):
            self._update_item(child, item, i, wanted)

    def item(self, path: Path) -> QTreeWidgetItem | None:
        return self._items.get(Path(path))

    def summary(self, path: Path) -> RunSummary | None:
        return find(self.summaries, Path(path))

    def select(self, paths: list[Path]) -> None:
        self.tree.clearSelection()
        for p in paths:
            item = self.item(p)
            if item is not None:
                item.setSelected(True)

    def selected(self) -> list[RunSummary]:
        by_item = {id(item): path for path, item in self._items.items()}
        out = []
        for item in self.tree.selectedItems():
            path = by_item.get(id(item))
            s = self.summary(path) if path is not None else None
            if s is not None:
                out.append(s)
        return out

    def _update_buttons(self) -> None:
        sel = self.selected()
        one = sel[0] if len(sel) == 1 else None
        runs = [s for s in sel if s.kind == "run"]
        self.buttons["open"].setEnabled(one is not None)
        self.buttons["compare"].setEnabled(len(runs) >= 2)
        self.buttons["resume"].setEnabled(one is not None and one.resumable)
        self.buttons["csv"].setEnabled(one is not None and one.kind == "run")
        self.buttons["tensorboard"].setEnabled(one is not None and one.kind == "run")
        self.buttons["delete"].setEnabled(bool(sel) and all(s.deletable for s in sel))

    def _open(self) -> None:
        sel = self.selected()
        if len(sel) == 1:
            self.open_requested.emit(sel[0].path)

    # ------------------------------------------------------------------------------ delete
    def confirm_delete(self) -> None:
        """Ask, then delete the selected runs (live ones are refused, checked again after the
        answer, since a run may have been resumed into meanwhile)."""
        sel = self.selected()
        if not sel:
            return
        live = [s.name for s in sel if not s.deletable]
        if live:
            self.message(f"not deleted: {', '.join(live)} is live (here or on another "
                         "machine); stop it first")
            return
        box = QMessageBox(QMessageBox.Icon.Warning, "Delete runs",
                          f"Delete {plural(len(sel), 'run folder')} and everything in "
                          f"{'it' if len(sel) == 1 else 'them'}?\n\n"
                          + "\n".join(str(s.path) for s in sel[:10])
                          + ("\n..." if len(sel) > 10 else ""),
                          QMessageBox.StandardButton.Yes | QMessageBox.StandardButton.Cancel,
                          self)
        box.setDefaultButton(QMessageBox.StandardButton.Cancel)
        paths = [s.path for s in sel]
        box.finished.connect(lambda result: self._delete(paths) if
                             result == QMessageBox.StandardButton.Yes else None)
        self.confirm_box = box
        box.open()

    def _delete(self, paths: list[Path]) -> None:
        index = RunIndex(self.runs_dir)
        done: list[Path] = []
        for path in paths:
            if not index.summarize_any(path).deletable:
                self.message(f"not deleted: {path.name} became live")
                continue
            try:
                shutil.rmtree(path)
                done.append(path)
            except OSError as e:
                self.message(f"could not delete {path}: {e}")
        if done:
            names = ", ".join(p.name for p in done)
            self.message(f"deleted {names}" if len(done) == 1
                         else f"deleted {len(done)} runs: {names}")
            self.deleted.emit(done)
        self.refresh()

    def message(self, text: str) -> None:
        """A line in the folder label for a while (scans then show the folder again)."""
        self.folder.setText(text)
        self._message_until = time.monotonic() + MESSAGE_S
