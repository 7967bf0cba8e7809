"""The Logs tab: follows the launcher's log and each rank's (torchrun's per-rank stderr.log), one
at a time or all together, with a filter."""

from __future__ import annotations

from pathlib import Path

from PySide6.QtCore import QTimer
from PySide6.QtWidgets import (
    QComboBox,
    QHBoxLayout,
    QLabel,
    QLineEdit,
    QPlainTextEdit,
    QVBoxLayout,
    QWidget,
)

from ddp_engine.common.run_dir import rank_log_files

MAX_LINES = 5000
ALL = "all"
LAUNCHER = "launcher"
LAUNCHER_LOG = "launcher.log"


def log_files(run_dir: Path) -> dict[str, Path]:
    """Every log of a run by the name the view gives it: "launcher" (its progress lines,
    evaluations, checkpoints and how the run ended: what the app's launcher printed), then
    "rank N" for each rank."""
    found: dict[str, Path] = {}
    if (run_dir / LAUNCHER_LOG).is_file():
        found[LAUNCHER] = run_dir / LAUNCHER_LOG
    for rank, path in rank_log_files(run_dir).items():
        found[f"rank {rank}"] = path
    return found


class LogsView(QWidget):
    def __init__(self, poll_ms: int = 500) -> None:
        super().__init__()
        self.rank = QComboBox()
        self.rank.setObjectName("log_rank")
        self.rank.setToolTip("all: every log, line by line in the order they were read (as "
                             "written, to half a second), each named")
        self.filter = QLineEdit()
        self.filter.setObjectName("log_filter")
        self.filter.setPlaceholderText("filter (any case)")
        self.text = QPlainTextEdit()
        self.text.setObjectName("log_text")
        self.text.setReadOnly(True)
        self.text.setMaximumBlockCount(MAX_LINES)
        self.note = QLabel("")
        self.note.setObjectName("log_note")
        row = QHBoxLayout()
        row.addWidget(QLabel("log"))
        row.addWidget(self.rank)
        row.addWidget(self.filter, 1)
        row.addWidget(self.note)
        layout = QVBoxLayout(self)
        layout.addLayout(row)
        layout.addWidget(self.text)
        self.run_dir: Path | None = None
        self._lines: dict[str, list[str]] = {}
        self._all: list[str] = []
        self._offsets: dict[str, int] = {}
        self._partial: dict[str, str] = {}
        self.rank.currentIndexChanged.connect(lambda _i: self._render())
        self.filter.textChanged.connect(lambda _t: self._render())
        self.timer = QTimer(self)
        self.timer.timeout.connect(self.poll_once)
        self.timer.start(poll_ms)

    def follow(self, run_dir: Path | None) -> None:
        self.run_dir = run_dir
        self._lines.clear()
        self._all.clear()
        self._offsets.clear()
        self._partial.clear()
        self.rank.blockSignals(True)
        self.rank.clear()
        self.rank.addItem(ALL, ALL)
        self.rank.blockSignals(False)
        self.text.clear()
        self.note.setText("")

    def current(self) -> str:
        """The log shown: "all", "launcher" or "rank N"."""
        return str(self.rank.currentData() or ALL)

    def current_rank(self) -> int | None:
        shown = self.current()
        return int(shown.split()[1]) if shown.startswith("rank ") else None

    def show_log(self, name: str) -> None:
        """Show log ``name`` ("all", "launcher", "rank N") once it is there."""
        index = self.rank.findData(name)
        if index >= 0:
            self.rank.setCurrentIndex(index)

    def _matches(self, line: str) -> bool:
        needle = self.filter.text().strip().lower()
        return not needle or needle in line.lower()

    def poll_once(self) -> bool:
        """Read what the logs gained. Returns True when the shown log got new lines."""
        if self.run_dir is None:
            return False
        shown, changed = self.current(), False
        for name, path in log_files(self.run_dir).items():
            if self.rank.findData(name) < 0:
                self.rank.addItem(name, name)
            try:
                with open(path, "rb") as f:
                    f.seek(self._offsets.get(name, 0))
                    data = f.read(1 << 20)
            except OSError:
                continue
            if not data:
                continue
            self._offsets[name] = self._offsets.get(name, 0) + len(data)
            text = self._partial.get(name, "") + data.decode("utf-8", errors="replace")
            lines = text.split("\n")
            self._partial[name] = lines.pop()
            kept = self._lines.setdefault(name, [])
            kept.extend(lines)
            del kept[:-MAX_LINES]
            named = [f"[{name}] {line}" for line in lines]
            self._all.extend(named)
            del self._all[:-MAX_LINES]
            if shown in (name, ALL):
                for line in named if shown == ALL else lines:
                    if self._matches(line):
                        self.text.appendPlainText(line)
                changed = True
        if changed:
            self._say_if_nothing_matches()
        return changed

    def _render(self) -> None:
        shown = self.current()
        lines = self._all if shown == ALL else self._lines.get(shown, [])
        self.text.setPlainText("\n".join(line for line in lines if self._matches(line)))
        self._say_if_nothing_matches()

    def _say_if_nothing_matches(self) -> None:
        needle = self.filter.text().strip()
        shown = self.current()
        lines = self._all if shown == ALL else self._lines.get(shown, [])
        empty = needle and not any(self._matches(line) for line in lines)
        self.note.setText(f"no line of {'any log' if shown == ALL else shown} has "
                          f"{needle!r}" if empty else "")
