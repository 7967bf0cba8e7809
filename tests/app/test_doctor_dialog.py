"""Check devices...: the dialog runs the real ``python -m ddp_engine doctor`` (2 CPU processes,
gloo, under torchrun) as a child process, follows its progress, shows its results, keeps the
measurement, and ends every process of it on Cancel. The GPU options and a GPU report's tables
are checked against the simulated NVML (tests/simulated_nvml.py)."""

from __future__ import annotations

import argparse
import json
import os
import re
from pathlib import Path

import pytest
from PySide6.QtWidgets import QTableWidget, QTableWidgetItem

from app.devices import DevicePicker
from app.doctor_dialog import DoctorDialog, open_for
from app.doctor_report import error_line, outcome, parse_progress
from ddp_engine.common import inventory, processes
from ddp_engine.common.doctor_result import (
    DOCTOR_FILE,
    DoctorResult,
    SizeResult,
    bandwidths_gbs,
    load_doctor,
)
from ddp_engine.common.gpus import GpuInfo
from ddp_engine.common.inventory import GpuInventory, TorchBuild
from ddp_engine.launch.doctor import add_doctor_arguments, examine, report_dict
from tests.app.conftest import FREED, in_a_fresh_gui_process
from tests.conftest import processes_mentioning
from tests.simulated_nvml import SimulatedNvml, four_gpus, mig_gpu

RUN_MS = 120_000
"""A whole check: python and torch start-up, torchrun, the all-reduces (2 cores, shared)."""
CPU_SIZES = ["64 KiB", "256 KiB", "1 MiB", "4 MiB", "16 MiB"]


def cpu_dialog(qtbot, runs: Path, **kwargs) -> DoctorDialog:
    """A shown dialog for a machine without a GPU torch can use (this one)."""
    dialog = DoctorDialog(runs, inventory=GpuInventory(), **kwargs)
    qtbot.addWidget(dialog)
    dialog.show()
    return dialog


def cell(table: QTableWidget, row: int, column: int) -> QTableWidgetItem:
    item = table.item(row, column)
    assert item is not None, f"no cell at ({row}, {column})"
    return item


def measuring(dialog: DoctorDialog) -> bool:
    """Whether rank 0 has started all-reducing (stage 2 of 7: the first size)."""
    return dialog.progress.maximum() > 0 and dialog.progress.value() >= 2


# ------------------------------------------------------------------------- real checks
def test_a_check_shows_its_progress_and_sizes_and_keeps_the_bandwidth(qtbot,
                                                                       tmp_path: Path) -> None:
    runs = tmp_path / "runs"
    dialog = cpu_dialog(qtbot, runs, seconds=1)
    assert dialog.doctor_args()[-4:] == ["--device", "cpu", "--nproc", "2"]
    seen: list[tuple[int, int, str]] = []  # (stages done, of how many, the status line)
    dialog.progress.valueChanged.connect(lambda v: seen.append(
        (v, dialog.progress.maximum(), dialog.status.text())))
    with qtbot.waitSignal(dialog.kept, timeout=RUN_MS) as kept:
        dialog.start_button.click()
        assert dialog.running and dialog.close_button.text() == "Cancel"
        assert not dialog.start_button.isEnabled()
    assert kept.args == [runs.resolve() / DOCTOR_FILE]
    # Every stage was shown, in order: start, the 5 sizes, keeping.
    stages = [v for v, of, _ in seen if of == 7]
    assert stages == list(range(1, 8))
    texts = [text for _, _, text in seen]
    assert "all-reduce 64 KiB (1/5)..." in texts and "all-reduce 16 MiB (5/5)..." in texts
    assert dialog.progress.maximum() == 1 and dialog.progress.value() == 1  # done
    table = dialog.results.sizes
    assert [cell(table, r, 0).text() for r in range(table.rowCount())] == CPU_SIZES
    busbw = dialog.results.busbw_gbs()
    assert len(busbw) == 5 and all(b > 0 for b in busbw)
    kept_result = load_doctor(runs)
    assert kept_result is not None
    assert [s.busbw_gbs for s in kept_result.sizes] == busbw  # the table is what was kept
    assert dialog.verdict.text() == ("OK: this machine can train: 2 CPU processes "
                                     "all-reduced with gloo")
    assert dialog.status.text() == f"kept in {runs.resolve() / DOCTOR_FILE}"
    assert dialog.results.bandwidth.text().startswith(
        f"best bus bandwidth {cell(table, busbw.index(max(busbw)), 4).text()} ")
    assert dialog.results.isVisible() and not dialog.running
    assert (dialog.close_button.text(), dialog.start_button.isEnabled()) == ("Close", True)


