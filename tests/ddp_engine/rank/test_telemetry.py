"""Rank 0's telemetry server, driven by real sockets (in-process, no training)."""

from __future__ import annotations

import json
import os
import re
import socket
import stat
import threading
from pathlib import Path

import pytest

from ddp_engine.common.protocol import MONITOR_FILE, Connection, ProtocolError, encode
from ddp_engine.common.run_dir import iter_metrics
from ddp_engine.rank.telemetry import Telemetry, stop_reason
from tests.conftest import wait_for


@pytest.fixture
def server(tmp_path: Path):
    stops: list[int] = []
    t = Telemetry(tmp_path, welcome_extra={"world_size": 2, "config": {"model": "mlp"}},
                  on_stop=lambda _why: stops.append(1), buffer_bytes=64 * 1024)
    t.stops = stops  # type: ignore[attr-defined]
    yield t
    t.close()


def _metrics(step: int, pad: int = 0) -> dict:
    return {"type": "metrics", "step": step, "epoch": 0,
            "ranks": [{"rank": 0, "loss": 1.0, "pad": "x" * pad}, {"rank": 1, "loss": 1.1}]}


def test_monitor_file_is_private_and_names_the_server(server: Telemetry, tmp_path: Path) -> None:
    path = tmp_path / MONITOR_FILE
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o600
    info = json.loads(path.read_text())
    assert info["host"] == "127.0.0.1" and info["port"] == server.port
    assert info["pid"] == os.getpid() and len(info["token"]) >= 32
    assert info["listen"] == "127.0.0.1"  # this machine only, by default


def test_a_server_open_to_other_machines_still_asks_for_the_token(tmp_path: Path) -> None:
    """--monitor-host 0.0.0.0: reachable at every address of the machine; a viewer here is
    pointed at 127.0.0.1, and a hello without the token is refused."""
    t = Telemetry(tmp_path, welcome_extra={}, on_stop=lambda _why: None, host="0.0.0.0")
    try:
        info = json.loads((tmp_path / MONITOR_FILE).read_text())
        assert (info["host"], info["listen"]) == ("127.0.0.1", "0.0.0.0")
        with Connection(tmp_path) as conn:
            assert conn.welcome["type"] == "welcome"
        with pytest.raises(ProtocolError, match="token"):
            Connection.to("127.0.0.1", t.port, "not-the-token", timeout_s=10)
    finally:
        t.close()


def test_hello_welcome_history_then_live(server: Telemetry, tmp_path: Path) -> None:
    server.publish(_metrics(10))
    server.publish({"type": "event", "kind": "epoch_start", "epoch": 1})
    with Connection(tmp_path) as conn:  # a late viewer
        w = conn.welcome
        assert w["protocol"] == 1 and w["world_size"] == 2 and w["config"] == {"model": "mlp"}
        assert w["status"]["step"] == 10 and w["status"]["state"] == "running"
        first = conn.receive()
        assert first["type"] == "metrics" and first["step"] == 10 and "time" in first
        assert conn.receive()["kind"] == "epoch_start"
        server.publish(_metrics(20))
        assert conn.receive()["step"] == 20
    assert [m.get("step") for m in iter_metrics(tmp_path)] == [10, None, 20]


def _raw(port: int) -> socket.socket:
    s = socket.create_connection(("127.0.0.1", port), timeout=5)
    return s


@pytest.mark.parametrize("first_line", [
    b'{"type":"hello","token":"wrong","protocol":1}\n',
    b'{"type":"hello","protocol":1}\n',
    b'{"type":"stop"}\n',
    b"not json at all\n",
])
def test_a_client_without_the_token_gets_nothing_and_cannot_stop(server: Telemetry,
                                                                first_line: bytes) -> None:
    server.publish(_metrics(10))
    s = _raw(server.port)
    s.sendall(first_line + b'{"type":"stop"}\n')
    assert s.recv(65536) == b""  # closed without a byte sent
    s.close()
    assert server.stops == []


def test_wrong_token_through_the_client_class(server: Telemetry, tmp_path: Path) -> None:
    with pytest.raises(ProtocolError, match="closed the connection instead of welcoming"):
        Connection(tmp_path, token="nope")


def test_connection_by_address_and_token_without_a_run_folder(server: Telemetry) -> None:
    """As a viewer on another machine does, its port forwarded with ssh -L: no monitor.json."""
    server.publish(_metrics(10))
    with Connection.to("127.0.0.1", server.port, server.token, timeout_s=10) as conn:
        assert conn.address == f"127.0.0.1:{server.port}"
        assert conn.welcome["world_size"] == 2 and conn.welcome["status"]["step"] == 10
        assert conn.receive()["step"] == 10  # the history
        conn.send({"type": "stop"})
        assert conn.receive()["type"] == "ack"
    assert server.stops == [1]
    with Connection(host="127.0.0.1", port=server.port, token=server.token) as conn:
        assert conn.welcome["type"] == "welcome"


