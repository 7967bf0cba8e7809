"""A rank or the launcher dies, raises or hangs: the run ends, named, with nothing left."""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

import pytest
import torch

from ddp_engine.common.gpus import gpu_count, gpu_leftovers, gpu_processes
from ddp_engine.common.heartbeat import read_heartbeats
from ddp_engine.common.run_dir import rank_file, rank_log_files, read_rank_files, read_status
from tests.conftest import (
    FAULTY,
    cuda,
    endless_run,
    processes_mentioning,
    run_engine,
    start_engine,
    wait_for,
)
from tests.ddp_engine.launch.test_launcher import assert_no_process_left, events, metrics
from tests.faults.conftest import fault_case

pytestmark = pytest.mark.slow


@fault_case("A rank raises at its 5th step (checkpoints every 2 steps)",
            "failed within 30 s of the exception; status.json and the launcher's output name "
            "the rank and the exception in one line; the last checkpoint loads; no process "
            "left")
def test_a_raising_rank_fails_the_run_and_is_named(tmp_path: Path,
                                                  observed: list[str]) -> None:
    run_dir = tmp_path / "run"
    proc = run_engine("launch", "--nproc", "2", "--max-steps", "100", "--checkpoint-every", "2",
                      "--loss", f"{FAULTY}:raise_on_rank1", "--run-dir", str(run_dir))
    assert proc.returncode == 1, proc.stdout + proc.stderr
    status = read_status(run_dir)
    assert status["state"] == "failed"
    assert status["reason"].startswith("rank 1 failed: RuntimeError: boom from the test plugin")
    assert "Traceback" not in status["reason"]  # one line, not the error file's dump
    assert status["exit_codes"]["1"] not in (0, None)
    log = rank_log_files(run_dir)[1].read_text()
    assert "Traceback" in log and "RuntimeError: boom from the test plugin" in log
    assert "failed" in proc.stdout and "rank 1" in proc.stdout
    raised_at = rank_file(run_dir, 1).stat().st_mtime  # rank 1 records its error as it fails
    took = status["ended"] - raised_at
    assert took < 30
    ckpt = torch.load(run_dir / "checkpoints" / "last.pt", weights_only=True)
    assert ckpt["step"] == 4
    assert_no_process_left(run_dir)
    observed.append(f"failed {took:.1f} s after the exception: {status['reason'][:60]}...; "
                    f"last.pt (step {ckpt['step']}) loads; no process left")


@fault_case("A rank is SIGKILLed mid-run",
            "failed within 30 s; the reason names the rank and SIGKILL; no process left")
def test_a_rank_killed_by_a_signal_is_named(tmp_path: Path, observed: list[str]) -> None:
    with endless_run(tmp_path) as (proc, run_dir):
        wait_for(lambda: len(metrics(run_dir)) >= 1, 120, "training to report")
        killed_at = time.time()
        os.kill(read_rank_files(run_dir)[1]["pid"], signal.SIGKILL)
        assert proc.wait(timeout=90) == 1
    status = read_status(run_dir)
    assert status["state"] == "failed"
    assert "rank 1 was killed by signal SIGKILL" in status["reason"], status["reason"]
    assert status["exit_codes"]["1"] == -9
    took = status["ended"] - killed_at
    assert took < 30
    assert_no_process_left(run_dir)
    observed.append(f"failed {took:.1f} s after the kill: {status['reason']}; exit code of "
                    f"rank 1: {status['exit_codes']['1']}; no process left")


@fault_case("The launcher is SIGKILLed mid-run",
            "every rank notices (parent-death signal), they agree to stop and exit, each "
            "recording the run as failed; no process left within 30 s")
def test_ranks_stop_when_the_launcher_is_killed(tmp_path: Path, observed: list[str]) -> None:
    with endless_run(tmp_path) as (proc, run_dir):
        wait_for(lambda: len(metrics(run_dir)) >= 1, 120, "training to report")
        killed_at = time.monotonic()
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=10)
        wait_for(lambda: not processes_mentioning(str(run_dir)), 30, "the ranks to exit")
        took = time.monotonic() - killed_at
    ranks = read_rank_files(run_dir)
    assert {d["state"] for d in ranks.values()} == {"failed"}, ranks
    assert {d["error"] for d in ranks.values()} == {
        f"RunFailed: the launcher died; every rank stopped after step {ranks[0]['step']}"}
    reason = events(run_dir, "stopping")[0]["reason"]
    assert reason == "the launcher died"
    observed.append(f"both ranks stopped ({reason!r}) and recorded failed at step "
                    f"{sorted({d['step'] for d in ranks.values()})}; no process left "
                    f"{took:.1f} s after the kill")


