"""A simulated NVML: a stand-in for nvidia-ml-py's ``pynvml`` module, for tests of the GPU logic
on machines without a GPU.

It is a stand-in only because no machine that runs this project's tests has a GPU: it answers
the calls the project makes (and only those) the way nvidia-ml-py documents them, from GPUs a
test describes. Where a real GPU is present, the tests that use it are no substitute for the
ones marked ``cuda``, which run against the real library.
"""

from __future__ import annotations

import sys
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Any

import pytest

from ddp_engine.common.inventory import TorchBuild

NVML_TEMPERATURE_GPU = 0
NVML_DEVICE_MIG_ENABLE = 1


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
    mig_mode: int = 0
    """1 (NVML_DEVICE_MIG_ENABLE) for a GPU in MIG mode: usable only as MIG instances."""
    blocked: threading.Event | None = None
    """A wedged GPU: while set to an unset Event, every call on this GPU waits for it (the
    fixture sets it at the end of the test, so no thread stays blocked)."""
    pcie: tuple[int, int] = (4, 16)
    """Current PCIe (generation, width) (``"pcie"`` in ``unsupported``: NOT_SUPPORTED)."""
    pcie_max: tuple[int, int] = (4, 16)
    """The most GPU and slot can do together (nvmlDeviceGetMaxPcieLink*)."""
    nvlinks: list[tuple[str, int]] = field(default_factory=list)
    """Active NVLinks, link 0 first: (PCI bus id at the other end: a GPU's, or an NVSwitch's,
    nvmlNvlinkVersion_t, e.g. 6 for NVLink 4.0). Empty: no NVLink (NVML: NOT_SUPPORTED)."""
    clocks_event_reasons: int = 0
    """nvmlClocksEventReason* bits active now (1: idle; 0x40: hardware thermal slowdown)."""
    p2p_read: dict[str, int] = field(default_factory=dict)
    """NVML_P2P_STATUS_* of P2P reads with the GPU of each UUID (either side's entry counts;
    absent: 0, OK)."""
    topology: dict[str, int] = field(default_factory=dict)
    """NVML_TOPOLOGY_* common ancestor with the GPU of each UUID (either side's entry counts;
    absent: 30, the host bridge)."""
    sm_clock_mhz: int = 1980
    """The streaming multiprocessors' clock now (nvmlDeviceGetClockInfo, NVML_CLOCK_SM;
    ``"clocks"`` in ``unsupported``: NOT_SUPPORTED, as for the clock event reasons)."""


class SimulatedNvml:
    """The ``pynvml`` module as the project uses it, answering from ``gpus`` (NVML order)."""

    NVML_TEMPERATURE_GPU = NVML_TEMPERATURE_GPU
    NVML_DEVICE_MIG_ENABLE = NVML_DEVICE_MIG_ENABLE
    NVMLError = NVMLError

    def __init__(self, gpus: list[SimGpu], fail_init: bool = False,
                 driver_version: str = "550.54.15", cuda_driver_version: int = 12040) -> None:
        self.gpus = gpus
        self.fail_init = fail_init
        self.driver_version = driver_version
        self.cuda_driver_version = cuda_driver_version
        """The newest CUDA the driver supports, as NVML encodes it (12040: CUDA 12.4)."""
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
        if handle.blocked is not None:
            handle.blocked.wait()
        if call in handle.unsupported:
            raise NVMLError(3)
        return handle

    def nvmlSystemGetDriverVersion(self) -> str:  # noqa: N802
        self._check()
        return self.driver_version

    def nvmlSystemGetCudaDriverVersion(self) -> int:  # noqa: N802
        self._check()
        return self.cuda_driver_version

    nvmlSystemGetCudaDriverVersion_v2 = nvmlSystemGetCudaDriverVersion

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

    def nvmlDeviceGetIndex(self, handle: Any) -> int:  # noqa: N802
        gpu = self._gpu(handle, "index")
        return next(i for i, g in enumerate(self.gpus) if g is gpu)

    def nvmlDeviceGetMigMode(self, handle: Any) -> list[int]:  # noqa: N802
        """[current, pending]; NOT_SUPPORTED on GPUs without MIG, as on real ones."""
        gpu = self._gpu(handle, "mig")
        return [gpu.mig_mode, gpu.mig_mode]

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

    # -------------------------------------------------------------------------- links
    NVML_P2P_CAPS_INDEX_READ = (0,)  # sic: nvidia-ml-py spells it as a tuple
    NVML_P2P_STATUS_OK = 0
    NVML_P2P_STATUS_CHIPSET_NOT_SUPPORTED = 1
    NVML_TOPOLOGY_SINGLE = 10
    NVML_TOPOLOGY_MULTIPLE = 20
    NVML_TOPOLOGY_HOSTBRIDGE = 30
    NVML_TOPOLOGY_SYSTEM = 50

    def nvmlDeviceGetP2PStatus(self, handle1: Any, handle2: Any, index: int) -> int:  # noqa: N802
        a, b = self._gpu(handle1, "p2p"), self._gpu(handle2, "p2p")
        if not isinstance(index, int):  # ctypes cannot pass the tuple to the C function
            raise TypeError(f"argument 3: wrong type {type(index).__name__}")
        return a.p2p_read.get(b.uuid, b.p2p_read.get(a.uuid, self.NVML_P2P_STATUS_OK))

    def nvmlDeviceGetTopologyCommonAncestor(self, handle1: Any, handle2: Any) -> int:  # noqa: N802
        a, b = self._gpu(handle1, "topology"), self._gpu(handle2, "topology")
        return a.topology.get(b.uuid, b.topology.get(a.uuid, self.NVML_TOPOLOGY_HOSTBRIDGE))

    def _link(self, handle: Any, link: int) -> tuple[str, int]:
        gpu = self._gpu(handle, "nvlink")
        if not gpu.nvlinks:
            raise NVMLError(3)  # no NVLink on this GPU
        if not 0 <= link < len(gpu.nvlinks):
            raise NVMLError(2)  # no link with this number
        return gpu.nvlinks[link]

    def nvmlDeviceGetNvLinkState(self, handle: Any, link: int) -> int:  # noqa: N802
        self._link(handle, link)
        return 1  # NVML_FEATURE_ENABLED

    def nvmlDeviceGetNvLinkVersion(self, handle: Any, link: int) -> int:  # noqa: N802
        return self._link(handle, link)[1]

    def nvmlDeviceGetNvLinkRemotePciInfo(self, handle: Any, link: int) -> SimpleNamespace:  # noqa: N802
        return SimpleNamespace(busId=self._link(handle, link)[0])

    def nvmlDeviceGetCurrPcieLinkGeneration(self, handle: Any) -> int:  # noqa: N802
        return self._gpu(handle, "pcie").pcie[0]

    def nvmlDeviceGetCurrPcieLinkWidth(self, handle: Any) -> int:  # noqa: N802
        return self._gpu(handle, "pcie").pcie[1]

    def nvmlDeviceGetMaxPcieLinkGeneration(self, handle: Any) -> int:  # noqa: N802
        return self._gpu(handle, "pcie").pcie_max[0]

    def nvmlDeviceGetMaxPcieLinkWidth(self, handle: Any) -> int:  # noqa: N802
        return self._gpu(handle, "pcie").pcie_max[1]

    def nvmlDeviceGetCurrentClocksEventReasons(self, handle: Any) -> int:  # noqa: N802
        return self._gpu(handle, "clocks").clocks_event_reasons

    nvmlDeviceGetCurrentClocksThrottleReasons = nvmlDeviceGetCurrentClocksEventReasons

    NVML_CLOCK_SM = 1

    def nvmlDeviceGetClockInfo(self, handle: Any, clock_type: int) -> int:  # noqa: N802
        gpu = self._gpu(handle, "clocks")
        if clock_type != self.NVML_CLOCK_SM:
            raise NVMLError(2)  # only the SM clock is simulated
        return gpu.sm_clock_mhz


