"""Heartbeats and the hang hint worded from them."""

from __future__ import annotations

import time
from pathlib import Path

from ddp_engine.common.heartbeat import Heartbeat, hang_hint, read_heartbeats


def _beat(rank: int, step: int, phase: str, since: float, at: float) -> dict:
    return {"rank": rank, "step": step, "phase": phase, "phase_since": since, "time": at}


def test_the_rank_outside_a_collective_is_named() -> None:
    now = 1000.0
    beats = {0: _beat(0, 5, "backward", 960.0, now - 0.5),
             1: _beat(1, 5, "forward", 958.0, now - 0.4)}
    assert hang_hint(beats, now) == ("rank 1 has been in forward of step 6 for 42 s, while "
                                     "rank 0 waits in backward (a collective): look at rank "
                                     "1's log")


def test_a_frozen_process_is_named_by_its_stale_heartbeat() -> None:
    now = 1000.0
    beats = {0: _beat(0, 5, "backward", 960.0, now - 1), 1: _beat(1, 5, "forward", 950, 970)}
    assert hang_hint(beats, now).startswith("no heartbeat from rank 1 30 s ago")


def test_ranks_behind_are_named_and_agreement_names_nobody() -> None:
    now = 1000.0
    beats = {r: _beat(r, 7 if r else 6, "backward", 990.0, now) for r in range(3)}
    assert hang_hint(beats, now) == "rank 0 is behind, at step 7"
    same = {r: _beat(r, 7, "backward", 990.0, now) for r in range(3)}
    assert hang_hint(same, now) is None
    assert hang_hint({0: _beat(0, 1, "forward", 1, now)}, now) is None


def test_a_heartbeat_thread_writes_the_phase_and_step(tmp_path: Path) -> None:
    (tmp_path / "ranks").mkdir()
    hb = Heartbeat(tmp_path, rank=3, interval_s=0.05)
    hb.start()
    hb.enter("optimizer", 41)
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        beat = read_heartbeats(tmp_path).get(3)
        if beat and beat["phase"] == "optimizer":
            break
        time.sleep(0.02)
    hb.close()
    assert beat["step"] == 41 and beat["phase"] == "optimizer" and beat["rank"] == 3
    assert not list((tmp_path / "ranks").glob("*.tmp"))
