"""The agreed stop in a real two-process gloo group: every rank stops after the same step, and
slow steps are checked often enough that a stop waits about one step."""

from __future__ import annotations

import json
import math
import os
import socket
import time
from pathlib import Path

import pytest
import torch.distributed as dist
import torch.multiprocessing as mp

from ddp_engine.common.config import RunConfig
from ddp_engine.common.config_values import NODE_RANK_ENV
from ddp_engine.rank.distributed import (
    LOST_LAUNCHER,
    STOP_CHECK_S,
    DistInfo,
    StopFlag,
)
from ddp_engine.rank.report_pace import ReportPace


def _rank(rank: int, port: int, slow_s: float, out: str, lost: bool = False) -> None:
    """Rank ``rank`` of 2: steps of ``slow_s`` on rank 1 (none on rank 0); rank 0 asks to stop
    before its step 8 (``lost``: rank 1 does, as when node 1's launcher dies). Writes the
    steps it checked at, the one it stopped after, and the reason and failure it got."""
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    os.environ[NODE_RANK_ENV] = str(rank)  # as if each rank were a node of its own
    dist.init_process_group("gloo", rank=rank, world_size=2)
    try:
        flag = StopFlag(5, dist.group.WORLD)
        stopped = None
        for step in range(1, 40):
            if rank == 1:
                time.sleep(slow_s)  # the step's work
            if rank == 0 and step == 8 and not lost:
                flag.request("test")
            if rank == 1 and step == 8 and lost:
                flag.request("orphaned", LOST_LAUNCHER + 1)
            flag.after_step(step)
            if flag.stopping:
                stopped = step
                break
        Path(out, f"rank{rank}.json").write_text(json.dumps({
            "rounds": flag.rounds, "stopped": stopped, "reason": flag.reason,
            "failure": flag.failure}))
    finally:
        dist.destroy_process_group()


def _run(tmp_path: Path, slow_s: float, lost: bool = False) -> list[dict]:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    mp.start_processes(_rank, args=(port, slow_s, str(tmp_path), lost), nprocs=2, join=True,
                       start_method="spawn")
    return [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in range(2)]


def test_fast_steps_are_checked_every_n_steps_and_read_a_round_later(tmp_path: Path) -> None:
    ranks = _run(tmp_path, slow_s=0.0)
    assert ranks[0] == ranks[1]  # the same rounds, the same stop step, the same reason
    # the first round is read at once; later ones at the next round, so the request made
    # before step 8 goes out with round 10, which is read, and agreed, at step 15
    assert ranks[0] == {"rounds": [5, 10], "stopped": 15, "reason": "test",
                        "failure": None}


def test_slow_steps_on_one_rank_are_checked_every_step_on_all(tmp_path: Path) -> None:
    ranks = _run(tmp_path, slow_s=0.3)
    assert ranks[0] == ranks[1]
    # from the first check on, the slowest rank's 0.3 s per step sets the pace: every step
    # (each round read at once: a round later would delay a stop by 0.3 s, over LAG_S)
    assert ranks[0] == {"rounds": [5, 6, 7, 8], "stopped": 8, "reason": "test", "failure": None}


@pytest.mark.parametrize(("per_step_s", "steps"), [(0.0, 5), (0.01, 5), (STOP_CHECK_S / 3.5, 3),
                                                   (STOP_CHECK_S, 1), (30.0, 1)])
def test_the_check_interval_is_at_most_every_and_about_stop_check_s(per_step_s: float,
                                                                    steps: int) -> None:
    assert StopFlag(5).interval(per_step_s) == steps


def _paced_rank(rank: int, port: int, slow_s: float, out: str) -> None:
    """Rank ``rank`` of 2 as the loop drives the flag with paced reports (log_every 3, at least
    0.1 s apart, checks with the reports): steps of ``slow_s`` on rank 1, none on rank 0. Writes
    the reporting steps, the pace each report's schedule was made with, and the rounds."""
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=2)
    try:
        flag = StopFlag(0, dist.group.WORLD, log_every=3, report_s=0.1)
        reports, paces = [], []
        for step in range(1, 121):
            if rank == 1:
                time.sleep(slow_s)
            due = flag.report_due(step)
            row = (lambda at=step: [float(at)]) if due else None
            flag.after_step(step, row, flush=step == 120)
            if due:
                reports.append(step)
                paces.append(flag._per_step_s)
        Path(out, f"rank{rank}.json").write_text(json.dumps(
            {"reports": reports, "paces": paces, "rounds": flag.rounds}))
    finally:
        dist.destroy_process_group()


def _run_paced(tmp_path: Path, slow_s: float) -> list[dict]:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    mp.start_processes(_paced_rank, args=(port, slow_s, str(tmp_path)), nprocs=2, join=True,
                       start_method="spawn")
    return [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in range(2)]


