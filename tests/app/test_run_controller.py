"""The run controller's remote mode against a real in-process rank-0 server (Telemetry): the
state follows the messages, Stop is the agreed stop over the socket, and the end is reported
once, as the run's last final event says, or "disconnected" when the connection ended first."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from app.run_controller import RunController
from ddp_engine.rank.telemetry import Telemetry
from tests.conftest import free_port


@pytest.fixture
def server(tmp_path: Path) -> Iterator[Telemetry]:
    stops: list[int] = []
    t = Telemetry(tmp_path, welcome_extra={"world_size": 2}, on_stop=lambda _why: stops.append(1))
    t.stops = stops  # type: ignore[attr-defined]
    yield t
    t.close()


@pytest.fixture
def controller(qtbot) -> Iterator[RunController]:
    c = RunController()
    yield c
    if c.client is not None:
        c.client.request_stop()
        c.client.wait(5000)


def _metrics(step: int) -> dict:
    return {"type": "metrics", "step": step, "epoch": 0,
            "ranks": [{"rank": 0, "loss": 1.0}, {"rank": 1, "loss": 1.1}]}


def _attached(qtbot, controller: RunController, server: Telemetry) -> None:
    with qtbot.waitSignal(controller.welcomed, timeout=30_000):
        controller.attach_remote("127.0.0.1", server.port, server.token)
        assert controller.state == "starting" and controller.active
    assert controller.remote == f"127.0.0.1:{server.port}"
    assert controller.run_dir is None and controller.launcher is None


def test_stop_is_the_agreed_stop_and_the_end_comes_from_the_final_event(
        qtbot, controller: RunController, server: Telemetry) -> None:
    server.publish(_metrics(5))
    ends: list[dict] = []
    controller.finished.connect(ends.append)
    notices: list[str] = []
    controller.notice.connect(notices.append)
    _attached(qtbot, controller, server)
    qtbot.waitUntil(lambda: controller.state == "running", timeout=30_000)
    controller.stop()
    assert controller.state == "stopping" and controller.stop_requested
    assert "all ranks will stop at the same step" in notices[-1]
    assert "no SIGTERM/SIGKILL from here" in notices[-1]
    qtbot.waitUntil(lambda: server.stops == [1], timeout=30_000)  # it went over the socket
    server.publish({"type": "event", "kind": "stopping", "step": 7,
                    "reason": "stop command from a viewer"})
    server.publish({"type": "event", "kind": "checkpoint_saved", "step": 7})
    server.publish({"type": "event", "kind": "stopped", "step": 7, "epoch": 0})
    with qtbot.waitSignal(controller.finished, timeout=30_000) as finished:
        server.close()
    result = finished.args[0]
    assert result == {"state": "stopped", "step": 7, "reason": "stop command from a viewer",
                      "remote": f"127.0.0.1:{server.port}", "launcher_exit_code": None,
                      "leftover_pids": []}
    assert controller.state == "stopped" and not controller.active
    qtbot.wait(300)
    assert len(ends) == 1  # once


def test_the_last_final_event_counts_a_failure_after_a_stop(
        qtbot, controller: RunController, server: Telemetry) -> None:
    _attached(qtbot, controller, server)
    server.publish({"type": "event", "kind": "stopped", "step": 3})
    server.publish({"type": "event", "kind": "failed", "rank": 0,
                    "error": "RunFailed: rank 1 failed; every rank stopped after step 3"})
    with qtbot.waitSignal(controller.finished, timeout=30_000) as finished:
        server.close()
    result = finished.args[0]
    assert result["state"] == "failed" and result["step"] == 3
    assert result["reason"].startswith("RunFailed: rank 1 failed")
    assert result["log_rank"] == 0 and result["log_tail"] == []


def test_a_connection_lost_before_the_end_is_disconnected_not_failed(
        qtbot, controller: RunController, server: Telemetry) -> None:
    server.publish(_metrics(10))
    _attached(qtbot, controller, server)
    with qtbot.waitSignal(controller.finished, timeout=30_000) as finished:
        server.close()
    result = finished.args[0]
    assert result["state"] == "disconnected" and result["step"] == 10
    assert result["reason"] == (f"lost the connection to rank 0 at 127.0.0.1:{server.port} "
                                "before the run ended (it may still be training)")
    assert controller.state == "disconnected" and not controller.active


def test_nothing_listening_ends_disconnected_naming_the_address(
        qtbot, controller: RunController) -> None:
    port = free_port()
    with qtbot.waitSignal(controller.finished, timeout=60_000) as finished:
        controller.attach_remote("127.0.0.1", port, "tok", connect_timeout_s=0.5)
    result = finished.args[0]
    assert result["state"] == "disconnected" and result["leftover_pids"] == []
    assert result["reason"].startswith(f"could not attach to rank 0 at 127.0.0.1:{port}: "
                                       "cannot connect")


def test_a_stop_before_the_welcome_goes_out_once_connected(
        qtbot, controller: RunController, tmp_path: Path) -> None:
    port = free_port()
    controller.attach_remote("127.0.0.1", port, "tok", connect_timeout_s=120.0)
    notices: list[str] = []
    controller.notice.connect(notices.append)
    controller.stop()
    assert "not connected to rank 0" in notices[-1] and controller.state == "stopping"
    stops: list[int] = []
    t = Telemetry(tmp_path, welcome_extra={}, on_stop=lambda _why: stops.append(1), port=port)
    t.token = "tok"  # the server's token is random; this test chooses it
    try:
        qtbot.waitUntil(lambda: stops == [1], timeout=30_000)
        assert "stop sent to rank 0" in notices[-1]
    finally:
        t.close()


def test_detach_leaves_a_remote_run_without_a_finished_signal(
        qtbot, controller: RunController, server: Telemetry) -> None:
    ends: list[dict] = []
    controller.finished.connect(ends.append)
    _attached(qtbot, controller, server)
    controller.detach()
    assert controller.state == "idle" and not controller.active
    qtbot.wait(500)  # the client's "disconnected" arrives, and is ignored
    assert ends == [] and controller.state == "idle"
    assert server.stops == []


def test_a_remote_attach_refuses_bad_input_and_a_second_run(
        qtbot, controller: RunController, server: Telemetry) -> None:
    with pytest.raises(ValueError, match="port must be a whole number between 1 and 65535, "
                                         "got 0"):
        controller.attach_remote("127.0.0.1", 0, server.token)
    assert controller.state == "idle"
    _attached(qtbot, controller, server)
    with pytest.raises(RuntimeError, match="a run is already active"):
        controller.attach_remote("127.0.0.1", server.port, server.token)
