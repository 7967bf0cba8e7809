"""Device readings in a background thread: NVML for a GPU rank, psutil for a CPU rank.

Sampling never raises and never runs inside the training step: a failed reading is None.
The step loop only reads :meth:`DeviceSampler.latest`, a dict swapped in whole by the thread.
"""

from __future__ import annotations

import os
import threading
import time
from typing import Any

import psutil

GPU_KEYS = ("gpu_util_pct", "gpu_mem_used_bytes", "gpu_mem_total_bytes", "gpu_temp_c",
            "gpu_power_w")
CPU_KEYS = ("cpu_pct", "rss_bytes")
KEYS = GPU_KEYS + CPU_KEYS


def _nvml_handle(local_rank: int, uuid: str | None) -> tuple[Any, Any] | tuple[None, None]:
    """NVML and the handle of this rank's GPU: by its UUID (from torch) when given, else by
    entry ``local_rank`` of CUDA_VISIBLE_DEVICES (an NVML index with CUDA_DEVICE_ORDER=PCI_BUS_ID,
    as the launcher sets, or a UUID)."""
    try:
        import pynvml

        pynvml.nvmlInit()
        if uuid:
            return pynvml, pynvml.nvmlDeviceGetHandleByUUID(uuid)
        visible = os.environ.get("CUDA_VISIBLE_DEVICES")
        tokens = [t.strip() for t in visible.split(",")] if visible else []
        token = tokens[local_rank] if local_rank < len(tokens) else str(local_rank)
        if token.isdigit():
            return pynvml, pynvml.nvmlDeviceGetHandleByIndex(int(token))
        return pynvml, pynvml.nvmlDeviceGetHandleByUUID(token)
    except Exception:
        return None, None


class DeviceSampler(threading.Thread):
    """Samples this rank's device at ``hz`` on a drift-free schedule until :meth:`request_stop`."""

    def __init__(self, device_type: str, local_rank: int, gpu_uuid: str | None = None,
                 hz: float = 2.0) -> None:
        super().__init__(name=f"rankscope-device-sampler-{local_rank}", daemon=True)
        self.device_type = device_type
        self.local_rank = local_rank
        self.gpu_uuid = gpu_uuid
        self.period_s = 1.0 / hz
        self._stop_event = threading.Event()
        self._latest: dict[str, float | None] = dict.fromkeys(KEYS)
        self._nvml: Any = None
        self._handle: Any = None
        self._proc = psutil.Process()

    def latest(self) -> dict[str, float | None]:
        return self._latest

    def request_stop(self) -> None:
        self._stop_event.set()

    def run(self) -> None:
        if self.device_type == "cuda":
            self._nvml, self._handle = _nvml_handle(self.local_rank, self.gpu_uuid)
        try:
            self._proc.cpu_percent(None)  # the first call only starts the CPU-time counter
            next_t = time.monotonic()
            while not self._stop_event.wait(max(0.0, next_t + self.period_s - time.monotonic())):
                next_t += self.period_s
                self._latest = self.poll_once()
        finally:
            if self._nvml is not None:
                try:
                    self._nvml.nvmlShutdown()
                except Exception:
                    pass

    def poll_once(self) -> dict[str, float | None]:
        """One reading of every key; None where unavailable."""
        out: dict[str, float | None] = dict.fromkeys(KEYS)
        try:
            out["cpu_pct"] = float(self._proc.cpu_percent(None))
            out["rss_bytes"] = float(self._proc.memory_info().rss)
        except psutil.Error:
            pass
        nv, h = self._nvml, self._handle
        if nv is None or h is None:
            return out
        for key, read in (
                ("gpu_util_pct", lambda: nv.nvmlDeviceGetUtilizationRates(h).gpu),
                ("gpu_mem_used_bytes", lambda: nv.nvmlDeviceGetMemoryInfo(h).used),
                ("gpu_mem_total_bytes", lambda: nv.nvmlDeviceGetMemoryInfo(h).total),
                ("gpu_temp_c", lambda: nv.nvmlDeviceGetTemperature(h, nv.NVML_TEMPERATURE_GPU)),
                ("gpu_power_w", lambda: nv.nvmlDeviceGetPowerUsage(h) / 1000.0)):
            try:
                out[key] = float(read())
            except Exception:  # NVML_ERROR_NOT_SUPPORTED and friends: no value
                out[key] = None
        return out