@pytest.mark.parametrize("slow_s", [0.004, 0.06])
def test_paced_reports_fall_on_multiples_at_least_report_s_apart_alike_on_every_rank(
        tmp_path: Path, slow_s: float) -> None:
    ranks = _run_paced(tmp_path, slow_s)
    assert ranks[0] == ranks[1]  # the same reporting steps, paces and rounds everywhere
    reports, paces = ranks[0]["reports"], ranks[0]["paces"]
    assert reports[0] == 3 and all(s % 3 == 0 for s in reports)
    for at, nxt, pace in zip(reports, reports[1:], paces, strict=False):
        # the first multiple of 3 at least 0.1 s on, at the pace the rounds had agreed
        gap = math.ceil(0.1 / pace) if pace else 1
        assert nxt == -(-(at + gap) // 3) * 3, (at, nxt, pace)
    if slow_s < 0.01:  # short steps: reports skip multiples, and a round goes with each alone
        assert len(reports) < 120 // 3 / 3, reports
        assert set(ranks[0]["rounds"]) <= set(reports) | {120}, ranks[0]["rounds"]
    else:  # 60 ms steps: every multiple reports (0.18 s apart), and a stop waits < 0.5 s
        assert reports == list(range(3, 121, 3))
        rounds = ranks[0]["rounds"]
        assert max(b - a for a, b in zip(rounds, rounds[1:], strict=False)) <= 8


def test_report_pace_is_timed_by_default_and_exact_when_log_every_is_given() -> None:
    default, given = ReportPace.of(RunConfig()), ReportPace.of(RunConfig(log_every=3))
    assert (default.every, default.seconds) == (10, 0.2)
    assert (given.every, given.seconds) == (3, 0.0)
    flag = StopFlag.from_config(RunConfig(log_every=3))
    assert [s for s in range(1, 10) if flag.report_due(s)] == [3, 6, 9]  # nothing read yet


def test_a_lost_launcher_stops_every_rank_as_a_failure_naming_its_node(tmp_path: Path) -> None:
    ranks = _run(tmp_path, 0.0, lost=True)
    assert ranks[0]["stopped"] == ranks[1]["stopped"] == 15
    assert [r["failure"] for r in ranks] == ["the launcher of node 1 died"] * 2
    assert [r["reason"] for r in ranks] == ["the launcher of node 1 died"] * 2


def test_ranks_are_numbered_by_node_rank_not_by_the_rendezvous(monkeypatch) -> None:
    # torchrun's rendezvous put this node second (its ranks 2, 3); the user made it node 0.
    monkeypatch.setenv("RANK", "3")
    monkeypatch.setenv("LOCAL_RANK", "1")
    monkeypatch.setenv("WORLD_SIZE", "4")
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "2")
    monkeypatch.setenv("GROUP_RANK", "1")
    monkeypatch.setenv(NODE_RANK_ENV, "0")
    info = DistInfo.from_env()
    assert (info.rank, info.local_rank, info.node_rank, info.world_size) == (1, 1, 0, 4)
    assert os.environ["RANK"] == "1"
    monkeypatch.setenv("GROUP_WORLD_SIZE", "2")
    monkeypatch.setenv(NODE_RANK_ENV, "2")  # a third node in a run of two
    with pytest.raises(RuntimeError, match=r"node_rank: '2' does not fit this run of 2 nodes "
                                           r"and 4 ranks \(2 on this node\)"):
        DistInfo.from_env()
    monkeypatch.setenv(NODE_RANK_ENV, "1")
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "1")  # 1 process here, so 3 on the other node
    monkeypatch.setenv("LOCAL_RANK", "0")
    with pytest.raises(RuntimeError, match="every node must run the same number of processes"):
        DistInfo.from_env()
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "2")
    monkeypatch.setenv("TORCHELASTIC_USE_AGENT_STORE", "False")
    with pytest.raises(RuntimeError, match="unset TORCH_DISABLE_SHARE_RDZV_TCP_STORE"):
        DistInfo.from_env()
    monkeypatch.setenv(NODE_RANK_ENV, "")  # left empty: one node, torchrun's numbers
    monkeypatch.setenv("RANK", "3")
    assert DistInfo.from_env().rank == 3
    monkeypatch.delenv(NODE_RANK_ENV)
    monkeypatch.setenv("RANK", "3")
    assert DistInfo.from_env().rank == 3  # one node, or torchrun alone: torchrun's numbers


ORPHAN = """
import datetime, os, subprocess, sys
if sys.argv[1] == "parent":  # starts the rank, says its pid, then waits to be killed
    child = subprocess.Popen([sys.executable, "-c", sys.argv[2], "rank", sys.argv[2]])
    print(child.pid, flush=True)
    child.wait()
    sys.exit(0)
from ddp_engine.common.lifeline import arm_parent_death
arm_parent_death()
from torch.distributed import TCPStore
from ddp_engine.rank.distributed import StopFlag
StopFlag(10).install_signal_handlers(grace_s=2)
store = TCPStore("127.0.0.1", 0, 1, True, timeout=datetime.timedelta(seconds=600))
store.wait(["never set"])  # blocked in C++: no Python signal handler runs until it returns
"""


def test_a_rank_blocked_in_a_c_call_still_dies_when_its_launcher_does(tmp_path: Path) -> None:
    """The parent-death signal's Python handler cannot run while the rank's main thread is
    blocked in C++ (a store wait, a collective with a dead peer: up to the group's timeout,
    30 minutes by default); a thread of the rank sees the parent gone and the rank ends
    itself after its grace period, instead of staying behind as an orphan."""
    import subprocess
    import sys

    import psutil

    from tests.conftest import REPO, engine_env

    parent = subprocess.Popen([sys.executable, "-c", ORPHAN, "parent", ORPHAN],
                              stdout=subprocess.PIPE, text=True, cwd=REPO, env=engine_env())
    try:
        rank = psutil.Process(int(parent.stdout.readline()))
        time.sleep(3)  # the rank is in its store wait
        assert rank.is_running() and rank.status() != psutil.STATUS_ZOMBIE
        parent.kill()
        parent.wait()
        gone, _ = psutil.wait_procs([rank], timeout=30)
        assert gone, "the rank outlived its launcher by 30 s (grace 2 s)"
    finally:
        parent.kill()
        for p in psutil.process_iter(["cmdline"]):
            if "never set" in " ".join(p.info["cmdline"] or []):
                p.kill()