def test_connection_by_address_with_the_wrong_token_names_it(server: Telemetry) -> None:
    with pytest.raises(ProtocolError, match=rf"the server at 127\.0\.0\.1:{server.port} closed "
                                            r"the connection instead of welcoming us \(wrong "
                                            r"token or protocol version\?\)"):
        Connection.to("127.0.0.1", server.port, "nope")
    assert server.stops == []


def test_connection_to_a_closed_port_names_it() -> None:
    from tests.conftest import free_port

    port = free_port()
    with pytest.raises(ProtocolError, match=rf"cannot connect to the run's telemetry at "
                                            rf"127\.0\.0\.1:{port}: .*refused"):
        Connection.to("127.0.0.1", port, "tok", timeout_s=5)


@pytest.mark.parametrize(("host", "port", "token", "message"), [
    ("127.0.0.1", 0, "tok", "port must be a whole number between 1 and 65535, got 0"),
    ("127.0.0.1", 65536, "tok", "port must be a whole number between 1 and 65535, got 65536"),
    ("127.0.0.1", 29600, " ", "token must be the non-empty token of the run's monitor.json, "
                              "got ' '"),
    (" ", 29600, "tok", "host must be a host name or IP address, got ' '"),
])
def test_connection_by_address_refuses_bad_input(host: str, port: int, token: str,
                                                 message: str) -> None:
    with pytest.raises(ValueError, match=re.escape(message)):
        Connection.to(host, port, token)


def test_malformed_and_oversized_lines_are_ignored(server: Telemetry, tmp_path: Path) -> None:
    with Connection(tmp_path) as conn:
        conn.sock.sendall(b"garbage\n[1,2]\n{\"no_type\":1}\n" + b"x" * 200_000 + b"\n")
        conn.send({"type": "ping"})
        assert conn.receive()["type"] == "pong"
        conn.send({"type": "stop"})
        ack = conn.receive()
        assert ack["type"] == "ack" and ack["command"] == "stop"
    assert server.stops == [1]


def test_a_viewer_that_never_reads_is_dropped_and_never_blocks(tmp_path: Path) -> None:
    server = Telemetry(tmp_path, welcome_extra={}, on_stop=lambda _why: None,
                       buffer_bytes=4 * 1024 * 1024)
    stuck = Connection(tmp_path)  # says hello, then never reads again
    stuck.sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    reader = Connection(tmp_path)
    got: list[int] = []

    def read_all() -> None:
        while (m := reader.receive()) is not None:
            if m["type"] == "metrics":
                got.append(m["step"])

    t = threading.Thread(target=read_all, daemon=True)
    t.start()
    for step in range(1, 20001):  # ~20 MB: beyond the socket buffers and the 4 MiB bound
        server.publish(_metrics(step, pad=1000))
    wait_for(lambda: server.dropped_viewers == 1, 10, "the stuck viewer to be dropped")
    wait_for(lambda: got and got[-1] == 20000, 30, "the reading viewer to get everything")
    assert got == list(range(1, 20001))  # the reader kept up and lost nothing
    warnings = [m for m in iter_metrics(tmp_path) if m.get("kind") == "warning"]
    assert len(warnings) == 1 and "dropped viewer" in warnings[0]["message"]
    stuck.close()
    reader.close()
    server.close()


def test_encode_refuses_nan() -> None:
    with pytest.raises(ValueError):
        encode({"type": "metrics", "loss": float("nan")})


