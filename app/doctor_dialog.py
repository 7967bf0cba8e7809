"""Check devices...: ``python -m ddp_engine doctor`` in a dialog, with a progress bar and the
results as tables (the versions, the GPUs and their links, warnings with what to do, and the
all-reduce bandwidth of each message size).

The doctor runs as a child process (QProcess: the app never imports torch), with ``--json`` for
the report on stdout and ``--progress`` for a line per stage on stderr. It keeps a passing
measurement in ``<runs_dir>/doctor.json``; the dialog then emits :attr:`DoctorDialog.kept`, so
the dashboard can compare a run's sync bandwidth with it. Cancel ends every process of the check
in escalating steps (:class:`ddp_engine.common.processes.Escalation`): SIGINT to the doctor,
which ends its torchrun and ranks and removes its temporary folder, then SIGKILL to whatever of
it is still alive.
"""

from __future__ import annotations

import contextlib
import signal
import sys
import threading
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

import psutil
from PySide6.QtCore import (
    QCoreApplication,
    QObject,
    QProcess,
    QProcessEnvironment,
    Qt,
    QTimer,
    Signal,
)
from PySide6.QtGui import QCloseEvent
from PySide6.QtWidgets import (
    QCheckBox,
    QDialog,
    QDialogButtonBox,
    QGridLayout,
    QGroupBox,
    QHBoxLayout,
    QLabel,
    QProgressBar,
    QPushButton,
    QScrollArea,
    QSpinBox,
    QVBoxLayout,
    QWidget,
)

from app.doctor_report import Outcome, Progress, outcome, parse_progress
from app.doctor_tables import Results
from ddp_engine.common import processes
from ddp_engine.common.child_env import build_env
from ddp_engine.common.inventory import GpuInventory, gpu_inventory

if TYPE_CHECKING:
    from app.devices import DevicePicker

DEFAULT_SECONDS = 3.0
"""doctor's default: time spent all-reducing, all message sizes together."""
WATCH_MS = 200
"""How often the check's processes are looked up (for Cancel) while it runs."""
KILL_AFTER_S = 15.0
"""After Cancel: how long the doctor gets to end its torchrun and ranks (it allows them 5 s to
stop, then 5 s more after SIGKILL) before what is left of the check is killed."""
GPU_COLUMNS = 2
"""GPU check boxes per row."""
OK_STYLE, BAD_STYLE, QUIET_STYLE = "color: #1b7f3b;", "color: #b00020;", "color: gray;"


class _InventoryLookup(QObject):
    """:func:`gpu_inventory` on a daemon thread (NVML is never called on the GUI thread, and a
    wedged GPU must not hold up closing the dialog); the answer arrives as ``found``."""

    found = Signal(object)  # GpuInventory

    def start(self) -> None:
        threading.Thread(target=lambda: self.found.emit(gpu_inventory()), daemon=True,
                         name="rankscope-doctor-inventory").start()


