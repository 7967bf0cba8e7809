"""Heartbeats and the hang hint worded from them."""

from __future__ import annotations

import time
from pathlib import Path

from ddp_engine.common.heartbeat import Heartbeat, failure_hint, hang_hint, read_heartbeats


def _beat(rank: int, step: int, phase: str, since: float, at: float) -> dict:
    return {"rank": rank, "step": step, "phase": phase, "phase_since": since, "time": at}


def _cuda(rank: int, step: int, phase: str, since: float, at: float, synced: int) -> dict:
    """A heartbeat as a rank training on a GPU writes it: its last host-device sync too."""
    return {**_beat(rank, step, phase, since, at), "device": "cuda", "synced_step": synced}


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


def test_on_cuda_a_rank_whose_host_ran_ahead_is_not_blamed_for_its_peers_hang() -> None:
    """Rank 1 hangs inside its backward of step 6. Rank 0's backward returned once its
    all-reduce was queued, and its host went on into the forward of step 7 while its GPU
    waits in that all-reduce: rank 0 is ahead and has not synced since step 4."""
    now = 1000.0
    beats = {0: _cuda(0, 6, "forward", 960.0, now - 0.5, synced=4),
             1: _cuda(1, 5, "backward", 958.0, now - 0.4, synced=4)}
    assert hang_hint(beats, now) == "rank 1 is behind, at step 6"
    # The same beats without the GPU (or once rank 0 has synced at its step) blame rank 0,
    # whose host really is outside a collective.
    assert hang_hint({r: {**b, "device": "cpu"} for r, b in beats.items()}, now).startswith(
        "rank 0 has been in forward of step 7")
    synced = {**beats, 0: {**beats[0], "synced_step": 6}}
    assert hang_hint(synced, now).startswith("rank 0 has been in forward of step 7")


def test_on_cuda_the_rank_behind_is_named_among_ranks_waiting_on_host_and_gpu() -> None:
    """Rank 3's data loading hangs in step 7. Rank 0 blocked at the loss read of a reporting
    step; ranks 1 and 2 ran ahead until their GPUs' launch queues filled, in a forward."""
    now = 1000.0
    beats = {0: _cuda(0, 8, "report", 980.0, now, synced=5),
             1: _cuda(1, 9, "forward", 981.0, now, synced=5),
             2: _cuda(2, 9, "forward", 982.0, now, synced=5),
             3: _cuda(3, 6, "data", 958.0, now, synced=5)}
    assert hang_hint(beats, now) == (
        "rank 3 has been in data of step 7 for 42 s, while rank 0 waits in report (a "
        "collective) and ranks 1, 2 wait on their GPUs in a collective (the host queued work "
        "up to step 10): look at rank 3's log")


def test_a_failure_hint_reads_the_heartbeats_as_of_the_first_rank_gone_silent() -> None:
    """Rank 0 was aborted at 1000 (its last beat); rank 1, hung, beat on until it was ended."""
    beats = {0: _beat(0, 4, "backward", 990.0, 1000.0), 1: _beat(1, 4, "forward", 985.0, 1030.0)}
    assert failure_hint(beats) == ("rank 1 has been in forward of step 5 for 15 s, while rank 0 "
                                   "waits in backward (a collective): look at rank 1's log")
    assert failure_hint({0: beats[0]}) is None


def test_a_heartbeat_says_its_device_and_last_synced_step(tmp_path: Path) -> None:
    (tmp_path / "ranks").mkdir()
    hb = Heartbeat(tmp_path, rank=0)
    hb.enter("forward", 7)
    hb.synced(5)
    hb.write()
    assert read_heartbeats(tmp_path)[0]["device"] == "cpu"
    assert read_heartbeats(tmp_path)[0]["synced_step"] == 7  # a CPU host waits for its work
    hb.device = "cuda"
    hb.write()
    assert read_heartbeats(tmp_path)[0]["synced_step"] == 5
