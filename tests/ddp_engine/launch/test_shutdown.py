"""The launcher's shutdown timeout, which a checkpoint save holds off (real processes, a
clock the test moves)."""

from __future__ import annotations

import subprocess
import sys
import time
from collections.abc import Iterator

import psutil
import pytest

from ddp_engine.launch.shutdown import ShutdownClock


@pytest.fixture
def sleepers() -> Iterator[list[subprocess.Popen[bytes]]]:
    """Two idle processes standing for rank 0 and rank 1."""
    procs = [subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
             for _ in range(2)]
    try:
        yield procs
    finally:
        for p in procs:
            p.kill()
            p.wait()


def _ranks(procs: list[subprocess.Popen[bytes]], *states: str) -> tuple[dict, dict]:
    """Rank files and the monitor's process table for ``procs`` (rank r is procs[r])."""
    ranks = {r: {"rank": r, "pid": p.pid, "state": s}
             for r, (p, s) in enumerate(zip(procs, states, strict=True))}
    return ranks, {p.pid: psutil.Process(p.pid) for p in procs}


def test_a_save_holds_the_shutdown_timeout_off_until_it_ends(sleepers) -> None:
    now = [0.0]
    said: list[str] = []
    clock = ShutdownClock(5.0, said.append, clock=lambda: now[0])
    ranks, procs = _ranks(sleepers, "running", "running")
    beats = {0: {"rank": 0, "phase": "save", "time": time.time()},
             1: {"rank": 1, "phase": "checkpoint", "time": time.time()}}
    assert clock.poll_once(ranks, procs, lambda: beats) == []  # no shutdown yet
    clock.start("a stop signal")
    now[0] = 100.0  # long past the timeout, but rank 0 writes and rank 1 waits for it
    assert clock.poll_once(ranks, procs, lambda: beats) == []
    assert said == ["ranks 0, 1 are in a checkpoint save: the shutdown timeout (5 s) counts "
                    "from its end"]
    beats = {r: {**b, "phase": "stop_check"} for r, b in beats.items()}  # the save ended
    now[0] = 104.0
    assert clock.poll_once(ranks, procs, lambda: beats) == []
    now[0] = 105.5
    assert clock.poll_once(ranks, procs, lambda: beats) == [0, 1]
    assert [p.wait(timeout=10) for p in sleepers] == [-9, -9]
    assert "ranks 0, 1 still running 5 s after the shutdown began (a stop signal)" in said[-1]


def test_a_stale_heartbeat_in_a_save_does_not_hold_it_off(sleepers) -> None:
    now = [0.0]
    clock = ShutdownClock(5.0, lambda _line: None, clock=lambda: now[0])
    ranks, procs = _ranks(sleepers, "running", "running")
    frozen = {0: {"rank": 0, "phase": "save", "time": time.time() - 60}}  # a SIGSTOPped save
    clock.start("a stop signal")
    now[0] = 6.0
    assert clock.poll_once(ranks, procs, lambda: frozen) == [0, 1]


def test_a_rank_that_died_starts_the_timeout_and_a_finished_one_does_not(sleepers) -> None:
    now = [0.0]
    clock = ShutdownClock(5.0, lambda _line: None, clock=lambda: now[0])
    ranks, procs = _ranks(sleepers, "completed", "running")
    sleepers[0].kill()
    sleepers[0].wait()
    assert clock.poll_once(ranks, procs, dict) == [] and clock.deadline is None
    ranks[0]["state"] = "running"  # gone without saying it finished: torchrun ends the rest
    assert clock.poll_once(ranks, procs, dict) == [] and clock.deadline == 5.0
    assert clock.why == "rank 0 ended while running"
    now[0] = 5.0
    assert clock.poll_once(ranks, procs, dict) == [1]
    assert sleepers[1].wait(timeout=10) == -9
