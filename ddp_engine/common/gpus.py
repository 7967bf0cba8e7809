"""Every NVML call of the project (nvidia-ml-py), without torch and without initializing CUDA.

The launcher (device count, the CUDA_VISIBLE_DEVICES mapping, GPU memory left after a run),
each GPU rank's sampler, ``doctor`` and the app's device table all read NVML through
:class:`Nvml`: one initialisation per user, handles cached, and every failure (no library, no
driver, no GPU, a call the GPU does not support) a None or an empty inventory, never an
exception.

One GPU identity everywhere: a GPU is named by its NVML index, as nvidia-smi names it (also
under a CUDA_VISIBLE_DEVICES that hides some GPUs), and ranks are given their GPUs by UUID in
CUDA_VISIBLE_DEVICES, since NVML's order is not guaranteed to be PCI bus order nor CUDA's.
"""

from __future__ import annotations

import contextlib
import os
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

CLOCK_SLOWDOWNS: dict[int, tuple[str, str]] = {
    0x4: ("software power cap", "clocks held down to stay under the power limit; see "
          "nvidia-smi -q -d POWER (a lowered limit: sudo nvidia-smi -i {i} -pl WATTS)"),
    0x8: ("hardware slowdown", "temperature, power brake or a power-supply fault; check the "
          "cooling and the power cables"),
    0x20: ("software thermal slowdown", "the GPU is too hot; check airflow and fans"),
    0x40: ("hardware thermal slowdown", "the GPU is too hot; check airflow and fans"),
    0x80: ("hardware power brake", "the power supply asserted its brake; check the PSU"),
}
"""nvmlClocksEventReason* bits that slow a GPU down, with what to do: ``doctor`` warns of them,
the straggler verdict names them (idle, application clocks, sync boost and display clocks are
normal)."""


@dataclass(frozen=True)
class GpuInfo:
    """One GPU as NVML reports it."""

    index: int
    """NVML index, as nvidia-smi and ``--gpus`` name the GPU."""
    name: str
    uuid: str
    """What the workers' CUDA_VISIBLE_DEVICES carries for this GPU."""
    pci_bus_id: str
    mem_total_bytes: int | None
    mig: bool = False
    """In MIG mode: CUDA sees only its MIG instances, and a DDP rank needs a whole GPU."""

    @property
    def label(self) -> str:
        """How views, logs and status lines name it: ``GPU 2 (NVIDIA H200)``."""
        return f"GPU {self.index} ({self.name})"


@dataclass(frozen=True)
class GpuProcess:
    """A process holding a CUDA context on a GPU, as NVML's compute-process list has it."""

    gpu: int
    """NVML index of the GPU (PCI bus order, not restricted by CUDA_VISIBLE_DEVICES)."""
    pid: int
    """As NVML reports it: the host's pid namespace. Inside a container with its own pid
    namespace this is not the pid the container sees, and nothing of ours matches it."""
    used_bytes: int | None


@dataclass(frozen=True)
class GpuReading:
    """A live reading of one GPU; None where NVML could not say."""

    util_pct: float | None
    mem_used_bytes: int | None
    mem_total_bytes: int | None
    temp_c: float | None
    power_w: float | None


NO_READING = GpuReading(None, None, None, None, None)


def _attempt(read: Any) -> Any:
    """``read()``, or None when NVML raises (NVML_ERROR_NOT_SUPPORTED and friends)."""
    try:
        return read()
    except Exception:
        return None


