"""The live telemetry protocol (standard library only): messages and a blocking client.

Newline-delimited JSON over TCP on 127.0.0.1, one UTF-8 object per line, each with "type".
See docs/PROTOCOL.md. The app and the command line use :class:`Connection`.
"""

from __future__ import annotations

import json
import os
import socket
from pathlib import Path
from typing import Any

PROTOCOL_VERSION = 1
MONITOR_FILE = "monitor.json"
MAX_LINE_BYTES = 64 * 1024
"""Client lines longer than this are ignored by the server."""


class ProtocolError(RuntimeError):
    """The server refused us, went away, or sent something that is not the protocol."""


def encode(message: dict[str, Any]) -> bytes:
    return (json.dumps(message, separators=(",", ":"), allow_nan=False) + "\n").encode()


def decode(line: bytes | str) -> dict[str, Any] | None:
    """One message, or None for a line that is not a JSON object with a string "type"."""
    try:
        obj = json.loads(line)
    except (ValueError, UnicodeDecodeError):
        return None
    if not isinstance(obj, dict) or not isinstance(obj.get("type"), str):
        return None
    return obj


def hello(token: str) -> dict[str, Any]:
    return {"type": "hello", "token": token, "protocol": PROTOCOL_VERSION}


def read_monitor_file(run_dir: str | os.PathLike[str]) -> dict[str, Any]:
    """RUN_DIR/monitor.json: {"host", "port", "token", "pid"}.

    Raises:
        ProtocolError: missing or unreadable (the run has not started serving, or never did).
    """
    path = Path(run_dir) / MONITOR_FILE
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
        return {"host": str(data["host"]), "port": int(data["port"]),
                "token": str(data["token"]), "pid": int(data["pid"])}
    except (OSError, ValueError, KeyError, TypeError) as e:
        raise ProtocolError(f"no live telemetry for {run_dir}: {path} is missing or unreadable "
                            f"({type(e).__name__})") from None


class Connection:
    """A viewer's connection: hello, welcome, then messages in order.

    Args:
        run_dir: the run folder, whose monitor.json says where and with which token.
        timeout_s: socket timeout for connecting and for each blocking read.
        token: a token to use instead of monitor.json's (tests).
    """

    def __init__(self, run_dir: str | os.PathLike[str], timeout_s: float = 10.0,
                 token: str | None = None) -> None:
        info = read_monitor_file(run_dir)
        try:
            self.sock = socket.create_connection((info["host"], info["port"]), timeout=timeout_s)
            self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)  # commands: small
        except OSError as e:
            raise ProtocolError(f"cannot connect to the run's telemetry at {info['host']}:"
                                f"{info['port']}: {e}") from None
        self._buf = bytearray()
        self._lines: list[dict[str, Any]] = []
        self.send(hello(info["token"] if token is None else token))
        try:
            welcome = self.receive()
        except TimeoutError:
            welcome = None
        if welcome is None or welcome.get("type") != "welcome":
            self.close()
            raise ProtocolError("the server closed the connection instead of welcoming us "
                                "(wrong token or protocol version?)")
        self.welcome = welcome

    def send(self, message: dict[str, Any]) -> None:
        self.sock.sendall(encode(message))

    def _split(self) -> None:
        while (nl := self._buf.find(b"\n")) >= 0:
            msg = decode(bytes(self._buf[:nl]))
            del self._buf[:nl + 1]
            if msg is not None:
                self._lines.append(msg)

    def _fill(self) -> bool:
        """One recv (blocking up to the socket timeout). False when the server closed."""
        try:
            data = self.sock.recv(1 << 16)
        except TimeoutError:
            raise
        except OSError:
            return False
        if not data:
            return False
        self._buf += data
        self._split()
        return True

    def receive(self) -> dict[str, Any] | None:
        """The next message; None when the server closed the connection.

        Raises:
            TimeoutError: nothing arrived within the socket timeout.
        """
        while not self._lines:
            if not self._fill():
                return None
        return self._lines.pop(0)

    def poll(self, timeout_s: float) -> list[dict[str, Any]] | None:
        """Messages that arrive within ``timeout_s`` (maybe none); None once the server closed."""
        if not self._lines:
            previous = self.sock.gettimeout()
            self.sock.settimeout(timeout_s)
            try:
                if not self._fill():
                    return None
            except TimeoutError:
                pass
            finally:
                self.sock.settimeout(previous)
        out, self._lines = self._lines, []
        return out

    def close(self) -> None:
        self.sock.close()

    def __enter__(self) -> Connection:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
