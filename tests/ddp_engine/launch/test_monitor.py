"""status.json as the launcher writes it: states at once and fsynced, progress at most every
PROGRESS_WRITE_S and not fsynced (ddp_engine/launch/monitor.py's StatusFile)."""

from __future__ import annotations

import io
import os
from pathlib import Path

import pytest

from ddp_engine.common import run_dir as run_dir_module
from ddp_engine.common.run_dir import read_status
from ddp_engine.launch import monitor
from ddp_engine.launch.monitor import StatusFile


@pytest.fixture
def fsyncs(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """The file descriptors os.fsync was called on by atomic_write (the real call still runs)."""
    calls: list[int] = []
    real = os.fsync

    def counted(fd: int) -> None:
        calls.append(fd)
        real(fd)

    monkeypatch.setattr(run_dir_module.os, "fsync", counted)
    return calls


def test_progress_waits_for_the_interval_and_a_state_change_writes_it_at_once(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, fsyncs: list[int]) -> None:
    monkeypatch.setattr(monitor, "PROGRESS_WRITE_S", 3600.0)
    status = StatusFile(tmp_path)
    assert len(fsyncs) == 1  # the first write is durable
    status.progress(step=5, epoch=0)
    status.flush()
    got = read_status(tmp_path)
    assert got is not None and got["step"] == 0  # held back: the interval has not passed
    status.update(state="running")
    got = read_status(tmp_path)
    assert got is not None and (got["state"], got["step"]) == ("running", 5)
    assert len(fsyncs) == 2  # the state change, with the progress it carried


def test_progress_is_written_unsynced_once_the_interval_passed(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, fsyncs: list[int]) -> None:
    monkeypatch.setattr(monitor, "PROGRESS_WRITE_S", 0.0)
    status = StatusFile(tmp_path)
    for step in (10, 20, 30):
        status.progress(step=step, last_metrics={"step": step})
        got = read_status(tmp_path)
        assert got is not None and got["step"] == step
        assert got["last_metrics"] == {"step": step}
    assert len(fsyncs) == 1  # only the first, durable write
    status.progress(step=30, last_metrics={"step": 30})  # nothing new: no write at all
    status.update(state="completed", step=30)
    status.progress(step=99)  # after the end: ignored
    status.flush()
    got = read_status(tmp_path)
    assert got is not None and (got["state"], got["step"]) == ("completed", 30)
    assert len(fsyncs) == 2


def test_a_real_run_ends_with_its_last_step_in_status_json(tmp_path: Path) -> None:
    """A short real run (2 CPU ranks): whatever progress was held back, the final status has
    the last step and the last metrics."""
    import subprocess
    import sys

    run = tmp_path / "run"
    proc = subprocess.run([sys.executable, "-m", "ddp_engine", "launch", "--nproc", "2",
                           "--device", "cpu", "--max-steps", "30", "--log-every", "10",
                           "--eval-every", "0", "--run-dir", str(run)],
                          capture_output=True, text=True, timeout=240)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    got = read_status(run)
    assert got is not None
    assert (got["state"], got["step"]) == ("completed", 30)
    assert got["last_metrics"]["step"] == 30


def test_an_update_from_a_signal_handler_inside_an_update_goes_through(tmp_path: Path) -> None:
    """The launcher's signal handlers poll the monitor on the main thread (a second Ctrl+C
    forces the run down from there) while that thread may be inside an update already (the
    first Ctrl+C's poll): with a plain lock the launcher deadlocked there (CI, 2026-12-06)."""
    import signal

    status = StatusFile(tmp_path)
    handled: list[bool] = []

    def second_ctrl_c(_signum: int, _frame: object) -> None:
        status.update(state="stopping")
        handled.append(True)

    def give_up(_signum: int, _frame: object) -> None:
        raise TimeoutError("the update inside an update did not go through in 10 s")

    old = signal.signal(signal.SIGUSR2, second_ctrl_c)
    old_alarm = signal.signal(signal.SIGALRM, give_up)
    signal.alarm(10)
    try:
        with status._lock:  # the main thread inside an update
            os.kill(os.getpid(), signal.SIGUSR2)
            while not handled:  # the handler runs here, on this thread
                pass
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGUSR2, old)
        signal.signal(signal.SIGALRM, old_alarm)
    got = read_status(tmp_path)
    assert got is not None and got["state"] == "stopping"


def test_a_check_that_breaks_turns_itself_off_and_says_so(tmp_path: Path) -> None:
    """The monitor's per-poll checks (the node watch's) must not take the monitor down."""
    out = io.StringIO()
    mon = monitor.RunMonitor(tmp_path, StatusFile(tmp_path), out)
    calls: list[int] = []

    def lost_node_check() -> None:
        calls.append(1)
        raise OSError("the store went away")

    mon.each_poll.append(lost_node_check)
    mon.each_poll.append(lambda: calls.append(2))
    mon.poll_once()
    mon.poll_once()
    assert calls == [1, 2, 2] and len(mon.each_poll) == 1
    assert ("warning: lost_node_check failed and is off for the rest of this run: OSError: the "
            "store went away") in out.getvalue()