def test_cancel_during_the_measurement_ends_every_process_and_keeps_nothing(
        qtbot, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TMPDIR", str(tmp_path))  # the doctor's temporary folder: in here
    runs = tmp_path / "runs"
    dialog = cpu_dialog(qtbot, runs, seconds=120)
    kept: list[Path] = []
    dialog.kept.connect(kept.append)
    assert dialog.start()
    qtbot.waitUntil(lambda: measuring(dialog), timeout=RUN_MS)
    assert dialog.process is not None
    tree = processes.tree(dialog.process.processId())
    assert len(tree) >= 4  # the doctor, torchrun's agent and the 2 ranks
    dialog.close_button.click()  # Cancel
    assert dialog.close_button.text() == "Kill"
    qtbot.waitUntil(lambda: not dialog.running, timeout=60_000)
    assert processes.alive(tree) == []
    assert processes_mentioning(str(tmp_path)) == []
    # SIGINT sufficed: the doctor ended its ranks and removed its temporary folder itself.
    assert not list(tmp_path.glob("rankscope-doctor-*"))
    assert not (runs / DOCTOR_FILE).exists() and kept == []
    assert dialog.last is not None and dialog.last.kind == "cancelled"
    assert dialog.verdict.text() == ("cancelled: the check's processes were ended; nothing "
                                     "was kept")
    assert dialog.isVisible() and not dialog.results.isVisible()  # Cancel leaves it open
    assert dialog.start_button.isEnabled()


def test_closing_the_dialog_during_a_check_ends_it_first(qtbot, tmp_path: Path) -> None:
    dialog = cpu_dialog(qtbot, tmp_path / "runs", seconds=120)
    assert dialog.start()
    qtbot.waitUntil(lambda: measuring(dialog), timeout=RUN_MS)
    assert dialog.process is not None
    tree = processes.tree(dialog.process.processId())
    assert not dialog.close()  # the window's close button: refused until the check has ended
    assert dialog.isVisible()
    qtbot.waitUntil(lambda: not dialog.isVisible(), timeout=60_000)
    assert processes.alive(tree) == [] and not dialog.running
    assert not (tmp_path / "runs" / DOCTOR_FILE).exists()


def test_the_app_quitting_during_a_check_ends_every_process_of_it(
        qtbot, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TMPDIR", str(tmp_path))
    dialog = cpu_dialog(qtbot, tmp_path / "runs", seconds=120)
    assert dialog.start()
    qtbot.waitUntil(lambda: measuring(dialog), timeout=RUN_MS)
    assert dialog.process is not None
    tree = processes.tree(dialog.process.processId())
    assert len(tree) >= 4
    dialog.end_now()  # what QApplication.aboutToQuit calls
    assert processes.alive(tree) == []
    assert processes_mentioning(str(tmp_path)) == []
    qtbot.waitUntil(lambda: not dialog.running, timeout=10_000)
    assert dialog.last is not None and dialog.last.kind == "error"


def test_bad_options_show_the_doctors_one_line_error(qtbot, tmp_path: Path) -> None:
    cores = os.cpu_count() or 1
    dialog = cpu_dialog(qtbot, tmp_path / "runs", cpu_processes=cores + 1)
    kept: list[Path] = []
    dialog.kept.connect(kept.append)
    assert dialog.start()
    qtbot.waitUntil(lambda: not dialog.running, timeout=RUN_MS)
    assert dialog.last is not None and dialog.last.kind == "error"
    assert dialog.verdict.text() == (f"error: nproc must be between 1 and the number of CPU "
                                     f"cores ({cores}), got {cores + 1}")
    assert not dialog.results.isVisible() and kept == []
    assert dialog.progress.maximum() == 1 and dialog.progress.value() == 0


def test_a_finished_check_in_a_dialog_nobody_holds_is_freed_without_a_crash(
        tmp_path: Path) -> None:
    """The dialog's process is deleted (deleteLater) before the dialog; when nothing else holds
    the dialog any more, the process must not be what held it (a lambda over the dialog on one
    of its signals did: the dialog was then destroyed inside its child's destructor, and the
    test process crashed with heap corruption in CI)."""
    done = in_a_fresh_gui_process(f"""
import os
from app.doctor_dialog import DoctorDialog
from ddp_engine.common.inventory import GpuInventory
dialog = DoctorDialog({str(tmp_path / "runs")!r}, inventory=GpuInventory(),
                      cpu_processes=(os.cpu_count() or 1) + 1)  # the doctor refuses: quick
dialog.show()
assert dialog.start()
while dialog.running:
    app.processEvents()
    dialog.process is not None and dialog.process.waitForFinished(100)
assert dialog.last.kind == "error", dialog.last
del dialog
{FREED}""", tmp_path)
    assert done.returncode == 0 and done.stdout.strip().endswith("freed"), done.stderr[-3000:]
    assert "deleted directly" not in done.stderr, done.stderr[-3000:]


# ------------------------------------------------------------------------- GPU machines
def gpus(n: int = 4) -> list[GpuInfo]:
    return [GpuInfo(i, "NVIDIA H200", f"GPU-{i}", f"00000000:{i + 1:02x}:00.0", 2**37)
            for i in range(n)]


def test_the_gpus_torch_can_use_are_options_and_become_gpus(qtbot, tmp_path: Path) -> None:
    mig = GpuInfo(4, "NVIDIA A100-SXM4-80GB", "GPU-4", "00000000:05:00.0", 2**36, mig=True)
    dialog = DoctorDialog(tmp_path, gpus=[0, 2], inventory=GpuInventory([*gpus(), mig]))
    qtbot.addWidget(dialog)
    assert sorted(dialog.gpu_boxes) == [0, 1, 2, 3]  # never the MIG GPU
    assert dialog.gpu_boxes[2].text() == "GPU 2 (NVIDIA H200)"
    assert [i for i, box in dialog.gpu_boxes.items() if box.isChecked()] == [0, 2]
    assert dialog.doctor_args()[-2:] == ["--gpus", "0,2"] and "--nproc" not in \
        dialog.doctor_args()
    for box in dialog.gpu_boxes.values():
        box.setChecked(False)
    assert not dialog.start() and not dialog.running
    assert dialog.verdict.text() == "gpus: choose at least one GPU"
    every = DoctorDialog(tmp_path, inventory=GpuInventory(gpus(2)))  # default: every GPU
    qtbot.addWidget(every)
    assert every.doctor_args()[-2:] == ["--gpus", "0,1"]


def test_gpus_torch_cannot_use_make_it_a_cpu_check_that_says_why(qtbot,
                                                                  tmp_path: Path) -> None:
    found = GpuInventory(gpus(2), problem="the installed torch 2.13.0+cpu is a CPU-only build")
    dialog = DoctorDialog(tmp_path, cpu_processes=3, inventory=found)
    qtbot.addWidget(dialog)
    assert dialog.gpu_boxes == {}
    assert "2 GPU(s) found, but the installed torch 2.13.0+cpu" in dialog.device_note.text()
    assert dialog.doctor_args()[-4:] == ["--device", "cpu", "--nproc", "3"]


def test_without_an_inventory_the_gpus_are_looked_up_off_the_gui_thread(
        qtbot, tmp_path: Path) -> None:
    dialog = DoctorDialog(tmp_path)
    qtbot.addWidget(dialog)
    qtbot.waitUntil(lambda: dialog.inventory is not None, timeout=30_000)
    assert dialog.start_button.isEnabled()


def test_the_window_opens_it_for_the_launch_forms_devices(qtbot, tmp_path: Path) -> None:
    picker = DevicePicker(gpus=[])  # no GPU: CPU processes
    qtbot.addWidget(picker)
    picker.count.setValue(1)
    calls: list[str] = []
    dialog = open_for(picker, tmp_path / "runs", picker, on_kept=lambda: calls.append("read"))
    assert dialog.isVisible() and dialog.parent() is picker
    dialog.kept.emit(tmp_path / "runs" / DOCTOR_FILE)
    assert calls == ["read"]
    assert dialog.inventory is picker.inventory  # no second NVML look-up
    assert dialog.doctor_args()[-4:] == ["--device", "cpu", "--nproc", "1"]
    assert dialog.runs_dir == (tmp_path / "runs").resolve()
    two = DevicePicker(inventory=GpuInventory(gpus(2)))
    qtbot.addWidget(two)
    two.set_gpus([1])
    assert open_for(two, tmp_path, two).doctor_args()[-2:] == ["--gpus", "1"]


def doctor_args(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    add_doctor_arguments(parser)
    return parser.parse_args(list(argv))


def test_a_gpu_report_shows_the_gpus_links_warnings_and_bandwidth(
        qtbot, tmp_path: Path, simulated_nvml: SimulatedNvml,
        monkeypatch: pytest.MonkeyPatch) -> None:
    """doctor's own JSON of a 4-GPU machine (one busy), as the dialog shows it."""
    simulated_nvml.gpus = [*four_gpus(), mig_gpu()]
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    monkeypatch.setattr(inventory, "installed_torch",
                        lambda: TorchBuild("2.13.0+cu124", "12.4"))
    report = examine(doctor_args("--gpus", "0,2", "--runs-dir", str(tmp_path)))
    sizes = [SizeResult(s, 20, t, *bandwidths_gbs(s, t, 2)) for s, t in ((2**20, 2e-4),
                                                                         (2**28, 3e-2))]
    report.result = DoctorResult(1.0, "cuda", "nccl", 2, [], sizes, link_allows_gbs=15.76)
    done = outcome(0, json.dumps(report_dict(report)), "progress 7/7 keeping the result\n",
                   cancelled=False)
    assert done.kind == "ok" and done.kept is None  # no doctor.json was written here
    dialog = DoctorDialog(tmp_path, inventory=GpuInventory())
    qtbot.addWidget(dialog)
    dialog.show_outcome(done)
    shown = dialog.results
    assert shown.sizes_title.text() == "All-reduce across 2 GPU(s) (0, 2), nccl"
    assert [cell(shown.sizes, r, 4).text() for r in range(2)] == ["5.24 GB/s", "8.95 GB/s"]
    rows = [[cell(shown.gpus, r, c).text() for c in range(5)]
            for r in range(shown.gpus.rowCount())]
    assert [row[0] for row in rows] == ["GPU 0", "GPU 1", "GPU 2", "GPU 3", "GPU 4"]
    assert rows[2][4].startswith("97% busy") and rows[4][4].endswith("MIG mode")
    assert [cell(shown.gpus, r, 1).font().bold() for r in range(5)] == [True, False, True,
                                                                      False, False]
    assert shown.links.rowCount() == 1 and cell(shown.links, 0, 0).text() == "GPU 0 - GPU 2"
    assert "GPU 2 (NVIDIA GeForce RTX 4090) is busy" in shown.warnings.text()
    assert "mixed GPU models" in shown.warnings.text()
    assert dialog.verdict.text().endswith("warning(s) below")
    assert "link allows ~15.8 GB/s per direction" in shown.bandwidth.text()
    versions = {cell(shown.versions, r, 0).text(): cell(shown.versions, r, 1).text()
                for r in range(shown.versions.rowCount())}
    assert versions["NVIDIA driver"] == "550.54.15 (CUDA up to 12.4)"
    report.result, report.reason = None, "the all-reduce across 2 GPUs did not finish"
    failed = outcome(1, json.dumps(report_dict(report)), "", cancelled=False)
    assert (failed.kind, failed.text) == ("cannot", "CANNOT TRAIN: the all-reduce across 2 "
                                                    "GPUs did not finish")
    dialog.show_outcome(failed)
    assert shown.sizes.isHidden() and "no measurement" in shown.sizes_title.text()


# ------------------------------------------------------------------------- the wording
def test_progress_and_error_lines() -> None:
    assert parse_progress("progress 3/7 all-reduce 1 MiB (2/5)\n") is not None
    assert parse_progress("progress 0/0 x") is None and parse_progress("error: x") is None
    assert error_line("progress 1/7 a\nerror: nproc must be ...\nprogress 2/7 b\n") == \
        "error: nproc must be ..."
    assert outcome(None, "", "Traceback\nKeyboardInterrupt\n", cancelled=False).text == \
        "doctor was killed: KeyboardInterrupt"
    assert re.match(r"doctor exited 0 without a report", outcome(0, "garbage", "",
                                                                 cancelled=False).text)
