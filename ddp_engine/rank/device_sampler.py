"""Device readings in a background thread: NVML for a GPU rank, psutil for a CPU rank.

Sampling never raises and never runs inside the training step: a failed reading is None.
The step loop only reads :meth:`DeviceSampler.latest`, a dict swapped in whole by the thread.
"""

from __future__ import annotations

import threading
import time
from typing import Any

import psutil

from ddp_engine.common.gpus import Nvml

GPU_KEYS = ("gpu_util_pct", "gpu_mem_used_bytes", "gpu_mem_total_bytes", "gpu_temp_c",
            "gpu_power_w", "gpu_clock_mhz", "gpu_throttle")
CPU_KEYS = ("cpu_pct", "rss_bytes")
KEYS = GPU_KEYS + CPU_KEYS
NVML_CLOCK_SM = 1  # pynvml's nvmlClockType_t for the streaming multiprocessors' clock


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
        self._nvml: Nvml | None = None
        self._handle: Any = None
        self._proc = psutil.Process()

    def latest(self) -> dict[str, float | None]:
        return self._latest

    def request_stop(self) -> None:
        self._stop_event.set()

    def run(self) -> None:
        if self.device_type == "cuda":
            self._nvml = Nvml()
            self._handle = self._nvml.rank_handle(self.local_rank, self.gpu_uuid)
        try:
            self._proc.cpu_percent(None)  # the first call only starts the CPU-time counter
            next_t = time.monotonic()
            while not self._stop_event.wait(max(0.0, next_t + self.period_s - time.monotonic())):
                next_t += self.period_s
                self._latest = self.poll_once()
        finally:
            if self._nvml is not None:
                self._nvml.close()

    def poll_once(self) -> dict[str, float | None]:
        """One reading of every key; None where unavailable."""
        out: dict[str, float | None] = dict.fromkeys(KEYS)
        try:
            out["cpu_pct"] = float(self._proc.cpu_percent(None))
            out["rss_bytes"] = float(self._proc.memory_info().rss)
        except psutil.Error:
            pass
        if self._nvml is None or self._handle is None:
            return out
        gpu = self._nvml.read(self._handle)
        out.update(gpu_util_pct=gpu.util_pct, gpu_mem_used_bytes=_float(gpu.mem_used_bytes),
                   gpu_mem_total_bytes=_float(gpu.mem_total_bytes), gpu_temp_c=gpu.temp_c,
                   gpu_power_w=gpu.power_w)
        out.update(self._clocks())
        return out

    def _clocks(self) -> dict[str, float | None]:
        """The SM clock and the clock event (throttle) reasons: what a straggler's GPU is
        judged by (see :mod:`ddp_engine.common.straggler`)."""
        assert self._nvml is not None
        clock = self._nvml.query("nvmlDeviceGetClockInfo", self._handle, NVML_CLOCK_SM)
        reasons = self._nvml.query("nvmlDeviceGetCurrentClocksEventReasons", self._handle)
        if reasons is None:  # drivers before 535 know only the old name
            reasons = self._nvml.query("nvmlDeviceGetCurrentClocksThrottleReasons",
                                       self._handle)
        return {"gpu_clock_mhz": _float(clock), "gpu_throttle": _float(reasons)}


def _float(value: int | None) -> float | None:
    return None if value is None else float(value)
