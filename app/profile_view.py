"""Profiles of a live run in the dashboard (issue 31): a "Profile N steps" button with its
step count for the top row, and a panel under the charts with the reading of the profile.

Every rank records the same steps with torch.profiler; rank 0 then reads the traces into
summary.json (:mod:`ddp_engine.common.profile_summary`). The asking and the waiting (up to a few
minutes: the next agreed round, the steps, the writing) run off the GUI thread in
:class:`ProfileTaker`; a run shown with profiles already taken shows its latest, read off the
GUI thread too (:class:`SummaryReader`: a summary.json missing is made from the traces).
"""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

from PySide6.QtCore import QObject, Qt, Signal
from PySide6.QtWidgets import (
    QHBoxLayout,
    QLabel,
    QPushButton,
    QSpinBox,
    QVBoxLayout,
    QWidget,
)

from app.profile_tables import SummaryView
from ddp_engine.common.profile_client import (
    ProfileError,
    ask_profile,
    follow_profile,
    read_summary,
)
from ddp_engine.common.profile_files import DEFAULT_STEPS, MAX_STEPS, profile_folders
from ddp_engine.common.protocol import Connection, ProtocolError

ASK_TIMEOUT_S = 10.0
"""How long rank 0 gets to accept the ask."""
FOLLOW_TIMEOUT_S = 300.0
"""How long the profile gets to be written once accepted (the next agreed round, the steps and
the reading of every rank's trace)."""
ENDED_TIP = "The run has ended: profiles are taken from a live run"
ASKING = "asking the ranks\u2026"
UNDER_WAY = "a profile of this run is under way\u2026"


def profile_tip(steps: int) -> str:
    return (f"Every rank of the run shown records the same {steps} "
            f"step{'s' if steps != 1 else ''} with torch.profiler, without stopping; the "
            "reading (where each step's time goes, the collectives, the last rank to arrive) "
            "appears under the charts, and the traces are saved in RUN_DIR/profiles/")


def button_text(steps: int) -> str:
    return f"Profile {steps} step{'s' if steps != 1 else ''}"


def recording_text(started: dict[str, Any]) -> str:
    """The status line once the ranks started recording (the ``started`` event)."""
    first, steps = started.get("first_step"), started.get("steps")
    if isinstance(first, int) and isinstance(steps, int):
        return f"recording steps {first}\u2013{first + steps - 1} on every rank\u2026"
    return "recording on every rank\u2026"


def run_of(folder: str | Path) -> Path:
    """The run folder of a profile folder (RUN_DIR/profiles/<name>)."""
    return Path(folder).parent.parent


class ProfileTaker(QObject):
    """Ask a run for a profile and follow it to its summary, on a daemon thread: ``started``
    (the run folder, the started event: its "folder", "first_step", "steps"), then ``done``
    (the run folder, the summary) or ``failed`` (the run folder, one line: why). Profiles of
    several runs may be under way at once, one thread each."""

    started = Signal(object, object)  # Path, dict
    done = Signal(object, object)  # Path, dict: the summary
    failed = Signal(object, str)  # Path, why

    def start(self, run_dir: Path, steps: int) -> None:
        threading.Thread(target=self._take, args=(run_dir, steps), daemon=True,
                         name="rankscope-profile").start()

    def _take(self, run_dir: Path, steps: int) -> None:
        try:
            with Connection(run_dir) as conn:
                asked = ask_profile(conn, steps, timeout_s=ASK_TIMEOUT_S)
                self.done.emit(run_dir, follow_profile(
                    conn, asked, FOLLOW_TIMEOUT_S,
                    on_started=lambda msg: self.started.emit(run_dir, msg)))
        except (ProtocolError, ProfileError, ValueError, OSError, EOFError) as e:
            self.failed.emit(run_dir, _one_line(e))
        except Exception as e:  # the panel waits for an answer: it must get one
            self.failed.emit(run_dir, f"{type(e).__name__}: {_one_line(e)}")