class Nvml:
    """One NVML session: initialised once, handles cached, closed by :meth:`close` (or as a
    context manager). Where NVML is unavailable every method answers None (or nothing)."""

    def __init__(self) -> None:
        self._nv: Any = None
        self._handles: dict[str | int, Any] = {}
        try:
            import pynvml

            pynvml.nvmlInit()
            self._nv = pynvml
        except Exception:  # no library, no driver, no GPU: all mean "no NVML"
            self._nv = None

    def __enter__(self) -> Nvml:
        return self

    def __exit__(self, *_: object) -> None:
        self.close()

    @property
    def available(self) -> bool:
        return self._nv is not None

    def close(self) -> None:
        if self._nv is not None:
            with contextlib.suppress(Exception):
                self._nv.nvmlShutdown()
            self._nv = None
            self._handles.clear()

    def count(self) -> int | None:
        """How many GPUs NVML sees, or None."""
        return None if self._nv is None else _attempt(self._nv.nvmlDeviceGetCount)

    def query(self, function: str, *args: Any) -> Any:
        """``pynvml.<function>(*args)``, or None where NVML is unavailable or the call fails
        (for the rarer calls: versions, links, throttle reasons)."""
        nv = self._nv
        if nv is None or not hasattr(nv, function):
            return None
        return _attempt(lambda: getattr(nv, function)(*args))

    def handle(self, key: int | str) -> Any:
        """The handle of GPU ``key``: an NVML index, or a UUID (or its unique prefix, as
        CUDA_VISIBLE_DEVICES may give it). None when there is no such GPU."""
        nv = self._nv
        if nv is None:
            return None
        if key not in self._handles:
            if isinstance(key, int) or str(key).isdigit():
                found = _attempt(lambda: nv.nvmlDeviceGetHandleByIndex(int(key)))
            else:
                found = _attempt(lambda: nv.nvmlDeviceGetHandleByUUID(key))
            if found is None:
                return None
            self._handles[key] = found
        return self._handles[key]

    def rank_handle(self, local_rank: int, uuid: str | None = None,
                    environ: Mapping[str, str] | None = None) -> Any:
        """The handle of a rank's GPU: by its UUID (from torch) when given, else by entry
        ``local_rank`` of CUDA_VISIBLE_DEVICES (an NVML index with CUDA_DEVICE_ORDER=PCI_BUS_ID,
        as the launcher sets, or a UUID), else NVML index ``local_rank``."""
        if uuid:
            return self.handle(uuid)
        env = os.environ if environ is None else environ
        visible = env.get("CUDA_VISIBLE_DEVICES")
        tokens = [t.strip() for t in visible.split(",")] if visible else []
        return self.handle(tokens[local_rank] if local_rank < len(tokens) else local_rank)

    def info(self, index: int) -> GpuInfo | None:
        """NVML index ``index`` as a GpuInfo (physical numbering), or None."""
        nv, h = self._nv, self.handle(index)
        if nv is None or h is None:
            return None
        try:
            name, bus, uuid = (nv.nvmlDeviceGetName(h), nv.nvmlDeviceGetPciInfo(h).busId,
                               nv.nvmlDeviceGetUUID(h))
        except Exception:
            return None
        mem = _attempt(lambda: int(nv.nvmlDeviceGetMemoryInfo(h).total))
        mig = _attempt(lambda: nv.nvmlDeviceGetMigMode(h)[0])  # NOT_SUPPORTED: no MIG
        return GpuInfo(index, _text(name), _text(uuid), _text(bus), mem,
                       mig=mig == getattr(nv, "NVML_DEVICE_MIG_ENABLE", 1))

    def info_of(self, key: int | str) -> GpuInfo | None:
        """The GpuInfo (NVML index included) of the GPU of ``key``: a UUID, as a rank's
        CUDA_VISIBLE_DEVICES entry has it, or an NVML index."""
        if isinstance(key, int) or str(key).isdigit():
            return self.info(int(key))
        index = self.query("nvmlDeviceGetIndex", self.handle(key))
        return None if index is None else self.info(int(index))

    def read(self, handle: Any) -> GpuReading:
        """Utilization, memory, temperature and power of the GPU of ``handle``."""
        nv = self._nv
        if nv is None or handle is None:
            return NO_READING
        mem = _attempt(lambda: nv.nvmlDeviceGetMemoryInfo(handle))
        power_mw = _attempt(lambda: nv.nvmlDeviceGetPowerUsage(handle))
        return GpuReading(
            _attempt(lambda: float(nv.nvmlDeviceGetUtilizationRates(handle).gpu)),
            int(mem.used) if mem is not None else None,
            int(mem.total) if mem is not None else None,
            _attempt(lambda: float(nv.nvmlDeviceGetTemperature(handle,
                                                               nv.NVML_TEMPERATURE_GPU))),
            power_mw / 1000.0 if power_mw is not None else None)

    def compute_processes(self) -> list[GpuProcess] | None:
        """Every compute process on every GPU of this machine, or None when NVML cannot say."""
        nv, n = self._nv, self.count()
        if nv is None or n is None:
            return None
        found = []
        try:
            for i in range(n):
                for proc in nv.nvmlDeviceGetComputeRunningProcesses(self.handle(i)):
                    used = proc.usedGpuMemory
                    found.append(GpuProcess(i, int(proc.pid),
                                            None if used is None else int(used)))
        except Exception:
            return None
        return found