@pytest.mark.slow
def test_live_run_viewers_and_stop_over_the_socket(tmp_path: Path) -> None:
    """A real 2-process gloo run: welcome, per-rank metrics, a stuck viewer that does not stall
    training, a wrong token that cannot stop it, a late viewer with history, then stop.
    (That a stuck viewer is dropped once its buffer fills is shown above, with megabytes.)"""
    from ddp_engine.common.run_dir import read_status
    from tests.conftest import endless_run, processes_mentioning

    args = ("--log-every", "5", "--monitor-buffer-bytes", "4096")
    with endless_run(tmp_path, *args) as (proc, run_dir):
        wait_for(lambda: (run_dir / MONITOR_FILE).exists(), 120, "monitor.json")
        stuck = Connection(run_dir)  # never reads after the welcome
        first = Connection(run_dir, timeout_s=60)
        assert first.welcome["world_size"] == 2
        assert first.welcome["config"]["nproc"] == 2
        metrics = []
        while len(metrics) < 3:
            m = first.receive()
            assert m is not None
            if m["type"] == "metrics":
                metrics.append(m)
        for m in metrics:
            assert [r["rank"] for r in m["ranks"]] == [0, 1]
            for r in m["ranks"]:
                assert r["sync_time_s"] > 0 and r["sync_bytes"] > 0 and r["sync_buckets"] >= 1
                assert r["device"] == "cpu" and r["gpu_util_pct"] is None
                for key in ("loss", "step_time_s", "samples_per_s", "data_wait_s", "forward_s",
                            "backward_s", "optimizer_s", "sync_exposed_s"):
                    assert r[key] is not None and r[key] >= 0, key
        # Device readings come from a 2 Hz sampler: null until its first reading.
        while not all((r["rss_bytes"] or 0) > 0 and r["cpu_pct"] is not None
                      for r in metrics[-1]["ranks"]):
            m = first.receive()
            assert m is not None
            if m["type"] == "metrics":
                metrics.append(m)
        info = json.loads((run_dir / MONITOR_FILE).read_text())
        intruder = _raw(info["port"])
        intruder.sendall(b'{"type":"hello","token":"guess","protocol":1}\n{"type":"stop"}\n')
        assert intruder.recv(1024) == b""
        intruder.close()
        # Training goes on: the stuck viewer and the intruder changed nothing.
        seen = metrics[-1]["step"]
        wait_for(lambda: (read_status(run_dir) or {}).get("step", 0) > seen + 100, 120,
                 "training to go on")
        assert read_status(run_dir)["state"] == "running"
        with Connection(run_dir, timeout_s=60) as late:
            replay = late.receive()
            assert replay["type"] == "event" and replay["kind"] == "run_start"
            steps = []
            while len(steps) < 3:
                m = late.receive()
                if m["type"] == "metrics":
                    steps.append(m["step"])
            assert steps == [5, 10, 15]  # the whole history, from the start
        first.send({"type": "stop"})
        kinds = []
        while (m := first.receive()) is not None:
            if m["type"] in ("ack", "event"):
                kinds.append(m.get("kind") or m["type"])
            if kinds and kinds[-1] == "stopped":
                break
        assert "ack" in kinds and kinds[-3:] == ["stopping", "checkpoint_saved", "stopped"]
        assert proc.wait(timeout=60) == 0
        first.close()
        stuck.close()
    status = read_status(run_dir)
    assert status["state"] == "stopped" and "stop command from a viewer" in status["reason"]
    assert (run_dir / "checkpoints" / "last.pt").is_file()
    assert not processes_mentioning(str(run_dir))


@pytest.mark.skipif(not os.path.exists("/dev/full"), reason="needs /dev/full (Linux)")
def test_a_full_disk_under_metrics_jsonl_is_named_once_then_quiet(tmp_path: Path) -> None:
    (tmp_path / "metrics.jsonl").symlink_to("/dev/full")  # every write: ENOSPC
    t = Telemetry(tmp_path, welcome_extra={"world_size": 1}, on_stop=lambda _why: None)
    try:
        t.publish(_metrics(1, pad=10_000))  # queued: the telemetry thread writes it
        with pytest.raises(OSError, match=r"metrics.jsonl cannot be appended to \(No space "
                                          r"left on device\): the run's record is incomplete"):
            t.flush()  # once written (and failed), the next publish or flush names it
        t.publish({"type": "event", "kind": "failed", "error": "x"})  # quiet from here
        assert t.flush()
    finally:
        t.close()


def test_a_message_json_cannot_hold_is_dropped_and_the_thread_goes_on(tmp_path: Path) -> None:
    t = Telemetry(tmp_path, welcome_extra={}, on_stop=lambda _why: None, port=None)
    try:
        t.publish({"type": "event", "kind": "odd", "value": object()})  # not JSON
        t.publish({"type": "event", "kind": "after"})
        assert t.flush()
    finally:
        t.close()
    assert [m.get("kind") for m in iter_metrics(tmp_path)] == ["after"]


def test_a_stop_names_the_viewer_that_sent_it() -> None:
    assert stop_reason({"type": "stop", "by": "the Rankscope window (pid 7 on h)"}) == (
        "stop command from the Rankscope window (pid 7 on h)")
    for by in (None, "", "x" * 201, "two\nlines", 42):
        assert stop_reason({"type": "stop", "by": by}) == "stop command from a viewer"