def two_gpus() -> list[SimGpu]:
    """Two GPUs of two models, the second with a compute process and no power reading."""
    return [SimGpu(name="NVIDIA H200", uuid="GPU-aaaa1111-0000-0000-0000-000000000000",
                   pci_bus_id="00000000:17:00.0", util_pct=3),
            SimGpu(name="NVIDIA RTX A6000", uuid="GPU-bbbb2222-0000-0000-0000-000000000000",
                   pci_bus_id="00000000:65:00.0", mem_total_bytes=48 * 2**30,
                   mem_used_bytes=20 * 2**30, util_pct=97, temp_c=71,
                   processes=[(4242, 19 * 2**30)], unsupported={"power"})]


def four_gpus() -> list[SimGpu]:
    """A workstation of four GPUs of two models, in an NVML order that is not PCI bus order
    (NVML index 0 sits on bus 0x41, index 1 on bus 0x01, ...); NVML index 2 is busy (97%,
    30 GiB used by another user's process)."""
    a, b = "NVIDIA RTX 6000 Ada Generation", "NVIDIA GeForce RTX 4090"
    return [SimGpu(name=a, uuid="GPU-0a0a0a0a-0000-0000-0000-000000000000",
                   pci_bus_id="00000000:41:00.0", mem_total_bytes=48 * 2**30),
            SimGpu(name=a, uuid="GPU-1b1b1b1b-0000-0000-0000-000000000000",
                   pci_bus_id="00000000:01:00.0", mem_total_bytes=48 * 2**30),
            SimGpu(name=b, uuid="GPU-2c2c2c2c-0000-0000-0000-000000000000",
                   pci_bus_id="00000000:C1:00.0", mem_total_bytes=24 * 2**30,
                   mem_used_bytes=30 * 2**30 // 2, util_pct=97, temp_c=78,
                   processes=[(31337, 15 * 2**30)]),
            SimGpu(name=b, uuid="GPU-3d3d3d3d-0000-0000-0000-000000000000",
                   pci_bus_id="00000000:81:00.0", mem_total_bytes=24 * 2**30)]


def mig_gpu() -> SimGpu:
    """A GPU in MIG mode (its whole-GPU handle answers; CUDA sees only its instances)."""
    return SimGpu(name="NVIDIA A100-SXM4-80GB", uuid="GPU-4e4e4e4e-0000-0000-0000-000000000000",
                  pci_bus_id="00000000:07:00.0", mem_total_bytes=80 * 2**30, mig_mode=1)


CPU_BUILD = TorchBuild("2.13.0+cpu", None)
"""The CPU wheel of torch, as inventory.installed_torch() describes it."""
CUDA_BUILD = TorchBuild("2.13.0+cu124", "12.4")
"""A CUDA build of torch, described (not installed: no machine that runs these tests has one);
a test sets it with ``monkeypatch.setattr(inventory, "installed_torch", lambda: CUDA_BUILD)``."""


@pytest.fixture
def simulated_nvml(monkeypatch: pytest.MonkeyPatch) -> Iterator[SimulatedNvml]:
    """``import pynvml`` gives a SimulatedNvml of :func:`two_gpus` for the test's duration
    (change its ``gpus`` or ``fail_init`` to describe another machine). A GPU a test wedged
    (``blocked``) is released at the end, so no thread stays blocked after the test."""
    sim = SimulatedNvml(two_gpus())
    monkeypatch.setitem(sys.modules, "pynvml", sim)
    yield sim
    for gpu in sim.gpus:
        if gpu.blocked is not None:
            gpu.blocked.set()