def list_gpus(environ: Mapping[str, str] | None = None) -> list[GpuInfo]:
    """The GPUs this process may use, NVML-indexed; in NVML order, or in the order
    CUDA_VISIBLE_DEVICES lists them when that is set. Empty when NVML is unavailable.

    A CUDA_VISIBLE_DEVICES entry may be a UUID (or its unique prefix) or a number; numbers are
    taken in PCI bus order (CUDA_DEVICE_ORDER=PCI_BUS_ID; CUDA's default order, fastest first,
    is unknown without CUDA). A ``MIG-`` entry names a MIG instance, which Rankscope does not
    give ranks: it ends the list, as any entry CUDA cannot match does.
    """
    env = os.environ if environ is None else environ
    with Nvml() as nvml:
        physical = [g for g in (nvml.info(i) for i in range(nvml.count() or 0)) if g is not None]
    visible = env.get("CUDA_VISIBLE_DEVICES")
    if visible is None:
        return physical
    pci_order = sorted(physical, key=lambda g: g.pci_bus_id.lower())
    chosen: list[GpuInfo] = []
    for token in [t.strip() for t in visible.split(",") if t.strip()]:
        match = None
        if token.isdigit():
            n = int(token)
            match = pci_order[n] if n < len(pci_order) else None
        elif token.startswith("GPU-"):
            found = [g for g in physical if g.uuid.startswith(token)]
            match = found[0] if len(found) == 1 else None
        if match is None or match in chosen:
            break  # CUDA ignores everything after the first invalid entry
        chosen.append(match)
    return chosen


def gpu_processes() -> list[GpuProcess] | None:
    """Every compute process on every GPU of this machine; None when NVML is unavailable (no
    driver, no GPU), so that "no GPU to check" is not mistaken for "nothing left"."""
    with Nvml() as nvml:
        return nvml.compute_processes()


def gpu_leftovers(pids: Iterable[int], timeout_s: float = 5.0,
                  interval_s: float = 0.25) -> list[GpuProcess]:
    """Which of ``pids`` still hold a CUDA context (and GPU memory) by NVML, once the driver has
    had up to ``timeout_s`` to release the contexts of processes that just exited. Empty when
    none does, or when NVML is unavailable."""
    wanted = set(pids)
    deadline = time.monotonic() + timeout_s
    while True:
        held = [p for p in gpu_processes() or [] if p.pid in wanted]
        if not held or time.monotonic() >= deadline:
            return held
        time.sleep(interval_s)


def gpu_count(environ: Mapping[str, str] | None = None) -> int:
    return len(list_gpus(environ))


def cpu_count() -> int:
    """CPU cores this process may run on."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        return os.cpu_count() or 1


def visible_devices_for(gpus: list[int], inventory: list[GpuInfo]) -> str:
    """The workers' CUDA_VISIBLE_DEVICES exposing exactly ``gpus`` (NVML indices), in that
    order, by UUID: local rank i gets ``gpus[i]`` whatever order CUDA would number them in."""
    by_index = {g.index: g for g in inventory}
    return ",".join(by_index[i].uuid for i in gpus)


def driver_versions() -> tuple[str | None, tuple[int, int] | None]:
    """The driver's version and the newest CUDA it supports, e.g. ``("550.54.15", (12, 4))``;
    None where NVML cannot say."""
    with Nvml() as nvml:
        driver = nvml.query("nvmlSystemGetDriverVersion")
        cuda = nvml.query("nvmlSystemGetCudaDriverVersion_v2")
        if cuda is None:
            cuda = nvml.query("nvmlSystemGetCudaDriverVersion")
    return (None if driver is None else _text(driver),
            None if cuda is None else (int(cuda) // 1000, int(cuda) % 1000 // 10))


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)