@fault_case("A rank hangs inside a step; Ctrl+C, then Ctrl+C again",
            "the first Ctrl+C cannot be agreed (the rank is stuck); the second forces every "
            "process down: stopped, forced, exit code 130, no process left")
def test_ctrl_c_twice_forces_a_hung_run_down(tmp_path: Path, observed: list[str]) -> None:
    hang = ("--log-every", "1", "--loss", f"{FAULTY}:hang_on_rank1")
    with endless_run(tmp_path, *hang) as (proc, run_dir):
        wait_for(lambda: len(read_rank_files(run_dir)) == 2, 120, "both ranks to start")
        wait_for(lambda: len(metrics(run_dir)) >= 1, 60, "a first report")
        # Once rank 1 hangs (in the forward of step 5), the agreed stop cannot happen; a Ctrl+C
        # before that is agreed at the next round, as it should be.
        wait_for(lambda: (read_heartbeats(run_dir).get(1) or {}).get("phase") == "forward"
                 and read_heartbeats(run_dir)[1].get("step") == 4, 60, "rank 1 to hang")
        proc.send_signal(signal.SIGINT)
        wait_for(lambda: "asking every rank to stop" in (tmp_path / "out.log").read_text(),
                 30, "the launcher to ask for the agreed stop")
        forced_at = time.monotonic()
        proc.send_signal(signal.SIGINT)
        code = proc.wait(timeout=60)
        took = time.monotonic() - forced_at
    out = (tmp_path / "out.log").read_text()
    assert code == 130, out
    status = read_status(run_dir)
    assert status["state"] == "stopped" and status["forced"] is True, status
    assert "forced stop" in status["reason"]
    assert_no_process_left(run_dir)
    observed.append(f"exit code {code} {took:.1f} s after the second Ctrl+C; "
                    f"{status['reason'][:70]}...; no process left")


@fault_case("A rank hangs inside a step while the app watches; then Stop",
            "the dashboard's hang hint names the hung rank and its phase once the run has "
            "been silent for 5 typical report intervals (at least 10 s); Stop clears every "
            "process (agreed stop, SIGTERM, SIGKILL) and says it was forced")
def test_the_hang_hint_names_the_hung_rank_and_stop_clears_it(
        qtbot, open_window, tmp_path: Path, observed: list[str]) -> None:
    hang = ("--log-every", "1", "--loss", f"{FAULTY}:hang_on_rank1")
    with endless_run(tmp_path, *hang) as (_proc, run_dir):
        wait_for(lambda: len(metrics(run_dir)) >= 1, 120, "a first report")
        w = open_window(tmp_path)
        qtbot.waitUntil(lambda: w.controller.active, timeout=20_000)
        last_report = metrics(run_dir)[-1]["time"]
        qtbot.waitUntil(lambda: "rank 1 has been in forward" in w.dashboard.alert.text(),
                        timeout=60_000)
        named_after = time.time() - last_report
        alert = w.dashboard.alert.text()
        assert "rank 0 waits in backward" in alert
        w.controller.grace_s, w.controller.kill_after_s = 2.0, 5.0
        pressed = time.monotonic()
        with qtbot.waitSignal(w.controller.finished, timeout=120_000) as sig:
            w.stop_action.trigger()
        took = time.monotonic() - pressed
        result = sig.args[0]
        assert result["state"] == "stopped" and result["forced"] is True
        assert result["leftover_pids"] == [] and not processes_mentioning(str(run_dir))
    hint = alert.split("every rank last reported step ")[1]
    observed.append(f"hint {named_after:.0f} s after the last report: \"...step {hint}\"; "
                    f"Stop (grace 2 s, kill after 5 s) ended it in {took:.0f} s: "
                    f"{result['reason']}; no process left")


@fault_case("A rank hangs inside a step and nobody stops the run (--dist-timeout-s 20)",
            "the terminal prints the hang hint naming the hung rank once reports stop; the "
            "process-group timeout turns the hang into a failure whose reason names the "
            "timeout and the hung rank; no process left")
