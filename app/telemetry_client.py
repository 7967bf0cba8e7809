"""A viewer of a run's live telemetry, on a worker thread, delivering messages as Qt signals."""

from __future__ import annotations

import threading
import time
from pathlib import Path
from typing import Any

from PySide6.QtCore import QThread, Signal

from ddp_engine.protocol import Connection, ProtocolError
from ddp_engine.run_dir import CONFIG_FILE, MetricsTail, read_json


class TelemetryClient(QThread):
    """Connects to RUN_DIR's server once monitor.json appears, then reads until the end. A run
    without telemetry (config.json says ``telemetry: false``) is followed through its
    metrics.jsonl instead.

    Messages are batched: ``messages`` carries a list, emitted at most every ``batch_s``, so a
    replay of a long history does not flood the GUI thread with signals.
    """

    welcomed = Signal(object)  # the welcome dict
    messages = Signal(object)  # list[dict]
    disconnected = Signal(str)  # why
    failed = Signal(str)

    def __init__(self, run_dir: Path, connect_timeout_s: float = 180.0,
                 batch_s: float = 0.05) -> None:
        super().__init__()
        self.setObjectName("rankscope-telemetry-client")
        self.run_dir = Path(run_dir)
        self.connect_timeout_s = connect_timeout_s
        self.batch_s = batch_s
        self._stop = threading.Event()
        self._conn: Connection | None = None
        self._lock = threading.Lock()

    def _follow_file(self) -> None:
        """Deliver metrics.jsonl's lines, the whole history first, as the server would."""
        tail = MetricsTail(self.run_dir)
        while not self._stop.is_set():
            batch = tail.poll()
            if batch:
                self.messages.emit(batch)
            self._stop.wait(max(self.batch_s, 0.2))
        self.disconnected.emit("viewer closed")

    def request_stop(self) -> None:
        self._stop.set()
        with self._lock:
            if self._conn is not None:
                try:
                    self._conn.sock.shutdown(2)  # wakes the blocked read
                except OSError:
                    pass

    def send(self, message: dict[str, Any]) -> bool:
        """Send a command (stop, ping) from any thread. False when not connected."""
        with self._lock:
            if self._conn is None:
                return False
            try:
                self._conn.send(message)
                return True
            except OSError:
                return False

    def run(self) -> None:
        deadline = time.monotonic() + self.connect_timeout_s
        conn = None
        while not self._stop.is_set():
            config = read_json(self.run_dir / CONFIG_FILE)  # the launcher writes it at start
            if isinstance(config, dict) and config.get("telemetry") is False:
                self._follow_file()  # --no-telemetry: no server, but metrics.jsonl is written
                return
            try:
                conn = Connection(self.run_dir, timeout_s=5.0)
                break
            except ProtocolError as e:
                if time.monotonic() > deadline:
                    self.failed.emit(str(e))
                    return
                self._stop.wait(0.2)
        if conn is None:
            return
        with self._lock:
            self._conn = conn
        self.welcomed.emit(conn.welcome)
        why = "the run closed the connection"
        try:
            while not self._stop.is_set():
                try:
                    batch = conn.poll(self.batch_s)
                except OSError:
                    break
                if batch is None:
                    break
                if batch:
                    self.messages.emit(batch)
        finally:
            with self._lock:
                self._conn = None
            conn.close()
            if self._stop.is_set():
                why = "viewer closed"
            self.disconnected.emit(why)
