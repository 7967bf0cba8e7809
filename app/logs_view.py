"""The Logs tab: follows each rank's log file (torchrun's per-rank stderr.log), with a filter."""

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


class LogsView(QWidget):
    def __init__(self, poll_ms: int = 500) -> None:
        super().__init__()
        self.rank = QComboBox()
        self.rank.setObjectName("log_rank")
        self.filter = QLineEdit()
        self.filter.setObjectName("log_filter")
        self.filter.setPlaceholderText("filter (substring)")
        self.text = QPlainTextEdit()
        self.text.setObjectName("log_text")
        self.text.setReadOnly(True)
        self.text.setMaximumBlockCount(MAX_LINES)
        row = QHBoxLayout()
        row.addWidget(QLabel("rank"))
        row.addWidget(self.rank)
        row.addWidget(self.filter, 1)
        layout = QVBoxLayout(self)
        layout.addLayout(row)
        layout.addWidget(self.text)
        self.run_dir: Path | None = None
        self._lines: dict[int, list[str]] = {}
        self._offsets: dict[int, int] = {}
        self._partial: dict[int, str] = {}
        self.rank.currentIndexChanged.connect(lambda _i: self._render())
        self.filter.textChanged.connect(lambda _t: self._render())
        self.timer = QTimer(self)
        self.timer.timeout.connect(self.poll_once)
        self.timer.start(poll_ms)

    def follow(self, run_dir: Path | None) -> None:
        self.run_dir = run_dir
        self._lines.clear()
        self._offsets.clear()
        self._partial.clear()
        self.rank.clear()
        self.text.clear()

    def current_rank(self) -> int | None:
        data = self.rank.currentData()
        return int(data) if data is not None else None

    def poll_once(self) -> bool:
        """Read what the logs gained. Returns True when the shown rank got new lines."""
        if self.run_dir is None:
            return False
        shown_changed = False
        for rank, path in rank_log_files(self.run_dir).items():
            if self.rank.findData(rank) < 0:
                self.rank.addItem(f"rank {rank}", rank)
            try:
                with open(path, "rb") as f:
                    f.seek(self._offsets.get(rank, 0))
                    data = f.read(1 << 20)
            except OSError:
                continue
            if not data:
                continue
            self._offsets[rank] = self._offsets.get(rank, 0) + len(data)
            text = self._partial.get(rank, "") + data.decode("utf-8", errors="replace")
            lines = text.split("\n")
            self._partial[rank] = lines.pop()
            kept = self._lines.setdefault(rank, [])
            kept.extend(lines)
            del kept[:-MAX_LINES]
            if rank == self.current_rank():
                needle = self.filter.text()
                for line in lines:
                    if needle in line:
                        self.text.appendPlainText(line)
                shown_changed = True
        return shown_changed

    def _render(self) -> None:
        rank = self.current_rank()
        needle = self.filter.text()
        self.text.setPlainText("\n".join(
            line for line in self._lines.get(rank, []) if needle in line) if rank is not None
            else "")
