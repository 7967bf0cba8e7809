"""Faults while a checkpoint is written: a kill mid-save, a full disk."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from ddp_engine.common.run_dir import read_rank_files, read_status
from ddp_engine.rank import checkpoint
from tests.conftest import FAULTY, endless_run, run_engine, start_engine, wait_for
from tests.ddp_engine.launch.test_launcher import assert_no_process_left, events, metrics
from tests.faults.conftest import fault_case

pytestmark = pytest.mark.slow
BIG_MODEL = ("--model-arg", "hidden=1024", "--model-arg", "depth=3")  # a 25 MB checkpoint


def _temps(folder: Path) -> list[Path]:
    return list(folder.glob(".*.tmp")) if folder.is_dir() else []


@fault_case("Rank 0 is SIGKILLed in the middle of writing checkpoints/last.pt (25 MB)",
            "failed, naming rank 0 and SIGKILL; last.pt is the previous checkpoint, intact, "
            "and a new run resumes from it; the partial temp file is removed; no process left")
def test_a_kill_mid_save_keeps_the_previous_checkpoint(tmp_path: Path,
                                                       observed: list[str]) -> None:
    folder = tmp_path / "run" / "checkpoints"
    with endless_run(tmp_path, *BIG_MODEL, "--checkpoint-every", "5", "--log-every", "5") as (
            proc, run_dir):
        wait_for(lambda: (folder / "last.pt").exists(), 120, "a first checkpoint")
        # The next save: its temp file exists and has bytes in it, last.pt not replaced yet.
        partial = wait_for(lambda: [p for p in _temps(folder) if p.stat().st_size > 0], 120,
                           "a save in progress", interval=0.001)
        os.kill(read_rank_files(run_dir)[0]["pid"], signal.SIGKILL)
        size = partial[0].stat().st_size if partial[0].exists() else 0
        assert proc.wait(timeout=90) == 1
    status = read_status(run_dir)
    assert status["state"] == "failed"
    assert "rank 0 was killed by signal SIGKILL" in status["reason"], status["reason"]
    state = checkpoint.load(folder / "last.pt")
    assert state["step"] % 5 == 0
    assert _temps(folder) == [] and sorted(p.name for p in folder.iterdir()) == ["last.pt"]
    removed = status.get("removed_partial_checkpoints", [])
    assert_no_process_left(run_dir)
    resumed = run_engine("launch", "--nproc", "2", *BIG_MODEL, "--resume",
                         str(folder / "last.pt"), "--max-steps", str(state["step"] + 5),
                         "--run-dir", str(tmp_path / "resumed"))
    assert resumed.returncode == 0, resumed.stderr[-2000:]
    assert read_status(tmp_path / "resumed")["step"] == state["step"] + 5
    observed.append(f"killed with {size / 1e6:.1f} MB of the next save written; "
                    f"{status['reason']}; last.pt (step {state['step']}) loads and a new run "
                    f"resumed from it to step {state['step'] + 5}; temp files removed by the "
                    f"launcher: {len(removed)}, left: 0; no process left")


@pytest.fixture
def small_disk(tmp_path: Path) -> Iterator[Path]:
    """A 128 MiB tmpfs of our own, which we can fill (root or CAP_SYS_ADMIN only)."""
    mount = tmp_path / "disk"
    mount.mkdir()
    done = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=128m", "tmpfs", str(mount)],
                          capture_output=True, text=True)
    if done.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here ({done.stderr.strip() or done.returncode}); "
                    "the full-disk case needs root")
    try:
        yield mount
    finally:
        subprocess.run(["umount", "-l", str(mount)], capture_output=True)


def _fill(mount: Path, leave: int) -> int:
    """Write a file that leaves ``leave`` bytes free on ``mount``; returns its size."""
    st = os.statvfs(mount)
    size = max(0, st.f_bavail * st.f_frsize - leave)
    with open(mount / "filler", "wb") as f:
        chunk = b"\0" * (1 << 20)
        while size - f.tell() > 0:
            f.write(chunk[:size - f.tell()])
    return size


@fault_case("The disk fills up before a checkpoint save (1 MiB left; a 25 MB checkpoint)",
            "failed, with one line naming the file, ENOSPC and the checkpoint that is kept; "
            "last.pt is the previous checkpoint and loads; no temp file; no process left")
def test_a_full_disk_at_checkpoint_time_is_named_and_keeps_the_last(
        small_disk: Path, tmp_path: Path, observed: list[str]) -> None:
    run_dir = small_disk / "run"
    folder = run_dir / "checkpoints"
    proc = start_engine("launch", "--nproc", "2", "--max-steps", "1000000", *BIG_MODEL,
                        "--checkpoint-every", "10", "--log-every", "5", "--run-dir",
                        str(run_dir), log=tmp_path / "out.log")
    try:
        wait_for(lambda: (folder / "last.pt").exists(), 120, "a first checkpoint")
        filled = _fill(small_disk, leave=1 << 20)
        filled_at = time.time()
        assert proc.wait(timeout=120) == 1
    finally:
        proc.kill()
    out = (tmp_path / "out.log").read_text()
    status = read_status(run_dir)
    reason = status["reason"]
    assert status["state"] == "failed", out[-2000:]
    assert reason.startswith("rank 0 failed: CheckpointError: the checkpoint of step "), reason
    assert f"could not be written to {folder / 'last.pt'} (ENOSPC, No space left on device)" \
        in reason
    kept = int(reason.split("checkpoints/last.pt (step ")[1].split(")")[0])
    assert f"; checkpoints/last.pt (step {kept}) is kept" in reason and "\n" not in reason
    assert "failed at step" in out and "ENOSPC" in out  # the terminal says it too
    shutil.move(str(folder / "last.pt"), tmp_path / "last.pt")  # room to load it elsewhere
    assert checkpoint.load(tmp_path / "last.pt")["step"] == kept
    assert _temps(folder) == []
    assert_no_process_left(run_dir)
    observed.append(f"filled {filled / 2**20:.0f} MiB; failed {status['ended'] - filled_at:.1f} "
                    f"s later: \"{reason[:150]}...\"; last.pt (step {kept}) loads; no temp "
                    "file; no process left")


@fault_case("Rank 0's checkpoint write takes 8 s, longer than the process-group timeout "
            "(--dist-timeout-s 5) and the shutdown timeout (--shutdown-timeout-s 2); Ctrl+C "
            "mid-run",
            "the other rank waits for each write (no collective timeout) and training goes on; "
            "the stop's final checkpoint is written whole although it outlasts the shutdown "
            "timeout: stopped (not forced), last.pt at the stop step; no process left")
def test_a_checkpoint_slower_than_every_timeout_is_waited_for(tmp_path: Path,
                                                              observed: list[str]) -> None:
    slow = ("--model", f"{FAULTY}:slow_to_save", "--checkpoint-every", "3", "--log-every", "3",
            "--dist-timeout-s", "5", "--shutdown-timeout-s", "2")
    with endless_run(tmp_path, *slow) as (proc, run_dir):
        wait_for(lambda: events(run_dir, "checkpoint_saved") or proc.poll() is not None, 120,
                 "a first checkpoint")
        wait_for(lambda: len(metrics(run_dir)) >= 2 or proc.poll() is not None, 60,
                 "training to go on after the save")
        assert proc.poll() is None, (tmp_path / "out.log").read_text()[-3000:]
        stopped_at = time.monotonic()
        proc.send_signal(signal.SIGINT)
        code = proc.wait(timeout=120)
        took = time.monotonic() - stopped_at
    out = (tmp_path / "out.log").read_text()
    status = read_status(run_dir)
    assert code == 0 and status["state"] == "stopped" and not status.get("forced"), out[-3000:]
    saved = events(run_dir, "checkpoint_saved")
    assert saved[-1]["step"] == status["step"]
    assert checkpoint.load(run_dir / "checkpoints" / "last.pt")["step"] == status["step"]
    assert "in a checkpoint save: the shutdown timeout (2 s) counts from its end" in out
    assert took > 8  # the final save alone outlasted the shutdown timeout 4 times over
    assert_no_process_left(run_dir)
    observed.append(f"{len(saved)} saves of 8 s each; stopped {took:.0f} s after Ctrl+C "
                    f"at step {status['step']} with last.pt of that step; no process left")
