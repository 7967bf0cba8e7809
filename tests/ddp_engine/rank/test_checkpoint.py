"""Checkpoints: weights_only loading, our format only, and no torn file after a kill."""

from __future__ import annotations

import errno
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from ddp_engine.common.config import ConfigError
from ddp_engine.rank import checkpoint
from tests.conftest import REPO, engine_env, wait_for


def _payload(step: int) -> dict:
    return {"format": checkpoint.FORMAT, "format_version": checkpoint.FORMAT_VERSION,
            "step": step, "model": {"w": torch.full((4,), float(step))},
            "rng": [checkpoint.capture_rng()]}


def test_round_trip_with_weights_only(tmp_path: Path) -> None:
    path = tmp_path / "ck" / "last.pt"
    checkpoint.save_atomic(_payload(3), path)
    state = checkpoint.load(path)
    assert state["step"] == 3 and torch.equal(state["model"]["w"], torch.full((4,), 3.0))
    checkpoint.restore_rng(state["rng"][0])
    assert [p.name for p in path.parent.iterdir()] == ["last.pt"]  # no temp file left


def test_foreign_files_are_refused(tmp_path: Path) -> None:
    other = tmp_path / "other.pt"
    torch.save({"step": 1}, other)
    with pytest.raises(ConfigError, match=r"no format='rankscope-checkpoint' key"):
        checkpoint.load(other)
    pickled = tmp_path / "pickled.pt"
    torch.save({"format": checkpoint.FORMAT, "obj": Path("/x")}, pickled)
    with pytest.raises(ConfigError, match=r"is not a Rankscope checkpoint \(UnpicklingError"):
        checkpoint.load(pickled)  # weights_only refuses arbitrary objects
    newer = tmp_path / "newer.pt"
    torch.save({**_payload(1), "format_version": 99}, newer)
    with pytest.raises(ConfigError, match=r"format version 99; this engine reads 1"):
        checkpoint.load(newer)


@pytest.mark.skipif(not Path("/dev/full").exists(), reason="needs /dev/full (Linux)")
def test_a_full_disk_is_reported_as_the_os_error_not_torchs_zip_error() -> None:
    with open("/dev/full", "wb", buffering=0) as f, pytest.raises(OSError) as info:
        checkpoint.write_to(_payload(1) | {"big": torch.zeros(1_000_000)}, f)
    assert info.value.errno == errno.ENOSPC


SAVER = """
import sys, torch
from ddp_engine.rank import checkpoint
path = sys.argv[1]
step = 0
while True:
    step += 1
    checkpoint.save_atomic({"format": checkpoint.FORMAT,
                            "format_version": checkpoint.FORMAT_VERSION, "step": step,
                            "model": {"w": torch.full((4_000_000,), float(step))}}, path)
    print(step, flush=True)
"""


def test_a_kill_mid_save_never_leaves_a_torn_checkpoint(tmp_path: Path) -> None:
    path = tmp_path / "last.pt"
    for attempt in range(3):
        proc = subprocess.Popen([sys.executable, "-c", SAVER, str(path)], env=engine_env(),
                                cwd=REPO, stdout=subprocess.PIPE, text=True)
        try:
            assert proc.stdout is not None
            proc.stdout.readline()  # one save finished
            # Kill while a temp file is being written: the middle of a save.
            wait_for(lambda: any(p.name.endswith(".tmp") for p in tmp_path.iterdir()), 30,
                     "a save in progress", interval=0.001)
            proc.send_signal(signal.SIGKILL)
            proc.wait(timeout=30)
        finally:
            proc.kill()
        state = checkpoint.load(path)  # the previous complete file, intact
        assert state["step"] >= 1
        assert torch.all(state["model"]["w"] == float(state["step"])), attempt
    # Each kill left at most its own temp file: the next save removed the one before.
    assert len(list(tmp_path.glob(".last.pt.*.tmp"))) <= 1
    checkpoint.save_atomic(_payload(99), path)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["last.pt"]
