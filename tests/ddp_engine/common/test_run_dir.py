"""run_dir's atomic writes: old or new file, never torn, and no temp file left behind."""

from __future__ import annotations

from pathlib import Path
from typing import BinaryIO

import pytest

from ddp_engine.common.run_dir import atomic_write, atomic_write_text, remove_partial_writes


def test_a_failing_write_keeps_the_old_file_and_leaves_no_temp(tmp_path: Path) -> None:
    target = tmp_path / "last.pt"
    atomic_write_text(target, "old")

    def half_then_full(f: BinaryIO) -> None:
        f.write(b"half of the new")
        raise OSError(28, "No space left on device")

    with pytest.raises(OSError, match="No space left"):
        atomic_write(target, half_then_full, sole_writer=True, durable=True)
    assert target.read_text() == "old"
    assert [p.name for p in tmp_path.iterdir()] == ["last.pt"]


def test_a_sole_writer_removes_what_killed_writes_left(tmp_path: Path) -> None:
    target = tmp_path / "last.pt"
    for leftover in (".last.pt.abc123.tmp", ".last.pt.zz9.tmp"):
        (tmp_path / leftover).write_bytes(b"torn")
    other = tmp_path / ".step-4.pt.q1.tmp"
    other.write_bytes(b"another file's write")
    atomic_write(target, lambda f: f.write(b"new"), sole_writer=True)
    assert target.read_bytes() == b"new"
    assert sorted(p.name for p in tmp_path.iterdir()) == [".step-4.pt.q1.tmp", "last.pt"]
    atomic_write(tmp_path / "status.json", lambda f: f.write(b"{}"))  # not a sole writer
    assert other.exists()
    assert remove_partial_writes(tmp_path) == [other]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["last.pt", "status.json"]