class DoctorDialog(QDialog):
    """Runs doctor across the chosen GPUs, or ``--nproc`` CPU processes where there is no GPU
    torch can use, and shows what it found."""

    kept = Signal(object)
    """The doctor.json path, once a check passed and kept its measurement there."""

    def __init__(self, runs_dir: str | Path, gpus: list[int] | None = None,
                 cpu_processes: int = 2, inventory: GpuInventory | None = None,
                 seconds: float = DEFAULT_SECONDS, parent: QWidget | None = None) -> None:
        """``gpus``: the NVML indices checked at first (None: every usable GPU);
        ``cpu_processes``: the process count at first where there is no usable GPU;
        ``inventory``: the machine's GPUs (the launch panel's picker has them; None: looked up
        off the GUI thread); ``seconds``: doctor's ``--seconds``."""
        super().__init__(parent)
        self.setWindowTitle("Check devices")
        self.setSizeGripEnabled(True)
        self.runs_dir = Path(runs_dir).resolve()
        self.seconds = seconds
        self._wanted_gpus = gpus
        self.inventory: GpuInventory | None = None
        self.gpu_boxes: dict[int, QCheckBox] = {}
        self.process: QProcess | None = None
        self.last: Outcome | None = None
        self._stdout = self._stderr = ""
        self._seen: dict[int, psutil.Process] = {}
        self._escalation: processes.Escalation | None = None
        self._close_when_done = False

        self.options = QGroupBox("Devices")
        self.options_layout = QVBoxLayout(self.options)
        self.nproc = QSpinBox()
        self.nproc.setObjectName("doctor_nproc")
        self.nproc.setRange(1, 4096)  # doctor checks it against the cores and says so
        self.nproc.setValue(cpu_processes)
        self.device_note = QLabel("looking for GPUs...")
        self.device_note.setWordWrap(True)
        self.options_layout.addWidget(self.device_note)
        self.start_button = QPushButton("Start")
        self.start_button.setObjectName("doctor_start")
        self.start_button.setEnabled(False)
        self.start_button.clicked.connect(self.start)
        self.progress = QProgressBar()
        self.progress.setRange(0, 1)
        self.progress.setValue(0)
        self.status = QLabel(f"Start checks the versions and the GPUs, all-reduces for "
                             f"~{seconds:g} s and keeps the bus bandwidth in "
                             f"{self.runs_dir / 'doctor.json'}")
        self.status.setObjectName("doctor_status")
        self.status.setWordWrap(True)
        self.verdict = QLabel("")
        self.verdict.setObjectName("doctor_verdict")
        self.verdict.setWordWrap(True)
        self.verdict.setTextInteractionFlags(Qt.TextInteractionFlag.TextSelectableByMouse)
        self.verdict.hide()
        self.results = Results()
        self.results.hide()
        self.results_area = QScrollArea()
        self.results_area.setWidget(self.results)
        self.results_area.setWidgetResizable(True)
        self.results_area.hide()
        self.buttons = QDialogButtonBox()
        self.buttons.addButton(self.start_button, QDialogButtonBox.ButtonRole.ActionRole)
        self.close_button = self.buttons.addButton(QDialogButtonBox.StandardButton.Close)
        self.close_button.setObjectName("doctor_close")
        self.close_button.setAutoDefault(False)
        # Not the box's rejected signal: Cancel ends the check and leaves the dialog open.
        self.close_button.clicked.connect(self._close_clicked)
        layout = QVBoxLayout(self)
        layout.addWidget(self.options)
        layout.addWidget(self.progress)
        layout.addWidget(self.verdict)
        layout.addWidget(self.status)  # where the result is kept: under the verdict
        layout.addWidget(self.results_area, 1)
        layout.addStretch(0)
        layout.addWidget(self.buttons)
        self._watch = QTimer(self)
        self._watch.setInterval(WATCH_MS)
        self._watch.timeout.connect(self.poll_once)
        app = QCoreApplication.instance()
        if app is not None:  # leaving the app ends a check under way, never leaves it running
            app.aboutToQuit.connect(self.end_now)
        self.resize(720, 560)
        if inventory is not None:
            self._show_devices(inventory)
        else:
            self._lookup = _InventoryLookup()
            self._lookup.found.connect(self._show_devices)
            self._lookup.start()

    # ------------------------------------------------------------------------------ options
    def _show_devices(self, inventory: GpuInventory) -> None:
        """Check boxes for the GPUs torch can use, or the CPU process count."""
        self.inventory = inventory
        row = QHBoxLayout()
        if inventory.usable:
            self.device_note.setText("GPUs to all-reduce across (nccl), by NVML index as "
                                     "nvidia-smi numbers them:")
            grid = QGridLayout()
            for i, gpu in enumerate(inventory.usable):
                box = QCheckBox(gpu.label)
                box.setToolTip(f"UUID {gpu.uuid}\nPCI bus {gpu.pci_bus_id}")
                box.setChecked(self._wanted_gpus is None or gpu.index in self._wanted_gpus)
                self.gpu_boxes[gpu.index] = box
                grid.addWidget(box, i // GPU_COLUMNS, i % GPU_COLUMNS)
            self.options_layout.addLayout(grid)
        else:
            note = inventory.cpu_note()
            self.device_note.setText(f"No GPU torch can use ({note}): the check all-reduces "
                                     "across CPU processes with gloo." if note else
                                     "No NVIDIA GPU found: the check all-reduces across CPU "
                                     "processes with gloo.")
            row.addWidget(QLabel("CPU processes:"))
            row.addWidget(self.nproc)
        row.addStretch(1)
        self.options_layout.addLayout(row)
        self.start_button.setEnabled(not self.running)

    def doctor_args(self) -> list[str]:
        """The doctor's command line after ``python``, for the options shown.

        Raises:
            ValueError: no GPU is checked (naming the field).
        """
        args = ["-m", "ddp_engine", "doctor", "--json", "--progress", "--runs-dir",
                str(self.runs_dir), "--seconds", f"{self.seconds:g}"]
        if self.gpu_boxes:
            chosen = [i for i, box in self.gpu_boxes.items() if box.isChecked()]
            if not chosen:
                raise ValueError("gpus: choose at least one GPU")
            return [*args, "--gpus", ",".join(map(str, chosen))]
        return [*args, "--device", "cpu", "--nproc", str(self.nproc.value())]

    # ------------------------------------------------------------------------------ running
    @property
    def running(self) -> bool:
        """Whether a check (or the ending of a cancelled one) is under way."""
        return self.process is not None

    def start(self) -> bool:
        """Start a check with the options shown. False (and why, in the verdict line) when
        they are bad, or a check is under way."""
        if self.running or self.inventory is None:
            return False
        try:
            args = self.doctor_args()
        except ValueError as e:
            self._say_verdict(str(e), BAD_STYLE)
            return False
        self.verdict.hide()
        self.results.hide()
        self.results_area.hide()
        self.last = None
        self._stdout = self._stderr = ""
        self._seen.clear()
        self._escalation = None
        self.progress.setRange(0, 0)  # busy until the first progress line
        self.status.setText("checking versions and GPUs...")
        self.status.show()
        process = QProcess(self)
        env = QProcessEnvironment()
        for key, value in build_env().items():
            env.insert(key, value)
        process.setProcessEnvironment(env)
        process.readyReadStandardOutput.connect(self._read_stdout)
        process.readyReadStandardError.connect(self._read_stderr)
        # A method, not a lambda over self: a lambda kept by the process (deleted first) could be
        # the last reference to a parentless dialog, then destroyed inside its own child (a crash).
        process.finished.connect(self.poll_once)
        process.errorOccurred.connect(self._failed_to_start)
        self.process = process
        process.start(sys.executable, args)
        self._set_controls()
        self._watch.start()
        return True

    def _failed_to_start(self, error: QProcess.ProcessError) -> None:
        if error == QProcess.ProcessError.FailedToStart and self.process is not None:
            self._stderr += f"\nerror: cannot start {sys.executable}: " \
                            f"{self.process.errorString()}"
            self.poll_once()

    def _read_stdout(self) -> None:
        if self.process is not None:
            self._stdout += bytes(self.process.readAllStandardOutput().data()).decode(
                "utf-8", "replace")

    def _read_stderr(self) -> None:
        if self.process is None:
            return
        before = self._stderr.rfind("\n") + 1
        self._stderr += bytes(self.process.readAllStandardError().data()).decode(
            "utf-8", "replace")
        for line in self._stderr[before:].split("\n")[:-1]:  # whole lines only
            found = parse_progress(line)
            if found is not None:
                self._show_progress(found)

    def _show_progress(self, p: Progress) -> None:
        self.progress.setRange(0, p.stages)
        self.progress.setValue(p.done)
        if self._escalation is None:
            self.status.setText(f"{p.what}...")

    def poll_once(self) -> bool:
        """Finish when the doctor has ended; during a cancel, first note its processes, take
        the next step when its time has come, and finish only once every process of it has
        gone. Returns whether the check has finished (True) or is still under way."""
        process = self.process
        if process is None:
            return True
        if self._escalation is not None:
            self._note_processes()
            notice = self._escalation.poll_once()
            if notice:
                self.status.setText(notice)
        if process.state() != QProcess.ProcessState.NotRunning:
            return False
        if self._escalation is not None and processes.alive(self._seen.values()):
            return False
        self._finish(process)
        return True

    def _note_processes(self) -> None:
        """Remember the doctor's processes: its torchrun (in a session of its own) and the
        ranks, and any process they start, so that none is left when the doctor has gone."""
        pid = self.process.processId() if self.process is not None else 0
        found = processes.tree(pid) if pid else []
        found += [c for p in processes.alive(self._seen.values()) for c in _children(p)]
        for p in found:
            self._seen.setdefault(p.pid, p)

    def _finish(self, process: QProcess) -> None:
        self._watch.stop()
        self._read_stdout()
        self._read_stderr()
        normal = process.exitStatus() == QProcess.ExitStatus.NormalExit and \
            process.error() != QProcess.ProcessError.FailedToStart
        self.last = outcome(process.exitCode() if normal else None, self._stdout, self._stderr,
                            cancelled=self._escalation is not None)
        self.process = None
        process.deleteLater()
        self.show_outcome(self.last)
        self._set_controls()
        if self.last.kept is not None:
            self.kept.emit(self.last.kept)
        if self._close_when_done:
            super().reject()

    def show_outcome(self, done: Outcome) -> None:
        """The verdict in its colour, and the results of a check that reported."""
        style = {"ok": OK_STYLE, "cancelled": QUIET_STYLE}.get(done.kind, BAD_STYLE)
        self._say_verdict(done.text, style)
        if done.kind != "cannot" or self.progress.maximum() == 0:  # "cannot": where it stopped
            self.progress.setRange(0, 1)
            self.progress.setValue(1 if done.kind == "ok" else 0)
        self.status.setText(f"kept in {done.kept}" if done.kept else
                            "" if done.kind != "ok" else "not kept: see the warnings")
        self.status.setVisible(bool(self.status.text()))
        if done.view is not None:
            self.results.show_view(done.view)
            self.results.show()
            self.results_area.show()

    def _say_verdict(self, text: str, style: str) -> None:
        self.verdict.setText(text)
        self.verdict.setStyleSheet(f"font-weight: bold; {style}")
        self.verdict.show()

    def _set_controls(self) -> None:
        busy = self.running
        self.start_button.setEnabled(not busy and self.inventory is not None)
        self.options.setEnabled(not busy)
        self.close_button.setText("Close" if not busy else "Cancel" if self._escalation is None
                                  else "Kill")
        self.close_button.setToolTip("end the check's processes now (SIGKILL)"
                                     if busy and self._escalation is not None else "")

    # ------------------------------------------------------------------------------ stopping
    def cancel(self) -> None:
        """End the check under way and every process of it; nothing is kept. Returns at once:
        the dialog says "cancelled" when the last of its processes has gone."""
        if self.process is None or self._escalation is not None:
            return
        self._escalation = processes.Escalation([
            processes.Step(0.0, self._interrupt),
            processes.Step(KILL_AFTER_S, self._kill_all,
                           f"the check did not end within {KILL_AFTER_S:g} s of Cancel: its "
                           "processes were killed"),
        ])
        self.status.setText("cancelling: ending the check's processes...")
        self._set_controls()
        self._note_processes()  # before the first signal
        self._escalation.start()

    def _interrupt(self) -> None:
        """SIGINT, as Ctrl+C: the doctor ends its torchrun and ranks, and its temporary
        folder."""
        pid = self.process.processId() if self.process is not None else 0
        if pid and pid in self._seen:
            processes.send([self._seen[pid]], signal.SIGINT)

    def _kill_all(self) -> None:
        processes.kill(self._seen.values())

    def end_now(self, grace_s: float = 3.0) -> None:
        """End a check under way at once and wait for its processes (the app is quitting):
        SIGTERM, then SIGKILL after ``grace_s``."""
        process = self.process
        if process is None:
            return
        pid = process.processId()
        self._note_processes()
        processes.send(self._seen.values(), signal.SIGTERM)
        # The doctor is waited for by QProcess (a psutil wait would reap it behind its back).
        if not process.waitForFinished(int(grace_s * 1000)):
            process.kill()
            process.waitForFinished(int(grace_s * 1000))
        others = [p for p in self._seen.values() if p.pid != pid]
        processes.kill(processes.wait_gone(others, grace_s), wait_s=grace_s)

    def _close_clicked(self) -> None:
        """Close; while a check runs, Cancel (then Kill)."""
        if not self.running:
            self.reject()
        elif self._escalation is None:
            self.cancel()
        else:
            self._escalation.advance()

    def reject(self) -> None:
        """Close, Escape or the window's close button: while a check runs, cancel it and close
        once its processes have ended; again while they end (Kill): SIGKILL them now."""
        if not self.running:
            super().reject()
        elif self._escalation is None:
            self._close_when_done = True
            self.cancel()
        else:
            self._escalation.advance()

    def closeEvent(self, event: QCloseEvent) -> None:  # noqa: N802 (Qt's name)
        if self.running:
            self.reject()
            event.ignore()
            return
        super().closeEvent(event)


def open_for(parent: QWidget, runs_dir: str | Path, picker: DevicePicker,
             on_kept: Callable[[], object] | None = None) -> DoctorDialog:
    """Open (not modal-blocking) a dialog for the launch form's devices: its checked GPUs, or
    its CPU process count, and the runs folder the form launches into; ``on_kept`` is called
    each time a measurement is kept (the dashboard reads it again)."""
    dialog = DoctorDialog(runs_dir, gpus=picker.selected_gpus() if picker.has_gpus else None,
                          cpu_processes=picker.count.value(), inventory=picker.inventory,
                          parent=parent)
    if on_kept is not None:
        dialog.kept.connect(lambda _path: on_kept())
    dialog.open()
    return dialog


def _children(p: psutil.Process) -> list[psutil.Process]:
    with contextlib.suppress(psutil.Error):
        return list(p.children(recursive=True))
    return []
