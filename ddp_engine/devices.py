"""GPU inventory through NVML (nvidia-ml-py), without torch and without initializing CUDA.

Used by the launcher (device count, the CUDA_VISIBLE_DEVICES mapping) and by the app's device
picker. NVML failure (no driver, no GPU) gives an empty inventory, never an exception.

Index convention: a GPU index is the position in NVML's order, which is PCI bus order; the
workers get ``CUDA_DEVICE_ORDER=PCI_BUS_ID`` so CUDA numbers them the same way. If the
environment already restricts GPUs with CUDA_VISIBLE_DEVICES, indices refer to that list.
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class GpuInfo:
    """One GPU as NVML reports it."""

    index: int
    """Index as the user names it (--gpus), within CUDA_VISIBLE_DEVICES when that is set."""
    visible_id: str
    """What to put in the workers' CUDA_VISIBLE_DEVICES for this GPU (index or UUID)."""
    name: str
    uuid: str
    pci_bus_id: str
    mem_total_bytes: int | None


def _nvml() -> Any | None:
    try:
        import pynvml

        pynvml.nvmlInit()
        return pynvml
    except Exception:  # no library, no driver, no GPU: all mean "no NVML"
        return None


def list_gpus(environ: Mapping[str, str] | None = None) -> list[GpuInfo]:
    """The GPUs this process may use, in index order. Empty when NVML is unavailable."""
    env = os.environ if environ is None else environ
    nv = _nvml()
    if nv is None:
        return []
    try:
        physical: list[GpuInfo] = []
        for i in range(nv.nvmlDeviceGetCount()):
            h = nv.nvmlDeviceGetHandleByIndex(i)
            name = nv.nvmlDeviceGetName(h)
            bus = nv.nvmlDeviceGetPciInfo(h).busId
            uuid = nv.nvmlDeviceGetUUID(h)
            try:
                mem: int | None = int(nv.nvmlDeviceGetMemoryInfo(h).total)
            except Exception:
                mem = None
            physical.append(GpuInfo(i, str(i), _text(name), _text(uuid), _text(bus), mem))
    except Exception:
        return []
    finally:
        try:
            nv.nvmlShutdown()
        except Exception:
            pass
    visible = env.get("CUDA_VISIBLE_DEVICES")
    if visible is None:
        return physical
    chosen: list[GpuInfo] = []
    for token in [t.strip() for t in visible.split(",") if t.strip()]:
        match = None
        if token.isdigit():
            n = int(token)
            match = physical[n] if n < len(physical) else None
        else:
            match = next((g for g in physical if g.uuid.startswith(token)), None)
        if match is None:
            break  # CUDA ignores everything after the first invalid entry
        chosen.append(GpuInfo(len(chosen), token, match.name, match.uuid, match.pci_bus_id,
                              match.mem_total_bytes))
    return chosen


@dataclass(frozen=True)
class GpuProcess:
    """A process holding a CUDA context on a GPU, as NVML's compute-process list has it."""

    gpu: int
    """NVML index of the GPU (PCI bus order, not restricted by CUDA_VISIBLE_DEVICES)."""
    pid: int
    """As NVML reports it: the host's pid namespace. Inside a container with its own pid
    namespace this is not the pid the container sees, and nothing of ours matches it."""
    used_bytes: int | None


def gpu_processes() -> list[GpuProcess] | None:
    """Every compute process on every GPU of this machine; None when NVML is unavailable (no
    driver, no GPU), so that "no GPU to check" is not mistaken for "nothing left"."""
    nv = _nvml()
    if nv is None:
        return None
    try:
        found = []
        for i in range(nv.nvmlDeviceGetCount()):
            h = nv.nvmlDeviceGetHandleByIndex(i)
            for proc in nv.nvmlDeviceGetComputeRunningProcesses(h):
                used = proc.usedGpuMemory
                found.append(GpuProcess(i, int(proc.pid), None if used is None else int(used)))
        return found
    except Exception:
        return None
    finally:
        try:
            nv.nvmlShutdown()
        except Exception:
            pass


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
    """The CUDA_VISIBLE_DEVICES value that exposes exactly ``gpus`` (in that order)."""
    by_index = {g.index: g for g in inventory}
    return ",".join(by_index[i].visible_id for i in gpus)


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)