def test_the_process_group_timeout_fails_a_hung_run(tmp_path: Path,
                                                    observed: list[str]) -> None:
    run_dir = tmp_path / "run"
    started = time.monotonic()
    proc = run_engine("launch", "--nproc", "2", "--max-steps", "100000", "--log-every", "1",
                      "--dist-timeout-s", "20", "--shutdown-timeout-s", "5", "--loss",
                      f"{FAULTY}:hang_on_rank1", "--run-dir", str(run_dir))
    took = time.monotonic() - started
    status = read_status(run_dir)
    assert proc.returncode == 1 and status["state"] == "failed", proc.stderr[-2000:]
    reason = status["reason"]
    assert "Timed out waiting 20000ms" in reason
    assert "rank 1 was killed by signal SIGKILL" in reason
    assert "before it failed, the run was stalled: rank 1 has been in forward of step" in reason
    assert "while rank 0 waits in backward" in reason
    hint = next(line for line in proc.stdout.splitlines() if "no progress for" in line)
    assert "rank 1 has been in forward" in hint and "look at rank 1's log" in hint
    assert_no_process_left(run_dir)
    observed.append(f"the terminal printed \"{hint[12:]}\"; failed {took:.0f} s after the "
                    f"launch: ...{reason[reason.index('; before it failed'):][:120]}...; no "
                    "process left")


@fault_case("A rank hangs; the rank waiting for it in the all-reduce is aborted (SIGABRT), as "
            "NCCL's watchdog aborts a rank at a collective timeout",
            "failed; the reason says the aborted rank most likely hit a collective timeout and "
            "where the heartbeats left each rank (the hung one named); no process left")
def test_a_rank_aborted_at_a_collective_timeout_is_said_so_with_the_hang(
        tmp_path: Path, observed: list[str]) -> None:
    run_dir = tmp_path / "run"
    proc = run_engine("launch", "--nproc", "2", "--max-steps", "100000", "--log-every", "1",
                      "--shutdown-timeout-s", "2", "--loss",
                      f"{FAULTY}:abort_rank0_while_rank1_hangs", "--run-dir", str(run_dir))
    status = read_status(run_dir)
    assert proc.returncode == 1 and status["state"] == "failed", proc.stdout[-2000:]
    reason = status["reason"]
    assert reason.startswith("rank 0 was aborted (SIGABRT), most likely by a collective "
                             "timeout: NCCL's watchdog aborts a rank when a collective waited "
                             "longer than the process-group timeout (120 s"), reason
    assert "; the heartbeats when it failed: rank 1 has been in forward of step 5 for " in reason
    assert "while rank 0 waits in backward (a collective): look at rank 1's log" in reason
    assert status["exit_codes"]["0"] == -6 and status["ranks"]["0"]["collective_timeout"]
    assert_no_process_left(run_dir)
    observed.append(f"\"{reason[:60]}...{reason[reason.index('; the heartbeats'):]}\"; no "
                    "process left")


@cuda
@fault_case("On GPUs (nccl): the launcher is SIGKILLed mid-run",
            "the ranks exit and NVML's compute-process list no longer shows any of them (no "
            "GPU memory held) within 30 s")
def test_no_gpu_memory_is_held_after_the_launcher_is_killed(tmp_path: Path,
                                                           observed: list[str]) -> None:
    run_dir = tmp_path / "run"
    n = min(gpu_count(), 2)
    proc = start_engine("launch", "--device", "cuda", "--nproc", str(n), "--max-steps",
                        "1000000", "--run-dir", str(run_dir), log=tmp_path / "out.log")
    try:
        wait_for(lambda: len(metrics(run_dir)) >= 1, 180, "training to report")
        pids = [d["pid"] for d in read_rank_files(run_dir).values()]
        held = gpu_leftovers(pids, timeout_s=0)
        assert sorted(p.pid for p in held) == sorted(pids), (
            f"NVML lists {gpu_processes()}, not the ranks {pids}: another pid namespace?")
        used = sum(p.used_bytes or 0 for p in held)
        killed_at = time.monotonic()
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=10)
        wait_for(lambda: not processes_mentioning(str(run_dir)), 30, "the ranks to exit")
        assert gpu_leftovers(pids, timeout_s=30 - (time.monotonic() - killed_at)) == []
        took = time.monotonic() - killed_at
    finally:
        proc.kill()
    observed.append(f"{n} ranks held {used / 2**20:,.0f} MiB by NVML; {took:.1f} s after the "
                    "kill no process and no NVML entry of the run was left")