class SummaryReader(QObject):
    """:func:`read_summary` of a profile folder on a daemon thread (it reads every trace when
    summary.json is missing): ``done`` (the folder, the summary) or ``failed`` (the folder,
    why)."""

    done = Signal(object, object)  # Path, dict: the summary
    failed = Signal(object, str)  # Path, why

    def start(self, folder: Path) -> None:
        threading.Thread(target=self._read, args=(folder,), daemon=True,
                         name="rankscope-profile-read").start()

    def _read(self, folder: Path) -> None:
        try:
            self.done.emit(folder, read_summary(folder))
        except Exception as e:  # a file another process wrote: any fault is shown
            self.failed.emit(folder, f"{type(e).__name__}: {_one_line(e)}")


def _one_line(e: BaseException) -> str:
    return " ".join(str(e).split()) or type(e).__name__


class ProfilePanel(QWidget):
    """The profile of the run shown, hidden until there is one to show or one is being taken.

    ``controls`` (the step count ``steps`` and ``button``) go in the dashboard's top row;
    ``view`` shows the summary; ``status`` says what is under way or what went wrong.
    """

    shown = Signal(object)
    """The summary just shown (a dict)."""

    def __init__(self) -> None:
        super().__init__()
        self.steps = QSpinBox()
        self.steps.setObjectName("profile_steps")
        self.steps.setRange(1, MAX_STEPS)
        self.steps.setValue(DEFAULT_STEPS)
        self.steps.setToolTip(f"How many steps to profile (1 to {MAX_STEPS}; a trace grows "
                              "with every step)")
        self.button = QPushButton(button_text(DEFAULT_STEPS))
        self.button.setObjectName("profile_button")
        self.button.clicked.connect(self.take)
        self.steps.valueChanged.connect(self._steps_changed)
        self.controls = QWidget()
        row = QHBoxLayout(self.controls)
        row.setContentsMargins(0, 0, 0, 0)
        row.setSpacing(2)
        row.addWidget(self.steps)
        row.addWidget(self.button)
        self.status = QLabel("")
        self.status.setObjectName("profile_status")
        self.status.setWordWrap(True)
        self.status.setTextInteractionFlags(Qt.TextInteractionFlag.TextSelectableByMouse)
        self.status.hide()
        self.view = SummaryView()
        self.view.hide()
        hide = QPushButton("Hide")
        hide.setToolTip("Hide the profile (Profile shows it again)")
        hide.clicked.connect(self.hide)
        self.view.footer.addWidget(hide, 0, Qt.AlignmentFlag.AlignTop)
        layout = QVBoxLayout(self)
        layout.setContentsMargins(0, 0, 0, 0)
        layout.addWidget(self.status)
        layout.addWidget(self.view)
        self.hide()
        self.run_dir: Path | None = None
        self.ended = False
        self.busy: set[Path] = set()
        """The runs a profile is being taken of (one each; another run shown meanwhile can be
        profiled, and the one asked goes on in the background)."""
        self.summary: dict[str, Any] | None = None
        """The summary shown."""
        self.taker = ProfileTaker(self)
        self.taker.started.connect(self._started)
        self.taker.done.connect(self._taken)
        self.taker.failed.connect(self._failed)
        self.reader = SummaryReader(self)
        self.reader.done.connect(self._read)
        self.reader.failed.connect(self._read_failed)
        self._enable()

    def set_run(self, run_dir: Path | None) -> None:
        """The run shown (None: a remote run, whose folder is not on this machine). Its latest
        profile, if it has any, is read and shown."""
        if run_dir == self.run_dir:
            self._enable()
            return
        self.run_dir = run_dir
        self.summary = None
        self.view.hide()
        self._set_status("")
        self.hide()
        self._enable()
        if run_dir in self.busy:  # asked while it was shown: the answer comes here
            self._set_status(UNDER_WAY)
            self.show()
            return
        folders = profile_folders(run_dir) if run_dir is not None else []
        if folders:
            self._set_status(f"reading the profile in {folders[-1]}\u2026")
            self.show()
            self.reader.start(folders[-1])

    def refresh(self) -> None:
        """Read the run's latest profile again: one written meanwhile (asked from a
        terminal) replaces the one shown. Nothing while this panel takes one itself."""
        if self.run_dir is None or self.run_dir in self.busy:
            return
        folders = profile_folders(self.run_dir)
        if folders:
            self.summary = None
            self.reader.start(folders[-1])

    def set_ended(self, ended: bool) -> None:
        """Whether the run shown has ended (no profile can be taken then; the one shown
        stays)."""
        self.ended = ended
        self._enable()

    def take(self) -> bool:
        """Ask the run shown for a profile of ``steps`` steps (off the GUI thread); False if
        nothing was started (no local run, the run ended, or a profile of it under way)."""
        if self.run_dir is None or self.ended or self.run_dir in self.busy:
            return False
        self.busy.add(self.run_dir)
        self._enable()
        self._set_status(ASKING)
        self.show()
        self.taker.start(self.run_dir, self.steps.value())
        return True

    def show_summary(self, summary: dict[str, Any]) -> None:
        """Show ``summary`` (summary.json's schema) and the panel."""
        self.view.show_summary(summary)
        self.summary = summary
        self.view.show()
        if self.run_dir not in self.busy:
            self._set_status("")
        self.show()
        self.shown.emit(summary)

    def _enable(self) -> None:
        can = self.run_dir is not None and not self.ended and self.run_dir not in self.busy
        self.button.setEnabled(can)
        self.steps.setEnabled(can)
        if self.ended:
            self.button.setToolTip(ENDED_TIP)
        elif self.run_dir is None:
            self.button.setToolTip("Profiles are taken of a run started on this machine")
        elif self.run_dir in self.busy:
            self.button.setToolTip("A profile of this run is under way: its summary shows "
                                   "below the charts when every rank has written its trace")
        else:
            self.button.setToolTip(profile_tip(self.steps.value()))

    def _steps_changed(self, steps: int) -> None:
        self.button.setText(button_text(steps))
        self._enable()

    def _set_status(self, text: str) -> None:
        self.status.setText(text)
        self.status.setVisible(bool(text))

    def _started(self, run_dir: Path, msg: dict[str, Any]) -> None:
        if run_dir == self.run_dir:
            self._set_status(recording_text(msg))

    def _finished(self, run_dir: Path) -> bool:
        """The profile of ``run_dir`` is over; True if it is the run shown (another run's is
        read from its folder when that run is shown again)."""
        self.busy.discard(run_dir)
        self._enable()
        return run_dir == self.run_dir

    def _taken(self, run_dir: Path, summary: dict[str, Any]) -> None:
        if self._finished(run_dir):
            self._show_or_say(summary)

    def _failed(self, run_dir: Path, why: str) -> None:
        if self._finished(run_dir):
            self._set_status(f"Profile not taken: {why}")

    def _read(self, folder: Path, summary: dict[str, Any]) -> None:
        if run_of(folder) == self.run_dir and self.summary is None:
            self._show_or_say({**summary, "folder": str(folder)})  # where it is now

    def _read_failed(self, folder: Path, why: str) -> None:
        if (run_of(folder) == self.run_dir and self.summary is None
                and self.run_dir not in self.busy):
            self._set_status(f"The profile in {folder} could not be read: {why}")

    def _show_or_say(self, summary: dict[str, Any]) -> None:
        try:
            self.show_summary(summary)
        except (KeyError, TypeError, ValueError, AttributeError) as e:  # another schema
            self.view.hide()
            self._set_status(f"The profile in {summary.get('folder')} could not be shown: "
                             f"{type(e).__name__}: {_one_line(e)}")
