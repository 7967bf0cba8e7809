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
    """RUN_DIR/monitor.json: {"host", "listen", "port", "token", "pid"} ("listen": the
    address the server is bound to, "host" where to connect from its machine).

    Raises:
        ProtocolError: missing or unreadable (the run has not started serving, or never did).
    """
    path = Path(run_dir) / MONITOR_FILE
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
        return {"host": str(data["host"]), "listen": str(data.get("listen", data["host"])),
                "port": int(data["port"]), "token": str(data["token"]), "pid": int(data["pid"])}
    except (OSError, ValueError, KeyError, TypeError) as e:
        raise ProtocolError(f"no live telemetry for {run_dir}: {path} is missing or unreadable "
                            f"({type(e).__name__})") from None


def check_address(host: str, port: int, token: str) -> None:
    """Check a viewer's explicit address and token (rank 0 on another machine, reached through
    ``ssh -L``).

    Raises:
        ValueError: naming the field, the value and what is allowed.
    """
    if not isinstance(host, str) or not host.strip():
        raise ValueError(f"host must be a host name or IP address, got {host!r}")
    if isinstance(port, bool) or not isinstance(port, int) or not 1 <= port <= 65535:
        raise ValueError(f"port must be a whole number between 1 and 65535, got {port!r}")
    if not isinstance(token, str) or not token.strip():
        raise ValueError(f"token must be the non-empty token of the run's monitor.json, "
                         f"got {token!r}")


class Connection:
    """A viewer's connection: hello, welcome, then messages in order.

    Either a run folder (its monitor.json says where and with which token) or an explicit
    address and token (:meth:`to`, for rank 0 on another machine).

    Args:
        run_dir: the run folder, whose monitor.json says where and with which token; None
            with ``host``, ``port`` and ``token`` given.
        timeout_s: socket timeout for connecting and for each blocking read.
        token: a token to use instead of monitor.json's (tests), or the token of ``host``.
        host: the server's address when there is no run folder here.
        port: the server's TCP port when there is no run folder here.

    Raises:
        ProtocolError: no monitor.json, nothing listening, or no welcome (wrong token?).
        ValueError: an explicit address or token that cannot be right (see check_address).
    """

    def __init__(self, run_dir: str | os.PathLike[str] | None = None, timeout_s: float = 10.0,
                 token: str | None = None, *, host: str | None = None,
                 port: int | None = None) -> None:
        if run_dir is not None:
            info = read_monitor_file(run_dir)
            host, port = info["host"], info["port"]
            token = info["token"] if token is None else token
        elif host is None or port is None or token is None:
            raise ValueError("Connection needs run_dir, or host, port and token")
        else:
            check_address(host, port, token)
        self.address = f"{host}:{port}"
        """Where the server is, "host:port" (for messages)."""
        try:
            self.sock = socket.create_connection((host, port), timeout=timeout_s)
            self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)  # commands: small
        except OSError as e:
            raise ProtocolError(f"cannot connect to the run's telemetry at {self.address}: "
                                f"{e}") from None
        self._buf = bytearray()
        self._lines: list[dict[str, Any]] = []
        try:
            self.send(hello(token))
            welcome = self.receive()
        except OSError:  # TimeoutError included: no answer in time
            welcome = None
        if welcome is None or welcome.get("type") != "welcome":
            self.close()
            raise ProtocolError(f"the server at {self.address} closed the connection instead "
                                "of welcoming us (wrong token or protocol version?)")
        self.welcome = welcome

    @classmethod
    def to(cls, host: str, port: int, token: str, timeout_s: float = 10.0) -> Connection:
        """Connect to ``host:port`` with ``token``, without a run folder (e.g. rank 0 on
        another machine, its port forwarded with ``ssh -L``)."""
        return cls(None, timeout_s, token, host=host, port=port)

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
