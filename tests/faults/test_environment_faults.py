"""Faults of the machine around a run: ports taken, a folder that cannot be written."""

from __future__ import annotations

import socket
from pathlib import Path

import pytest

from ddp_engine.common.run_dir import read_status
from tests.conftest import processes_mentioning, run_engine
from tests.faults.conftest import fault_case


@fault_case("The monitor port given with --monitor-port is already in use",
            "bad input before any process starts: exit code 2, one line naming monitor_port, "
            "the port and what to do; no run folder")
def test_a_monitor_port_in_use_is_refused_before_start(tmp_path: Path,
                                                      observed: list[str]) -> None:
    with socket.create_server(("127.0.0.1", 0)) as taken:
        port = taken.getsockname()[1]
        done = run_engine("launch", "--nproc", "2", "--max-steps", "5", "--monitor-port",
                          str(port), "--run-dir", str(tmp_path / "run"))
    assert done.returncode == 2
    line = done.stderr.strip().splitlines()[-1]
    assert line == (f"error: monitor_port: port {port} on 127.0.0.1 is not free (Address "
                    "already in use); choose another, or 0 for a free one")
    assert not (tmp_path / "run").exists()
    observed.append(f"exit code 2: `{line}`; no folder written")


@fault_case("torchrun's default master port 29500 is already in use",
            "the run does not care: --standalone rendezvous picks a free port; it completes")
def test_the_default_master_port_in_use_does_not_matter(tmp_path: Path,
                                                        observed: list[str]) -> None:
    try:
        taken = socket.create_server(("0.0.0.0", 29500))
    except OSError:
        pytest.skip("port 29500 is taken by something else on this machine")
    with taken:
        done = run_engine("launch", "--nproc", "2", "--max-steps", "10",
                          "--run-dir", str(tmp_path / "run"))
    status = read_status(tmp_path / "run")
    assert done.returncode == 0 and status["state"] == "completed", done.stderr[-2000:]
    observed.append(f"completed at step {status['step']} with port 29500 held by another "
                    "socket")


@fault_case("The runs folder cannot be written (here: under /proc, refused even to root)",
            "bad input before any process starts: exit code 2, one line naming runs_dir and "
            "the system's reason; nothing started")
def test_an_unwritable_runs_folder_is_a_clear_error(tmp_path: Path,
                                                   observed: list[str]) -> None:
    where = "/proc/rankscope-runs"
    done = run_engine("launch", "--nproc", "2", "--max-steps", "5", "--runs-dir", where)
    line = done.stderr.strip().splitlines()[-1]
    assert done.returncode == 2
    assert line.startswith(f"error: runs_dir: cannot write the run folder under '{where}': ")
    assert not processes_mentioning(where)
    observed.append(f"exit code 2: `{line}`")
