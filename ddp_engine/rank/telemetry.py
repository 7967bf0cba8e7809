"""What rank 0 publishes: metrics.jsonl, and the live server that viewers attach to.

Training never waits for a viewer, nor for the disk: :meth:`Telemetry.publish` stamps the
message, queues it and returns; the telemetry thread encodes it, appends it to metrics.jsonl,
keeps it in the history and adds it to each viewer's bounded send buffer, and does all socket
I/O. A viewer whose buffer would exceed its bound is dropped (counted and logged).
"""

from __future__ import annotations

import logging
import os
import secrets
import selectors
import socket
import threading
import time
from collections import deque
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ddp_engine.common.protocol import (
    MAX_LINE_BYTES,
    MONITOR_FILE,
    PROTOCOL_VERSION,
    decode,
    encode,
)
from ddp_engine.common.run_dir import atomic_write_json
from ddp_engine.rank.metrics_file import MetricsWriter, finite
from ddp_engine.rank.profile_ask import answer

if TYPE_CHECKING:
    from ddp_engine.common.config import RunConfig
    from ddp_engine.rank.distributed import StopFlag

log = logging.getLogger("ddp_engine.rank.telemetry")

DEFAULT_HISTORY = 100_000
"""Messages held in memory for replay to late viewers (metrics.jsonl has all of them)."""


class _Viewer:
    def __init__(self, sock: socket.socket, addr: Any) -> None:
        self.sock = sock
        self.addr = addr
        self.inbuf = bytearray()
        self.outbuf = bytearray()
        self.limit = 0
        self.authed = False
        self.replaying = False  # still being sent the history (from `cursor`)
        self.cursor = 0  # absolute index of the next history line to send while replaying
        self.dropped = False  # set by publish(); the server thread closes it
        self.discarding = False  # inside an oversized line


