"""GPU inventory through NVML (nvidia-ml-py), without torch and without initializing CUDA.

Used by the launcher (device count, the CUDA_VISIBLE_DEVICES mapping) and by the app's device
picker. NVML failure (no driver, no GPU) gives an empty inventory, never an exception.

Index convention: a GPU index is the position in NVML's order, which is PCI bus order; the
workers get ``CUDA_DEVICE_ORDER=PCI_BUS_ID`` so CUDA numbers them the same way. If the
environment already restricts GPUs with CUDA_VISIBLE_DEVICES, indices refer to that list.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
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
