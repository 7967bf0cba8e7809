"""Checkpoints: weights_only loading, our format only, and no torn file after a kill."""

from __future__ import annotations

import errno
import re
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


def test_a_cut_short_or_empty_file_is_refused_in_one_line(tmp_path: Path) -> None:
    good = tmp_path / "good.pt"
    checkpoint.save_atomic(_payload(3) | {"big": torch.zeros(100_000)}, good)
    cut = tmp_path / "cut.pt"
    cut.write_bytes(good.read_bytes()[:200_000])  # a copy that stopped half-way
    with pytest.raises(ConfigError) as info:
        checkpoint.recorded_step(cut)
    assert re.fullmatch(rf"resume: {re.escape(repr(str(cut)))} is not a Rankscope checkpoint "
                        r"\(RuntimeError: .*failed finding central directory\)",
                        str(info.value)), str(info.value)  # without miniz's advice paragraph
    empty = tmp_path / "empty.pt"
    empty.write_bytes(b"")
    with pytest.raises(ConfigError, match=r"^resume: '.*empty\.pt' is not a Rankscope checkpoint "
                                          r"\(EOFError: the file is empty or cut short\)$"):
        checkpoint.load(empty)


def test_a_checkpoint_in_torchs_old_format_is_read_without_mapping(tmp_path: Path) -> None:
    """torch.save's pre-1.6 format cannot be memory-mapped: it is read whole, as before."""
    torch.manual_seed(0)
    model = torch.nn.Linear(8, 8)
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    model(torch.randn(2, 8)).sum().backward()
    opt.step()
    old = tmp_path / "old.pt"
    torch.save(_payload(4) | {"model": model.state_dict(), "optimizer": opt.state_dict()}, old,
               _use_new_zipfile_serialization=False)
    assert checkpoint.recorded_step(old) == 4
    fresh = torch.nn.Linear(8, 8)
    fresh_opt = torch.optim.SGD(fresh.parameters(), lr=0.1, momentum=0.9)
    rest = checkpoint.load_into(old, fresh, fresh_opt)
    assert rest["step"] == 4 and "model" not in rest and "optimizer" not in rest
    assert torch.equal(fresh.weight, model.weight)
    assert torch.equal(fresh_opt.state[fresh.weight]["momentum_buffer"],
                       opt.state[model.weight]["momentum_buffer"])
