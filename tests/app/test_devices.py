"""The device picker against the simulated NVML (tests/simulated_nvml.py): the table, the live
readings read off the GUI thread, "first N idle", the CPU fallback and GPUs in MIG mode."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest
import shiboken6
from PySide6.QtCore import Qt
from PySide6.QtWidgets import QLabel, QTableWidgetItem, QWidget
from pytestqt.qtbot import QtBot

from app import devices
from app.devices import UNKNOWN, DevicePicker
from app.gpu_readings import idle_state
from ddp_engine.common.gpus import NO_READING, GpuReading
from ddp_engine.common.inventory import FIX_CPU_BUILD, GpuInventory, gpu_inventory
from tests.simulated_nvml import (
    CPU_BUILD,
    CUDA_BUILD,
    SimGpu,
    SimulatedNvml,
    four_gpus,
    mig_gpu,
    two_gpus,
)

CUDA_TORCH, CPU_TORCH = CUDA_BUILD, CPU_BUILD
WAIT_MS = 10_000
WATCHDOG_S = 15.0
"""A wedged GPU comes back after this long at the latest, so that a picker that waits on it
fails its test instead of hanging it."""

MakePicker = Callable[..., DevicePicker]


@pytest.fixture
def wedge() -> Iterator[Callable[[SimGpu], threading.Event]]:
    """``wedge(gpu)``: every NVML call on the simulated ``gpu`` blocks until the returned event
    is set, or until the watchdog sets it after WATCHDOG_S (so a picker that waits on NVML on
    the GUI thread fails its test rather than hanging it)."""
    wedged: list[tuple[threading.Event, threading.Timer]] = []

    def wedge(gpu: SimGpu) -> threading.Event:
        back = gpu.blocked = threading.Event()
        wedged.append((back, threading.Timer(WATCHDOG_S, back.set)))
        wedged[-1][1].start()
        return back

    yield wedge
    for back, watchdog in wedged:
        watchdog.cancel()
        back.set()


@pytest.fixture
def make_picker(qtbot: QtBot, simulated_nvml: SimulatedNvml) -> Iterator[MakePicker]:
    """``make_picker(**kwargs)``: a DevicePicker; at teardown each is closed, every wedged GPU
    released, and no reader thread may be left running."""
    pickers: list[DevicePicker] = []

    def make(**kwargs: Any) -> DevicePicker:
        picker = DevicePicker(**kwargs)
        qtbot.addWidget(picker)
        pickers.append(picker)
        return picker

    yield make
    for picker in pickers:
        picker.close()
    for gpu in simulated_nvml.gpus:
        if gpu.blocked is not None:
            gpu.blocked.set()
    for picker in pickers:
        if picker.reader is not None:
            qtbot.waitUntil(picker.reader.stopped, timeout=WAIT_MS)


def cuda_inventory(environ: dict[str, str] | None = None) -> GpuInventory:
    """The simulated NVML's GPUs, as a CUDA build of torch would see them (this machine's
    torch is the CPU build, with which the picker offers CPU processes)."""
    return gpu_inventory(environ={} if environ is None else environ, build=CUDA_TORCH)


def item(picker: DevicePicker, row: int, col: int) -> QTableWidgetItem:
    found = picker.table.item(row, col)
    assert found is not None
    return found


def label(picker: DevicePicker, name: str) -> str:
    found = picker.findChild(QLabel, name)
    assert found is not None, f"no label {name!r}"
    return found.text()


def cells(picker: DevicePicker, row: int) -> list[str]:
    return [item(picker, row, c).text() for c in range(1, 6)]


def wait_readings(qtbot: QtBot, picker: DevicePicker, rows: list[int]) -> None:
    """Until each of ``rows`` shows a utilization (a posted reading)."""
    qtbot.waitUntil(lambda: all(cells(picker, r)[3].endswith("%") for r in rows),
                    timeout=WAIT_MS)


def test_the_picker_lists_the_gpus_with_their_readings(qtbot: QtBot,
                                                       make_picker: MakePicker) -> None:
    picker = make_picker(inventory=cuda_inventory(), refresh_ms=60_000)
    wait_readings(qtbot, picker, [0, 1])
    rows = [cells(picker, r) for r in range(2)]
    assert rows == [["0", "NVIDIA H200", "1.0/141.0 GiB", "3%", "40 °C"],
                    ["1", "NVIDIA RTX A6000", "20.0/48.0 GiB", "97%", "71 °C"]]
    assert picker.config_values() == {"device": "cuda", "gpus": [0, 1], "nproc": None}


def test_changed_means_the_choice_changed_not_a_reading(
        qtbot: QtBot, make_picker: MakePicker, simulated_nvml: SimulatedNvml) -> None:
    """``changed`` revalidates the launch form: a check box, not a reading every second."""
    picker = make_picker(inventory=cuda_inventory(), refresh_ms=60_000)
    wait_readings(qtbot, picker, [0, 1])
    seen: list[None] = []
    picker.changed.connect(lambda: seen.append(None))
    simulated_nvml.gpus[0].util_pct = 50
    picker.refresh()
    qtbot.waitUntil(lambda: cells(picker, 0)[3] == "50%", timeout=WAIT_MS)
    assert seen == []
    with qtbot.waitSignal(picker.changed, timeout=WAIT_MS):
        item(picker, 1, 0).setCheckState(Qt.CheckState.Unchecked)
    assert picker.config_values()["gpus"] == [0]


def test_first_n_idle_skips_the_busy_gpu(qtbot: QtBot, make_picker: MakePicker,
                                         simulated_nvml: SimulatedNvml) -> None:
    picker = make_picker(inventory=cuda_inventory(), refresh_ms=60_000)
    wait_readings(qtbot, picker, [0, 1])
    picker.count.setValue(1)
    picker.pick_idle()
    assert picker.selected_gpus() == [0]
    assert picker.idle_note.isHidden()
    simulated_nvml.gpus[0].util_pct = 100  # now both are busy
    picker.refresh()
    qtbot.waitUntil(lambda: cells(picker, 0)[3] == "100%", timeout=WAIT_MS)
    picker.pick_idle()
    assert picker.selected_gpus() == []
    assert picker.idle_note.text() == "only 0 of the 1 GPUs asked for are idle; GPU 0, GPU 1 busy"
    assert not picker.idle_note.isHidden()


def test_a_wedged_gpu_never_blocks_the_window_and_reads_unknown(
        qtbot: QtBot, make_picker: MakePicker, simulated_nvml: SimulatedNvml,
        wedge: Callable[[SimGpu], threading.Event]) -> None:
    simulated_nvml.gpus = four_gpus()
    inventory = cuda_inventory()
    back = wedge(simulated_nvml.gpus[3])  # every NVML call on GPU 3 hangs
    start = time.monotonic()
    picker = make_picker(inventory=inventory, refresh_ms=100, timeout_ms=2000)
    picker.refresh()
    assert time.monotonic() - start < 5.0, "the GUI thread waited on the wedged GPU"
    wait_readings(qtbot, picker, [0, 1, 2])
    qtbot.waitUntil(lambda: cells(picker, 3)[2:] == [UNKNOWN] * 3, timeout=WAIT_MS)
    assert [cells(picker, r)[3] for r in range(3)] == ["0%", "0%", "97%"]  # still live
    picker.count.setValue(4)
    picker.pick_idle()
    assert picker.selected_gpus() == [0, 1]
    assert picker.idle_note.text() == ("only 2 of the 4 GPUs asked for are idle (checked: "
                                       "GPU 0, GPU 1); GPU 2 busy; GPU 3 unknown (no NVML "
                                       "reading)")
    back.set()  # the GPU comes back
    wait_readings(qtbot, picker, [3])
    picker.pick_idle()
    assert picker.selected_gpus() == [0, 1, 3]


def test_a_gpu_that_stops_answering_turns_unknown(
        qtbot: QtBot, make_picker: MakePicker, simulated_nvml: SimulatedNvml,
        wedge: Callable[[SimGpu], threading.Event]) -> None:
    picker = make_picker(inventory=cuda_inventory(), refresh_ms=100, timeout_ms=2000)
    wait_readings(qtbot, picker, [0, 1])
    wedge(simulated_nvml.gpus[0])
    qtbot.waitUntil(lambda: cells(picker, 0)[3] == UNKNOWN, timeout=WAIT_MS)
    assert picker.current(picker.gpus[0]) is None
    assert cells(picker, 1)[3] == "97%"
    picker.count.setValue(1)
    picker.pick_idle()
    assert picker.selected_gpus() == []  # GPU 0 was idle, but its reading is stale


def test_first_n_idle_never_picks_a_gpu_without_a_reading(qtbot: QtBot, make_picker: MakePicker,
                                                         simulated_nvml: SimulatedNvml) -> None:
    simulated_nvml.gpus = four_gpus()
    simulated_nvml.gpus[0].unsupported = {"utilization"}  # NVML answers, but not this
    simulated_nvml.gpus[1].unsupported = {"memory"}
    picker = make_picker(inventory=cuda_inventory(),
                         refresh_ms=60_000)
    wait_readings(qtbot, picker, [1, 2, 3])
    qtbot.waitUntil(lambda: cells(picker, 0)[2:4] == ["1.0/48.0 GiB", UNKNOWN], timeout=WAIT_MS)
    assert cells(picker, 1)[2] == UNKNOWN
    picker.count.setValue(3)
    picker.pick_idle()
    assert picker.selected_gpus() == [3]
    assert picker.idle_note.text() == ("only 1 of the 3 GPUs asked for is idle (checked: GPU "
                                       "3); GPU 2 busy; GPU 0, GPU 1 unknown (no NVML reading)")


def test_idle_needs_utilization_and_memory() -> None:
    gib = 2**30
    assert idle_state(None) == idle_state(NO_READING) == "unknown"
    assert idle_state(GpuReading(None, 0, 48 * gib, 40.0, None)) == "unknown"
    assert idle_state(GpuReading(0.0, None, None, 40.0, None)) == "unknown"
    assert idle_state(GpuReading(0.0, gib, 48 * gib, None, None)) == "idle"
    assert idle_state(GpuReading(50.0, gib, 48 * gib, None, None)) == "busy"
    assert idle_state(GpuReading(0.0, 20 * gib, 48 * gib, None, None)) == "busy"


def test_closing_the_picker_ends_its_reader_threads(qtbot: QtBot, make_picker: MakePicker,
                                                    simulated_nvml: SimulatedNvml) -> None:
    picker = make_picker(inventory=cuda_inventory(), refresh_ms=60_000)
    wait_readings(qtbot, picker, [0, 1])
    reader = picker.reader
    assert reader is not None and len(reader.alive()) == 2
    assert all(t.daemon for t in reader.threads)  # a wedged GPU never holds up the exit
    picker.close()
    qtbot.waitUntil(reader.stopped, timeout=WAIT_MS)
    assert simulated_nvml.initialised == 0  # each thread shut its NVML session down


def test_deleting_the_window_ends_the_reader_threads(qtbot: QtBot,
                                                     simulated_nvml: SimulatedNvml) -> None:
    """The picker inside a window that is deleted without being closed (closeEvent goes only to
    the window) still stops reading."""
    window = QWidget()
    picker = DevicePicker(inventory=cuda_inventory(), refresh_ms=60_000)
    picker.setParent(window)
    reader = picker.reader
    assert reader is not None
    wait_readings(qtbot, picker, [0, 1])
    shiboken6.delete(window)
    qtbot.waitUntil(reader.stopped, timeout=WAIT_MS)


def test_cpu_torch_with_nvml_gpus_shows_cpu_processes_and_the_fix(
        make_picker: MakePicker, simulated_nvml: SimulatedNvml) -> None:
    simulated_nvml.gpus = four_gpus()
    inventory = gpu_inventory(environ={}, build=CPU_TORCH)
    picker = make_picker(inventory=inventory)
    assert not picker.has_gpus and picker.gpus == [] and picker.reader is None
    assert picker.inventory is inventory and len(inventory.gpus) == 4
    note = label(picker, "no_gpu_note")
    assert "4 GPU(s) found" in note and "2.13.0+cpu" in note and FIX_CPU_BUILD in note
    assert picker.table.isHidden()
    assert picker.config_values() == {"device": "cpu", "gpus": None,
                                      "nproc": min(2, picker.cpus)}


def test_a_mig_gpu_is_listed_but_never_chosen(qtbot: QtBot, make_picker: MakePicker,
                                              simulated_nvml: SimulatedNvml) -> None:
    simulated_nvml.gpus = [two_gpus()[0], mig_gpu()]
    picker = make_picker(inventory=cuda_inventory(),
                         refresh_ms=60_000)
    assert [g.index for g in picker.gpus] == [0] and picker.table.rowCount() == 2
    assert cells(picker, 1)[:2] == ["1", "NVIDIA A100-SXM4-80GB"]
    check = item(picker, 1, 0)
    assert check.checkState() == Qt.CheckState.Unchecked
    assert not check.flags() & (Qt.ItemFlag.ItemIsUserCheckable | Qt.ItemFlag.ItemIsEnabled)
    assert "MIG mode" in check.toolTip() and "nvidia-smi -i 1 -mig 0" in check.toolTip()
    assert "MIG mode" in label(picker, "mig_note")
    assert picker.count.maximum() == 1
    picker.set_gpus(None)
    assert picker.config_values() == {"device": "cuda", "gpus": [0], "nproc": None}
    check.setCheckState(Qt.CheckState.Checked)  # even if something checks it anyway
    picker.set_gpus([0, 1])
    assert picker.selected_gpus() == [0]
    wait_readings(qtbot, picker, [0])
    picker.pick_idle()
    assert picker.selected_gpus() == [0]


def test_only_mig_gpus_means_cpu_processes(make_picker: MakePicker,
                                           simulated_nvml: SimulatedNvml) -> None:
    simulated_nvml.gpus = [mig_gpu()]
    picker = make_picker(inventory=cuda_inventory())
    assert not picker.has_gpus
    assert "every GPU is in MIG mode" in label(picker, "no_gpu_note")


def test_gpus_are_named_by_nvml_index_under_cuda_visible_devices(
        qtbot: QtBot, make_picker: MakePicker, simulated_nvml: SimulatedNvml) -> None:
    simulated_nvml.gpus = four_gpus()
    # CUDA numbers in PCI bus order: 1 and 3 are the GPUs on buses 0x41 and 0xC1, which
    # NVML (and nvidia-smi) call 0 and 2.
    inventory = cuda_inventory({"CUDA_VISIBLE_DEVICES": "1,3"})
    picker = make_picker(inventory=inventory, refresh_ms=60_000)
    assert [cells(picker, r)[0] for r in range(picker.table.rowCount())] == ["0", "2"]
    tip = item(picker, 1, 1).toolTip()
    assert "GPU-2c2c2c2c-0000-0000-0000-000000000000" in tip and "00000000:C1:00.0" in tip
    wait_readings(qtbot, picker, [0, 1])
    assert cells(picker, 1)[3] == "97%"  # the busy GPU's own reading
    assert picker.config_values()["gpus"] == [0, 2]


def test_bad_arguments_are_refused_by_name(simulated_nvml: SimulatedNvml) -> None:
    with pytest.raises(ValueError, match="pass gpus or inventory, not both"):
        DevicePicker(gpus=[], inventory=GpuInventory())
    with pytest.raises(ValueError, match="refresh_ms must be >= 1, got 0"):
        DevicePicker(gpus=[], refresh_ms=0)
    with pytest.raises(ValueError, match=r"timeout_ms must be >= 1 \(or None: automatic\), got -5"):
        DevicePicker(gpus=[], timeout_ms=-5)


def test_a_gpu_wedged_before_the_window_opens_delays_it_by_the_timeout_only(
        make_picker: MakePicker, simulated_nvml: SimulatedNvml, monkeypatch: pytest.MonkeyPatch,
        wedge: Callable[[SimGpu], threading.Event]) -> None:
    simulated_nvml.gpus = four_gpus()
    wedge(simulated_nvml.gpus[2])  # NVML's inventory itself now blocks
    monkeypatch.setattr(devices, "INVENTORY_TIMEOUT_S", 0.5)
    start = time.monotonic()
    picker = make_picker()
    assert time.monotonic() - start < 5.0, "the window waited for the wedged GPU"
    assert not picker.has_gpus and picker.reader is None
    assert label(picker, "no_gpu_note") == (
        "Training runs as CPU processes (gloo): NVML did not answer within 0.5 s (a wedged GPU "
        "or driver?); see whether nvidia-smi answers.")
