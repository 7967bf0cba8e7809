"""Live GPU readings for the device picker, read off the GUI thread.

An NVML call on a wedged GPU can block for good, and the GUI thread must never be the one
that waits. Each GPU gets a daemon thread of its own (one per GPU, so the number of threads
is bounded and each has at most one NVML read in flight): a GPU that stops answering blocks
only its own thread, and the other GPUs keep their live readings. Results arrive in the GUI
thread as the ``reading`` signal (a queued connection); the picker takes a GPU whose last
reading is older than its timeout as "unknown".

Daemon threads rather than QThreads: a blocked NVML call cannot be interrupted, and neither a
daemon thread nor a stop request waits for it, so closing the window and leaving the process
are never held up by a wedged GPU (a running QThread destroyed at exit aborts the process).
A thread blocked that way ends by itself once its call returns.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

from PySide6.QtCore import QObject, Signal

from ddp_engine.common.gpus import GpuReading, Nvml

IDLE_UTIL_PCT = 10.0
IDLE_MEM_FRACTION = 0.1

IdleState = Literal["idle", "busy", "unknown"]


@dataclass(frozen=True)
class Posted:
    """One reading of one GPU, as a reader thread posts it."""

    uuid: str
    reading: GpuReading


def idle_state(reading: GpuReading | None) -> IdleState:
    """Whether a GPU may be taken as idle: low utilization and little memory in use.

    No reading, or one without utilization or memory, is "unknown", never idle: a GPU NVML
    cannot read may be wedged, or busy with someone else's job.
    """
    if reading is None or reading.util_pct is None or reading.mem_used_bytes is None \
            or not reading.mem_total_bytes:
        return "unknown"
    if reading.util_pct <= IDLE_UTIL_PCT \
            and reading.mem_used_bytes <= IDLE_MEM_FRACTION * reading.mem_total_bytes:
        return "idle"
    return "busy"


class GpuReader(QObject):
    """Reads each GPU of ``uuids`` every ``period_s`` (or at once on :meth:`wake`), each on a
    daemon thread of its own; every reading arrives as the ``reading`` signal (a
    :class:`Posted`). Stop with :meth:`request_stop`; threads not blocked in NVML end at once.
    """

    reading = Signal(object)  # Posted

    def __init__(self, uuids: Sequence[str], period_s: float) -> None:
        super().__init__()
        self.period_s = period_s
        self._stop = threading.Event()
        self._wakes = {uuid: threading.Event() for uuid in uuids}
        self.threads = [threading.Thread(target=self.run, args=(uuid,), daemon=True,
                                         name=f"rankscope-gpu-reader-{uuid[:12]}")
                        for uuid in uuids]

    def start(self) -> None:
        for thread in self.threads:
            thread.start()

    def wake(self) -> None:
        """Read every GPU now (a GPU whose thread is blocked is read once it comes back)."""
        for event in self._wakes.values():
            event.set()

    def request_stop(self) -> None:
        """Ask every thread to end; returns at once (a blocked one ends when NVML returns)."""
        self._stop.set()
        self.wake()

    def alive(self) -> list[threading.Thread]:
        """The reader threads still running."""
        return [t for t in self.threads if t.is_alive()]

    def stopped(self) -> bool:
        """Whether every reader thread has ended."""
        return not self.alive()

    def run(self, uuid: str) -> None:
        """The loop of one GPU's thread: read, post, wait for the period or a wake."""
        wake = self._wakes[uuid]
        nvml = Nvml()  # a session per thread: NVML is thread-safe, a handle cache is not shared
        try:
            while not self._stop.is_set():
                wake.clear()  # a wake that comes during the read is kept for the next wait
                reading = nvml.read(nvml.handle(uuid))
                if self._stop.is_set():
                    return
                try:
                    self.reading.emit(Posted(uuid, reading))
                except RuntimeError:
                    return  # the Qt side was deleted: the process is exiting
                wake.wait(self.period_s)
        finally:
            nvml.close()
