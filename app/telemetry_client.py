"""A viewer of a run's live telemetry, on a worker thread, delivering messages as Qt signals."""

from __future__ import annotations

import threading
import time
from pathlib import Path
from typing import Any

from PySide6.QtCore import QThread, Signal

from ddp_engine.common.protocol import Connection, ProtocolError, check_address
from ddp_engine.common.run_dir import CONFIG_FILE, MetricsTail, read_json


class TelemetryClient(QThread):
    """Connects to RUN_DIR's server once monitor.json appears, then reads until the end. A run
    without telemetry (config.json says ``telemetry: false``) is followed through its
    metrics.jsonl instead. Without a run folder (:meth:`remote`), it connects to an explicit
    address and token: rank 0 on another machine, its port forwarded with ``ssh -L``.

    Messages are batched: ``messages`` carries a list, emitted at most every ``batch_s``, so a
    replay of a long history does not flood the GUI thread with signals.
    """

    welcomed = Signal(object)  # the welcome dict
    messages = Signal(object)  # list[dict]
    disconnected = Signal(str)  # why
    failed = Signal(str)

    def __init__(self, run_dir: Path | None, connect_timeout_s: float | None = 180.0,
                 batch_s: float = 0.05, *, host: str | None = None, port: int | None = None,
                 token: str | None = None) -> None:
        super().__init__()
        self.setObjectName("rankscope-telemetry-client")
        self.run_dir = Path(run_dir) if run_dir is not None else None
        self.host, self.port, self.token = host, port, token
        self.connect_timeout_s = connect_timeout_s
        self.batch_s = batch_s
        self._stop = threading.Event()
        self._conn: Connection | None = None
        self._lock = threading.Lock()

    @classmethod
    def remote(cls, host: str, port: int, token: str, connect_timeout_s: float = 20.0,
               batch_s: float = 0.05) -> TelemetryClient:
        """A viewer of the server at ``host:port`` with ``token`` (no run folder here).

        Raises:
            ValueError: a host, port or token that cannot be right, naming it.
        """
        check_address(host, port, token)
        return cls(None, connect_timeout_s, batch_s, host=host, port=port, token=token)

    def _connect(self) -> Connection | None:
        """A connection (retried until ``connect_timeout_s``, None: until stopped), or None
        when stopped, failed (``failed`` emitted) or following metrics.jsonl instead (returned
        when that ended)."""
        deadline = (float("inf") if self.connect_timeout_s is None
                    else time.monotonic() + self.connect_timeout_s)
        while not self._stop.is_set():
            try:
                if self.run_dir is None:
                    assert self.host and self.port and self.token  # remote() checked them
                    return Connection.to(self.host, self.port, self.token, timeout_s=5.0)
                config = read_json(self.run_dir / CONFIG_FILE)  # the launcher writes it first
                if isinstance(config, dict) and config.get("telemetry") is False:
                    self._follow_file(self.run_dir)  # --no-telemetry: metrics.jsonl only
                    return None
                return Connection(self.run_dir, timeout_s=5.0)
            except ProtocolError as e:
                if time.monotonic() > deadline:
                    self.failed.emit(str(e))
                    return None
                self._stop.wait(0.2)
        return None

    def _follow_file(self, run_dir: Path) -> None:
        """Deliver metrics.jsonl's lines, the whole history first, as the server would."""
        tail = MetricsTail(run_dir)
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
        conn = self._connect()
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
