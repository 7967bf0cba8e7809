"""The results of a device check (:class:`app.doctor_report.DoctorView`) as tables: the
all-reduce bandwidth of each message size first (what the check is for), then the warnings with
what to do, the GPUs, their links and the versions.

Each table is as tall as its rows and no wider than its columns' contents, and has no
vertical scroll bar of its own: the dialog scrolls the whole of it, so no row is ever hidden. A
table wider than a small window scrolls sideways by itself (its height then makes room for the
scroll bar), so the text around it still wraps at the window's width.
"""

from __future__ import annotations

import html

from PySide6.QtCore import QSize, Qt
from PySide6.QtGui import QResizeEvent
from PySide6.QtWidgets import (
    QAbstractItemView,
    QHBoxLayout,
    QHeaderView,
    QLabel,
    QTableWidget,
    QTableWidgetItem,
    QVBoxLayout,
    QWidget,
)

from app.doctor_report import (
    GPU_COLUMNS,
    LINK_COLUMNS,
    SIZE_COLUMNS,
    VERSION_COLUMNS,
    DoctorView,
)

BUSBW_ROLE = Qt.ItemDataRole.UserRole
"""The busbw cell's number (GB/s, unrounded), next to its text."""
WARNING_STYLE = "color: #8a5300;"


MIN_TABLE_WIDTH = 160


class FitTable(QTableWidget):
    """A read-only table sized to its contents (see the module docstring); the columns
    ``numbers`` are right-aligned."""

    def __init__(self, name: str, columns: list[str], numbers: tuple[int, ...] = ()) -> None:
        super().__init__(0, len(columns))
        self.setObjectName(name)
        self.numbers = numbers
        self.setHorizontalHeaderLabels(columns)
        self.verticalHeader().setVisible(False)
        self.setEditTriggers(QAbstractItemView.EditTrigger.NoEditTriggers)
        self.setSelectionMode(QAbstractItemView.SelectionMode.ContiguousSelection)
        self.setWordWrap(False)
        self.setVerticalScrollBarPolicy(Qt.ScrollBarPolicy.ScrollBarAlwaysOff)
        self.horizontalHeader().setSectionResizeMode(QHeaderView.ResizeMode.ResizeToContents)
        self.setMinimumWidth(MIN_TABLE_WIDTH)

    def fill(self, rows: list[list[str]], bold: frozenset[int] = frozenset()) -> None:
        """Show ``rows``, the rows ``bold`` in bold."""
        self.setRowCount(len(rows))
        for r, row in enumerate(rows):
            for c, text in enumerate(row):
                item = QTableWidgetItem(text)
                if c in self.numbers:
                    item.setTextAlignment(Qt.AlignmentFlag.AlignRight
                                          | Qt.AlignmentFlag.AlignVCenter)
                if r in bold:
                    font = item.font()
                    font.setBold(True)
                    item.setFont(font)
                self.setItem(r, c, item)
        self.resizeColumnsToContents()
        self.resizeRowsToContents()
        self.setMaximumWidth(self.content_width())
        self.updateGeometry()
        self._fit_height(self.width())

    def content_width(self) -> int:
        return 2 * self.frameWidth() + sum(self.columnWidth(c) for c in range(self.columnCount()))

    def sizeHint(self) -> QSize:  # noqa: N802 (Qt's name)
        return QSize(self.content_width(), self.height())

    def _fit_height(self, width: int) -> None:
        """As tall as the header and every row, and the sideways scroll bar when ``width``
        is too narrow for the columns."""
        bar = self.horizontalScrollBar().sizeHint().height() \
            if width < self.content_width() else 0
        self.setFixedHeight(2 * self.frameWidth() + self.horizontalHeader().sizeHint().height()
                            + sum(self.rowHeight(r) for r in range(self.rowCount())) + bar)

    def resizeEvent(self, event: QResizeEvent) -> None:  # noqa: N802 (Qt's name)
        super().resizeEvent(event)
        self._fit_height(self.width())  # a resize delivered late can carry an older size


