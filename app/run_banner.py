"""The dashboard's end-of-run banner: how the run shown ended (the state in words, the step,
the reason), where its checkpoint is, and what to do next: Resume, Open folder, Compare."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from PySide6.QtCore import Qt, QUrl, Signal
from PySide6.QtGui import QDesktopServices
from PySide6.QtWidgets import QFrame, QHBoxLayout, QLabel, QPushButton, QVBoxLayout

from app.run_model import reason_text, steps_text
from ddp_engine.common.run_dir import FINAL_STATES, read_status
from ddp_engine.common.runs import SCRIPT_DATASET, RunSummary

LOOKS = {"completed": ("#eaf4ea", "#2e7d32"), "stopped": ("#eef1f5", "#455a64"),
         "failed": ("#fdecea", "#b71c1c"), "interrupted": ("#fdecea", "#b71c1c"),
         "disconnected": ("#fff4e5", "#8a4b00")}
"""Background and text colour per state (others: the stopped look)."""

HEADLINES = {"completed": "Completed", "stopped": "Stopped", "failed": "Failed",
             "interrupted": "Interrupted", "disconnected": "Disconnected"}


def checkpoint_of(run_dir: Path) -> tuple[Path | None, int | None]:
    """The run's last checkpoint, as its status.json names it (else checkpoints/last.pt where
    it exists), and the step it was saved at (None: not known)."""
    status = read_status(run_dir) or {}
    named = status.get("checkpoint")
    step = status.get("checkpoint_step")
    path = Path(named) if isinstance(named, str) and named else run_dir / "checkpoints" / "last.pt"
    if not path.is_file():
        return None, None
    return path, step if isinstance(step, int) else None


def banner_text(summary: RunSummary) -> tuple[str, str]:
    """The headline ("Completed at step 600/600") and the detail lines under it: the reason
    (for a run that did not complete) and the checkpoint's path, or that there is none."""
    headline = HEADLINES.get(summary.state, summary.state.capitalize())
    if summary.step is not None:
        headline += " at " + steps_text(summary.step, summary.total_steps)
    lines = []
    if summary.reason and summary.state != "completed":
        lines.append(reason_text(summary.reason))
    ckpt, step = checkpoint_of(summary.path)
    if ckpt is not None:
        lines.append(f"Checkpoint{f' (step {step})' if step is not None else ''}: {ckpt}")
    elif summary.dataset == SCRIPT_DATASET:  # a script saves its own, where it chooses
        lines.append("Rankscope saves no checkpoint for a script; the script's own are "
                     "where it writes them.")
    else:
        lines.append("No checkpoint was saved.")
    return headline, "\n".join(lines)


class RunBanner(QFrame):
    """Hidden while no ended run is shown. :meth:`show_run` fills it from a run folder's
    summary; the buttons ask the window (signals) or the desktop (Open folder)."""

    resume_requested = Signal(object)  # Path
    compare_requested = Signal(object)  # list[Path]

    def __init__(self) -> None:
        super().__init__()
        self.setObjectName("run_banner")
        self.setFrameShape(QFrame.Shape.StyledPanel)
        self.headline = QLabel("")
        self.headline.setObjectName("banner_headline")
        self.detail = QLabel("")
        self.detail.setObjectName("banner_detail")
        self.detail.setWordWrap(True)
        self.detail.setTextInteractionFlags(Qt.TextInteractionFlag.TextSelectableByMouse)
        self.resume = QPushButton("Resume...")
        self.resume.setToolTip("Fill the launch form to continue this run from its last "
                               "checkpoint, in a new run folder")
        self.open_folder = QPushButton("Open folder")
        self.open_folder.setToolTip("Open the run's folder (checkpoints, logs, metrics) in "
                                    "the file manager")
        self.compare = QPushButton("Compare...")
        self.compare.setToolTip("Compare this run with the one before it in the runs folder")
        text = QVBoxLayout()
        text.setSpacing(2)
        text.addWidget(self.headline)
        text.addWidget(self.detail)
        row = QHBoxLayout(self)
        row.setContentsMargins(10, 6, 10, 6)
        row.addLayout(text, 1)
        for button in (self.resume, self.open_folder, self.compare):
            row.addWidget(button, 0, Qt.AlignmentFlag.AlignVCenter)
        self.open_url: Callable[[QUrl], object] = QDesktopServices.openUrl
        """How Open folder opens a folder (the desktop's file manager)."""
        self.run_dir: Path | None = None
        self.previous: Path | None = None  # the run Compare puts beside this one
        self.resume.clicked.connect(lambda: self.resume_requested.emit(self.run_dir))
        self.open_folder.clicked.connect(
            lambda: self.open_url(QUrl.fromLocalFile(str(self.run_dir))))
        self.compare.clicked.connect(
            lambda: self.compare_requested.emit([self.previous, self.run_dir]))
        self.hide()

    def show_run(self, summary: RunSummary, previous: Path | None = None) -> None:
        """Say how ``summary``'s run ended; ``previous``: the run Compare sets beside it."""
        self.run_dir, self.previous = summary.path, previous
        headline, detail = banner_text(summary)
        back, fore = LOOKS.get(summary.state, LOOKS["stopped"])
        self.setStyleSheet(f"QFrame#run_banner {{ background: {back}; border: 1px solid {fore};"
                           " border-radius: 3px; }")
        self.headline.setText(headline)
        self.headline.setStyleSheet(f"color: {fore}; font-weight: bold;")
        self.detail.setText(detail)
        self.resume.setEnabled(summary.resumable)
        self.resume.setToolTip(
            "Fill the launch form to continue this run from its last checkpoint, in a new run "
            "folder" if summary.resumable else "Nothing to resume: the run saved no checkpoint")
        self.compare.setEnabled(previous is not None)
        self.compare.setToolTip(f"Compare this run with {previous.name}" if previous else
                                "No other ended run in this runs folder to compare with")
        self.show()

    def clear(self) -> None:
        self.run_dir = self.previous = None
        self.hide()


def previous_run(run_dir: Path) -> Path | None:
    """The newest run in ``run_dir``'s runs folder that started before it and has ended (what
    Compare sets beside it), or None."""
    own = (read_status(run_dir) or {}).get("started")
    best: tuple[float, Path] | None = None
    try:
        siblings = [p for p in run_dir.parent.iterdir() if p.is_dir() and p != run_dir]
    except OSError:
        return None
    for path in siblings:
        status = read_status(path) or {}
        started = status.get("started")
        if status.get("state") not in FINAL_STATES or not isinstance(started, int | float):
            continue
        if isinstance(own, int | float) and started >= own:
            continue
        if best is None or started > best[0]:
            best = (float(started), path)
    return None if best is None else best[1]