class Telemetry:
    """Rank 0's publisher: stamps messages, writes metrics.jsonl, serves live viewers.

    Args:
        run_dir: the run folder (monitor.json and metrics.jsonl go there).
        welcome_extra: ``{"world_size", "config"}`` sent in every welcome.
        on_stop: called (from the server thread) when an authenticated viewer sends stop,
            with the reason to give (:func:`stop_reason`).
        commands: other commands by message type (``profile``), each called from the server
            thread with the message and returning the reply; given here, they are answered
            from the first connection on.
        port: TCP port; 0 picks a free one. None: no server (file only).
        host: the address to listen on (``monitor_host``): 127.0.0.1, an address of this
            machine, or 0.0.0.0 for all of them. Every viewer needs the token.
        buffer_bytes: how far a viewer may fall behind the live stream before it is dropped.
    """

    def __init__(self, run_dir: Path, *, welcome_extra: dict[str, Any],
                 on_stop: Callable[[str], None], port: int | None = 0,
                 host: str = "127.0.0.1",
                 commands: dict[str, Callable[[dict[str, Any]], dict[str, Any]]] | None = None,
                 buffer_bytes: int = 8 * 1024 * 1024, history: int = DEFAULT_HISTORY) -> None:
        self.run_dir = run_dir
        self._writer = MetricsWriter(run_dir)
        self._welcome_extra = welcome_extra
        self._on_stop = on_stop
        self.commands: dict[str, Callable[[dict[str, Any]], dict[str, Any]]] = \
            dict(commands or {})
        """Other commands by message type (``profile``): called from the server thread with
        the message, they return the reply (an ``ack`` or an ``error``)."""
        self._buffer_bytes = buffer_bytes
        self._history: list[bytes] = []
        self._history_max = history
        self._history_base = 0  # absolute index of self._history[0]
        self._status: dict[str, Any] = {"state": "running", "step": 0, "epoch": 0}
        self._lock = threading.Lock()
        self._viewers: dict[int, _Viewer] = {}
        self.dropped_viewers = 0
        self._warnings: list[str] = []  # published as "warning" events after the current message
        self.token = secrets.token_urlsafe(24)
        self._queue: deque[dict[str, Any] | threading.Event] = deque()
        self._write_error: OSError | None = None  # from the thread; raised once by publish
        self._write_error_raised = False
        self._closing = False
        self._sel = selectors.DefaultSelector()
        self._wake_r, self._wake_w = socket.socketpair()
        self._wake_r.setblocking(False)
        self._wake_w.setblocking(False)
        self._sel.register(self._wake_r, selectors.EVENT_READ, "wake")
        self._listener: socket.socket | None = None
        if port is not None:
            self._listen(host, port)
        self._thread = threading.Thread(target=self._serve, name="rankscope-telemetry",
                                        daemon=True)
        self._thread.start()

    def _listen(self, host: str, port: int) -> None:
        try:
            listener = socket.create_server((host, port))  # IPv4: RunConfig refuses IPv6
        except OSError as e:  # taken between the launcher's check and now
            self._sel.close()
            self._wake_r.close()
            self._wake_w.close()
            self._writer.close()
            raise OSError(e.errno, f"monitor_port: port {port} on {host} is not free "
                          f"({e.strerror}); choose another, or 0 for a free one") from None
        listener.setblocking(False)
        self._sel.register(listener, selectors.EVENT_READ, "listen")
        self._listener = listener
        self.port = listener.getsockname()[1]
        # "host" is where a viewer on this machine connects; "listen", what other machines
        # may reach (127.0.0.1: none of them).
        atomic_write_json(self.run_dir / MONITOR_FILE, {
            "host": "127.0.0.1" if host == "0.0.0.0" else host,
            "listen": host, "port": self.port, "token": self.token, "pid": os.getpid(),
            "hostname": socket.gethostname(), "started": time.time()})
        os.chmod(self.run_dir / MONITOR_FILE, 0o600)

    # ----------------------------------------------------------------- training-thread side
    def publish(self, message: dict[str, Any]) -> dict[str, Any]:
        """Stamp ``message`` with "time" (unless it has one) and queue it for metrics.jsonl
        and every viewer. Costs the caller a dict and a wake-up, never a write.

        Raises:
            OSError: once, the first time after metrics.jsonl could not be appended to (a
                full disk), naming the file; the run's record is incomplete from there.
        """
        message = {"type": message["type"], "time": time.time(),
                   **{k: v for k, v in message.items() if k != "type"}}
        self._queue.append(message)
        self._wake()
        self._raise_write_error()
        return message

    def flush(self, timeout_s: float = 10.0) -> bool:
        """Wait until everything published so far is written and queued for the viewers.
        Returns False on a time-out.

        Raises:
            OSError: as :meth:`publish`.
        """
        done = threading.Event()
        self._queue.append(done)
        self._wake()
        ok = done.wait(timeout_s)
        self._raise_write_error()
        return ok

    def _raise_write_error(self) -> None:
        error = self._write_error
        if error is not None and not self._write_error_raised:
            self._write_error_raised = True
            raise error

    def _track_status(self, message: dict[str, Any]) -> None:
        kind = message.get("kind") if message["type"] == "event" else message["type"]
        for key in ("step", "epoch", "total_steps"):
            if key in message:
                self._status[key] = message[key]
        if kind in ("stopping", "stopped", "completed", "failed"):
            self._status["state"] = kind

    def close(self) -> None:
        """Write what is queued, send it to the viewers (briefly), close every viewer and the
        listener."""
        self._closing = True
        self._wake()
        self._thread.join(timeout=5)
        self._writer.close()

    def _wake(self) -> None:
        try:
            self._wake_w.send(b"x")
        except OSError:  # the pipe is full (the thread is awake anyway) or closed
            pass

    # ------------------------------------------------------------------ telemetry-thread side
    def _drain(self, most: int | None = 64) -> None:
        """What was published (``most`` messages at a time, so that sending to the viewers
        keeps pace with a burst): encoded, written, kept and queued for the viewers."""
        while self._queue and (most is None or most > 0):
            if most is not None:
                most -= 1
            item = self._queue.popleft()
            if isinstance(item, threading.Event):
                item.set()
                continue
            try:
                message = {k: finite(v) for k, v in item.items()}
                line = encode(message)
            except Exception as e:  # a value JSON cannot hold: that message alone is lost
                log.error("telemetry: a %s message could not be encoded (%s): dropped",
                          item.get("type"), e)
                continue
            try:
                self._writer.write_line(line)
            except OSError as e:
                log.error("%s", e)
                self._write_error = e
            with self._lock:
                self._track_status(message)
                self._history.append(line)
                if len(self._history) > 2 * self._history_max:  # amortized trim of the oldest
                    cut = len(self._history) - self._history_max
                    del self._history[:cut]
                    self._history_base += cut
                for fd, v in list(self._viewers.items()):
                    if v.authed and not v.dropped and not v.replaying:
                        if len(v.outbuf) + len(line) > v.limit:
                            self._drop(fd, v, "its send buffer is full (it stopped reading)")
                        else:
                            v.outbuf += line
                warnings, self._warnings = self._warnings, []
            for text in warnings:
                self._queue.append({"type": "event", "time": time.time(), "kind": "warning",
                                    "message": text})

    def _serve(self) -> None:
        drain_deadline: float | None = None
        try:
            while True:
                self._drain()
                if self._closing:
                    if drain_deadline is None:
                        drain_deadline = time.monotonic() + 2.0
                    with self._lock:
                        pending = any(v.outbuf for v in self._viewers.values())
                    if (not pending and not self._queue) or time.monotonic() > drain_deadline:
                        self._drain(most=None)  # the file gets everything, viewers or not
                        break
                self._update_interest()
                for key, mask in self._sel.select(timeout=0 if self._queue else 0.5):
                    if key.data == "listen":
                        self._accept()
                    elif key.data == "wake":
                        try:
                            while self._wake_r.recv(4096):
                                pass
                        except BlockingIOError:
                            pass
                    else:
                        if mask & selectors.EVENT_READ:
                            self._read(key.fd)
                        if mask & selectors.EVENT_WRITE:
                            self._write(key.fd)
        finally:
            with self._lock:
                for fd, v in list(self._viewers.items()):
                    self._forget(fd, v)
            self._sel.close()
            if self._listener is not None:
                self._listener.close()
            self._wake_r.close()
            self._wake_w.close()

    def _update_interest(self) -> None:
        with self._lock:
            for fd, v in list(self._viewers.items()):
                if v.dropped:
                    self._forget(fd, v)
                    continue
                if v.replaying:
                    self._feed_replay(v)
                events = selectors.EVENT_READ | (selectors.EVENT_WRITE if v.outbuf else 0)
                self._sel.modify(v.sock, events, fd)

    def _feed_replay(self, v: _Viewer, chunk: int = 256 * 1024) -> None:
        """Top up a replaying viewer's buffer from the history, a chunk at a time, so a late
        viewer costs the training thread nothing; once caught up it gets live lines."""
        if len(v.outbuf) >= chunk:
            return
        v.cursor = max(v.cursor, self._history_base)  # lines trimmed meanwhile are skipped
        end = self._history_base + len(self._history)
        while v.cursor < end and len(v.outbuf) < chunk:
            v.outbuf += self._history[v.cursor - self._history_base]
            v.cursor += 1
        if v.cursor == end:
            v.replaying = False
            v.limit = len(v.outbuf) + self._buffer_bytes

    def _accept(self) -> None:
        assert self._listener is not None
        try:
            sock, addr = self._listener.accept()
        except OSError:
            return
        sock.setblocking(False)
        # Each message is a small write: without TCP_NODELAY, Nagle's algorithm holds it until
        # the viewer's delayed ACK (40 ms on Linux): 40 ms of latency on every live message.
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        with self._lock:
            self._viewers[sock.fileno()] = _Viewer(sock, addr)
        self._sel.register(sock, selectors.EVENT_READ, sock.fileno())

    def _read(self, fd: int) -> None:
        with self._lock:
            v = self._viewers.get(fd)
        if v is None:
            return
        try:
            data = v.sock.recv(65536)
        except (BlockingIOError, InterruptedError):
            return
        except OSError:
            data = b""
        if not data:
            with self._lock:
                self._forget(fd, v)
            return
        v.inbuf += data
        while True:
            nl = v.inbuf.find(b"\n")
            if nl < 0:
                if len(v.inbuf) > MAX_LINE_BYTES:  # oversized: skip to the next newline
                    v.inbuf.clear()
                    v.discarding = True
                return
            line = bytes(v.inbuf[:nl])
            del v.inbuf[:nl + 1]
            if v.discarding:
                v.discarding = False
                continue
            if len(line) > MAX_LINE_BYTES:
                continue
            if not self._handle(fd, v, line):
                return

    def _handle(self, fd: int, v: _Viewer, line: bytes) -> bool:
        """Act on one client line. Returns False when the viewer was closed."""
        msg = decode(line)
        if not v.authed:
            ok = (msg is not None and msg["type"] == "hello"
                  and isinstance(msg.get("token"), str)
                  and secrets.compare_digest(msg["token"], self.token)
                  and msg.get("protocol") == PROTOCOL_VERSION)
            with self._lock:
                if not ok:
                    self._forget(fd, v)  # nothing is sent to a client without the token
                    return False
                welcome = encode({"type": "welcome", "protocol": PROTOCOL_VERSION,
                                  **self._welcome_extra, "status": dict(self._status)})
                v.outbuf += welcome
                v.authed = True
                v.replaying = True
                v.cursor = self._history_base
                self._feed_replay(v)
            return True
        if msg is None:
            return True  # malformed: ignored
        if msg["type"] == "ping":
            self._reply(v, {"type": "pong", "time": time.time()})
        elif msg["type"] == "stop":
            log.info("stop requested by viewer %s", v.addr)
            self._on_stop(stop_reason(msg))
            self._reply(v, {"type": "ack", "command": "stop", "time": time.time()})
        elif msg["type"] in self.commands:
            log.info("%s requested by viewer %s", msg["type"], v.addr)
            self._reply(v, {**self.commands[msg["type"]](msg), "time": time.time()})
        return True

    def _reply(self, v: _Viewer, message: dict[str, Any]) -> None:
        with self._lock:
            v.outbuf += encode(message)
            v.limit = max(v.limit, len(v.outbuf))

    def _write(self, fd: int) -> None:
        with self._lock:
            v = self._viewers.get(fd)
            if v is None or not v.outbuf:
                return
            try:
                sent = v.sock.send(v.outbuf[:1 << 20])
            except (BlockingIOError, InterruptedError):
                return
            except OSError:
                self._forget(fd, v)
                return
            del v.outbuf[:sent]
            v.limit = max(self._buffer_bytes, v.limit - sent)
            if v.replaying:
                self._feed_replay(v)

    def _drop(self, fd: int, v: _Viewer, why: str) -> None:
        """Called with the lock held, from any thread: the server thread closes the socket."""
        if v.dropped:
            return
        v.dropped = True
        v.outbuf.clear()
        self.dropped_viewers += 1
        text = f"dropped viewer {v.addr}: {why} ({self.dropped_viewers} dropped so far)"
        log.warning("%s", text)
        self._warnings.append(text)

    def _forget(self, fd: int, v: _Viewer) -> None:
        """Called with the lock held."""
        self._viewers.pop(fd, None)
        try:
            self._sel.unregister(v.sock)
        except (KeyError, ValueError):
            pass
        try:
            v.sock.close()
        except OSError:
            pass


def stop_reason(msg: dict[str, Any]) -> str:
    """Why the run stops, for a viewer's stop message: ``{"type": "stop", "by": WHO}`` names the
    viewer (printable text, at most 200 characters; anything else is left out)."""
    by = msg.get("by")
    if isinstance(by, str) and by.strip() and by.isprintable() and len(by) <= 200:
        return f"stop command from {by.strip()}"
    return "stop command from a viewer"


def rank0_telemetry(cfg: RunConfig, run_dir: Path, world_size: int, stop: StopFlag,
                    ) -> Telemetry:
    """Rank 0's metrics file and live server for a run (built-in or script): a viewer's stop
    is the agreed stop, a profile ask is answered from the first connection on."""
    return Telemetry(run_dir, welcome_extra={"world_size": world_size, "config": cfg.to_dict()},
                     on_stop=stop.request,
                     commands={"profile": partial(answer, stop.profile, run_dir)},
                     port=cfg.monitor_port if cfg.telemetry else None,
                     host=cfg.monitor_host, buffer_bytes=cfg.monitor_buffer_bytes)
