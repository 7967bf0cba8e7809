"""The device picker against the simulated NVML (tests/simulated_nvml.py): the table, the live
readings and "first N idle"."""

from __future__ import annotations

from pytestqt.qtbot import QtBot

from app.devices import DevicePicker
from tests.simulated_nvml import SimulatedNvml


def test_the_picker_lists_the_gpus_with_their_readings(qtbot: QtBot,
                                                       simulated_nvml: SimulatedNvml) -> None:
    picker = DevicePicker(refresh_ms=60_000)
    qtbot.addWidget(picker)
    picker.refresh()
    rows = [[picker.table.item(r, c).text() for c in range(1, 6)] for r in range(2)]
    assert rows == [["0", "NVIDIA H200", "1.0/141.0 GiB", "3%", "40 °C"],
                    ["1", "NVIDIA RTX A6000", "20.0/48.0 GiB", "97%", "71 °C"]]
    assert picker.config_values() == {"device": "cuda", "gpus": [0, 1], "nproc": None}


def test_first_n_idle_skips_the_busy_gpu(qtbot: QtBot, simulated_nvml: SimulatedNvml) -> None:
    picker = DevicePicker(refresh_ms=60_000)
    qtbot.addWidget(picker)
    picker.count.setValue(1)
    picker.pick_idle()
    assert picker.selected_gpus() == [0]
    simulated_nvml.gpus[0].util_pct = 100  # now both are busy
    picker.pick_idle()
    assert picker.selected_gpus() == []
