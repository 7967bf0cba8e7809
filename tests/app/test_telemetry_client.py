"""The telemetry viewer thread against a real in-process server (rank 0's Telemetry)."""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path

import pytest

from app.telemetry_client import TelemetryClient
from ddp_engine.rank.telemetry import Telemetry
from tests.conftest import free_port


@pytest.fixture
def server(tmp_path: Path) -> Iterator[Telemetry]:
    t = Telemetry(tmp_path, welcome_extra={"world_size": 2}, on_stop=lambda _why: None)
    yield t
    t.close()


def _stopped(client: TelemetryClient) -> None:
    client.request_stop()
    assert client.wait(5000)


def test_remote_client_gets_welcome_history_and_live_messages(qtbot, server: Telemetry) -> None:
    server.publish({"type": "metrics", "step": 5, "ranks": [{"rank": 0, "loss": 1.0}]})
    client = TelemetryClient.remote("127.0.0.1", server.port, server.token)
    assert client.run_dir is None
    got: list[dict] = []
    client.messages.connect(got.extend)
    with qtbot.waitSignal(client.welcomed, timeout=20_000) as welcomed:
        client.start()
    assert welcomed.args[0]["world_size"] == 2 and welcomed.args[0]["status"]["step"] == 5
    server.publish({"type": "metrics", "step": 10, "ranks": [{"rank": 0, "loss": 0.9}]})
    qtbot.waitUntil(lambda: [m.get("step") for m in got] == [5, 10], timeout=20_000)
    with qtbot.waitSignal(client.disconnected, timeout=20_000) as gone:
        server.close()
    assert gone.args[0] == "the run closed the connection"
    assert client.wait(5000)


def test_remote_client_with_the_wrong_token_fails_naming_the_address(qtbot,
                                                                     server: Telemetry) -> None:
    client = TelemetryClient.remote("127.0.0.1", server.port, "not-the-token",
                                    connect_timeout_s=1.0)
    with qtbot.waitSignal(client.failed, timeout=30_000) as failed:
        client.start()
    assert f"the server at 127.0.0.1:{server.port} closed the connection" in failed.args[0]
    assert "wrong token or protocol version?" in failed.args[0]
    _stopped(client)


def test_remote_client_retries_until_the_port_opens_then_connects(qtbot,
                                                                  tmp_path: Path) -> None:
    port = free_port()
    client = TelemetryClient.remote("127.0.0.1", port, "tok", connect_timeout_s=120.0)
    failed: list[str] = []
    client.failed.connect(failed.append)
    client.start()
    qtbot.wait(600)  # a few refused attempts
    t = Telemetry(tmp_path, welcome_extra={}, on_stop=lambda _why: None, port=port)
    t.token = "tok"  # the server's token is random; this test chooses it
    try:
        with qtbot.waitSignal(client.welcomed, timeout=30_000):
            pass
        assert failed == []
    finally:
        _stopped(client)
        t.close()


def test_remote_client_on_a_closed_port_fails_naming_it(qtbot) -> None:
    port = free_port()
    client = TelemetryClient.remote("127.0.0.1", port, "tok", connect_timeout_s=0.5)
    with qtbot.waitSignal(client.failed, timeout=30_000) as failed:
        client.start()
    assert f"cannot connect to the run's telemetry at 127.0.0.1:{port}" in failed.args[0]
    _stopped(client)


@pytest.mark.parametrize(("args", "message"), [
    (("127.0.0.1", 0, "tok"), "port must be a whole number between 1 and 65535, got 0"),
    (("127.0.0.1", 70000, "tok"), "port must be a whole number between 1 and 65535, got 70000"),
    (("127.0.0.1", 29600, ""), "token must be the non-empty token of the run's monitor.json"),
    (("", 29600, "tok"), "host must be a host name or IP address, got ''"),
])
def test_remote_client_refuses_bad_input(args: tuple, message: str) -> None:
    with pytest.raises(ValueError, match=re.escape(message)):
        TelemetryClient.remote(*args)


def test_a_local_client_without_deadline_waits_for_a_server_that_comes_late(
        qtbot, tmp_path: Path) -> None:
    """A multi-node run serves only once every node has joined: the app's client for a run it
    started keeps waiting (the controller stops it if the launcher ends first)."""
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    hurried = TelemetryClient(run_dir, connect_timeout_s=0.5)  # with a deadline: it gives up
    with qtbot.waitSignal(hurried.failed, timeout=20_000):
        hurried.start()
    assert hurried.wait(5000)
    client = TelemetryClient(run_dir, connect_timeout_s=None)
    failures: list[str] = []
    client.failed.connect(failures.append)
    client.start()
    try:
        qtbot.wait(1500)  # several connection attempts, no monitor.json yet
        assert failures == [] and client.isRunning()
        server = Telemetry(run_dir, welcome_extra={"world_size": 4}, on_stop=lambda _why: None)
        try:
            with qtbot.waitSignal(client.welcomed, timeout=20_000) as welcomed:
                pass
            assert welcomed.args[0]["world_size"] == 4
        finally:
            server.close()
    finally:
        _stopped(client)
