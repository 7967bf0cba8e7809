"""A simulated NVML: a stand-in for nvidia-ml-py's ``pynvml`` module, for tests of the GPU logic
on machines without a GPU.

It is a stand-in only because no machine that runs this project's tests has a GPU: it answers
the calls the project makes (and only those) the way nvidia-ml-py documents them, from GPUs a
test describes. Where a real GPU is present, the tests that use it are no substitute for the
ones marked ``cuda``, which run against the real library.
"""

from __future__ import annotations

import sys
from collections.abc import Iterator
from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Any

import pytest

NVML_TEMPERATURE_GPU = 0


class NVMLError(Exception):
    """What pynvml raises; ``value`` is NVML's return code."""

    def __init__(self, value: int = 3) -> None:  # 3: NVML_ERROR_NOT_SUPPORTED
        super().__init__(f"NVML error {value}")
        self.value = value


@dataclass
class SimGpu:
    """One simulated GPU. ``unsupported`` names the calls it answers with NVML_ERROR_NOT_SUPPORTED
    (``"power"``, ``"temperature"``, ``"utilization"``, ``"memory"``)."""

    name: str = "NVIDIA H200"
    uuid: str = "GPU-00000000-0000-0000-0000-000000000000"
    pci_bus_id: str = "00000000:01:00.0"
    mem_total_bytes: int = 141 * 2**30
    mem_used_bytes: int = 2**30
    util_pct: int = 0
    temp_c: int = 40
    power_mw: int = 75_000
    processes: list[tuple[int, int | None]] = field(default_factory=list)
    """(pid, used GPU memory in bytes or None) of each compute process on it."""
    unsupported: set[str] = field(default_factory=set)


class SimulatedNvml:
    """The ``pynvml`` module as the project uses it, answering from ``gpus`` (NVML order)."""

    NVML_TEMPERATURE_GPU = NVML_TEMPERATURE_GPU
    NVMLError = NVMLError

    def __init__(self, gpus: list[SimGpu], fail_init: bool = False) -> None:
        self.gpus = gpus
        self.fail_init = fail_init
        self.initialised = 0
        """nvmlInit calls not yet matched by nvmlShutdown."""

    # -------------------------------------------------------------------------- library
    def nvmlInit(self) -> None:  # noqa: N802 (NVML's names)
        if self.fail_init:
            raise NVMLError(9)  # NVML_ERROR_DRIVER_NOT_LOADED
        self.initialised += 1

    def nvmlShutdown(self) -> None:  # noqa: N802
        self._check()
        self.initialised -= 1

    def _check(self) -> None:
        if self.initialised <= 0:
            raise NVMLError(1)  # NVML_ERROR_UNINITIALIZED

    def _gpu(self, handle: Any, call: str) -> SimGpu:
        self._check()
        if not isinstance(handle, SimGpu):
            raise NVMLError(2)  # NVML_ERROR_INVALID_ARGUMENT
        if call in handle.unsupported:
            raise NVMLError(3)
        return handle

    # -------------------------------------------------------------------------- devices
    def nvmlDeviceGetCount(self) -> int:  # noqa: N802
        self._check()
        return len(self.gpus)

    def nvmlDeviceGetHandleByIndex(self, index: int) -> SimGpu:  # noqa: N802
        self._check()
        if not 0 <= index < len(self.gpus):
            raise NVMLError(2)
        return self.gpus[index]

    def nvmlDeviceGetHandleByUUID(self, uuid: str) -> SimGpu:  # noqa: N802
        self._check()
        for gpu in self.gpus:
            if gpu.uuid == uuid:
                return gpu
        raise NVMLError(6)  # NVML_ERROR_NOT_FOUND

    def nvmlDeviceGetName(self, handle: Any) -> str:  # noqa: N802
        return self._gpu(handle, "name").name

    def nvmlDeviceGetUUID(self, handle: Any) -> str:  # noqa: N802
        return self._gpu(handle, "uuid").uuid

    def nvmlDeviceGetPciInfo(self, handle: Any) -> SimpleNamespace:  # noqa: N802
        return SimpleNamespace(busId=self._gpu(handle, "pci").pci_bus_id)

    def nvmlDeviceGetMemoryInfo(self, handle: Any) -> SimpleNamespace:  # noqa: N802
        gpu = self._gpu(handle, "memory")
        return SimpleNamespace(total=gpu.mem_total_bytes, used=gpu.mem_used_bytes,
                               free=gpu.mem_total_bytes - gpu.mem_used_bytes)

    def nvmlDeviceGetUtilizationRates(self, handle: Any) -> SimpleNamespace:  # noqa: N802
        return SimpleNamespace(gpu=self._gpu(handle, "utilization").util_pct, memory=0)

    def nvmlDeviceGetTemperature(self, handle: Any, sensor: int) -> int:  # noqa: N802
        assert sensor == NVML_TEMPERATURE_GPU
        return self._gpu(handle, "temperature").temp_c

    def nvmlDeviceGetPowerUsage(self, handle: Any) -> int:  # noqa: N802
        return self._gpu(handle, "power").power_mw

    def nvmlDeviceGetComputeRunningProcesses(self, handle: Any) -> list[SimpleNamespace]:  # noqa: N802
        return [SimpleNamespace(pid=pid, usedGpuMemory=used)
                for pid, used in self._gpu(handle, "processes").processes]


def two_gpus() -> list[SimGpu]:
    """Two GPUs of two models, the second with a compute process and no power reading."""
    return [SimGpu(name="NVIDIA H200", uuid="GPU-aaaa1111-0000-0000-0000-000000000000",
                   pci_bus_id="00000000:17:00.0", util_pct=3),
            SimGpu(name="NVIDIA RTX A6000", uuid="GPU-bbbb2222-0000-0000-0000-000000000000",
                   pci_bus_id="00000000:65:00.0", mem_total_bytes=48 * 2**30,
                   mem_used_bytes=20 * 2**30, util_pct=97, temp_c=71,
                   processes=[(4242, 19 * 2**30)], unsupported={"power"})]


@pytest.fixture
def simulated_nvml(monkeypatch: pytest.MonkeyPatch) -> Iterator[SimulatedNvml]:
    """``import pynvml`` gives a SimulatedNvml of :func:`two_gpus` for the test's duration
    (change its ``gpus`` or ``fail_init`` to describe another machine)."""
    sim = SimulatedNvml(two_gpus())
    monkeypatch.setitem(sys.modules, "pynvml", sim)
    yield sim