def _title(text: str) -> QLabel:
    label = QLabel(text)
    font = label.font()
    font.setBold(True)
    label.setFont(font)
    label.setContentsMargins(0, 6, 0, 0)
    return label


def _note(name: str) -> QLabel:
    label = QLabel()
    label.setObjectName(name)
    label.setWordWrap(True)
    label.setTextInteractionFlags(Qt.TextInteractionFlag.TextSelectableByMouse)
    return label


class Results(QWidget):
    """The sections of a finished check; :meth:`show_view` fills them."""

    def __init__(self) -> None:
        super().__init__()
        self.sizes_title = _title("All-reduce")
        self.sizes = FitTable("doctor_sizes", SIZE_COLUMNS, numbers=(0, 1, 2, 3, 4))
        self.bandwidth = _note("doctor_bandwidth")
        self.warnings_title = _title("Warnings")
        self.warnings = _note("doctor_warnings")
        self.warnings.setTextFormat(Qt.TextFormat.RichText)
        self.gpus_title = _title("GPUs (NVML index, as nvidia-smi numbers them)")
        self.gpus = FitTable("doctor_gpus", GPU_COLUMNS)
        self.no_gpus = QLabel("none visible to NVML")
        self.links_title = _title("Links between the GPUs")
        self.links = FitTable("doctor_links", LINK_COLUMNS)
        self.versions = FitTable("doctor_versions", VERSION_COLUMNS)
        layout = QVBoxLayout(self)
        layout.setContentsMargins(4, 0, 4, 4)
        for w in (self.sizes_title, self.sizes, self.bandwidth, self.warnings_title,
                  self.warnings, self.gpus_title, self.gpus, self.no_gpus, self.links_title,
                  self.links, _title("Versions"), self.versions):
            if isinstance(w, FitTable):  # as wide as its columns, the rest of the row empty
                row = QHBoxLayout()
                row.addWidget(w)
                row.addStretch(1)
                layout.addLayout(row)
            else:
                layout.addWidget(w)
        layout.addStretch(1)

    def show_view(self, view: DoctorView) -> None:
        measured = bool(view.sizes)
        self.sizes_title.setText(view.title if measured else f"{view.title}: no measurement")
        self.sizes.fill(view.sizes)
        for r, busbw in enumerate(view.busbw_gbs):
            item = self.sizes.item(r, len(SIZE_COLUMNS) - 1)
            if item is not None:
                item.setData(BUSBW_ROLE, busbw)
        self.sizes.setVisible(measured)
        self.bandwidth.setText(view.bandwidth)
        self.bandwidth.setVisible(bool(view.bandwidth))
        self.warnings.setText("".join(
            f"<p style='{WARNING_STYLE}'>&#9888; {html.escape(w)}</p>" for w in view.warnings))
        self.warnings_title.setVisible(bool(view.warnings))
        self.warnings.setVisible(bool(view.warnings))
        measured_names = {f"GPU {i}" for i in view.measured_gpus}  # these stand out
        self.gpus.fill(view.gpus, frozenset(r for r, row in enumerate(view.gpus)
                                            if row[0] in measured_names))
        self.gpus.setVisible(bool(view.gpus))
        self.no_gpus.setVisible(not view.gpus)
        self.links.fill(view.links)
        self.links_title.setVisible(bool(view.links))
        self.links.setVisible(bool(view.links))
        self.versions.fill(view.versions)

    def busbw_gbs(self) -> list[float]:
        """The bus bandwidths the sizes table shows, as numbers."""
        out = []
        for r in range(self.sizes.rowCount()):
            item = self.sizes.item(r, len(SIZE_COLUMNS) - 1)
            out.append(float(item.data(BUSBW_ROLE)) if item is not None else 0.0)
        return out
