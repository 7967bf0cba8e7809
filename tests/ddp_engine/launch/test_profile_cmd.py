"""``python -m ddp_engine profile``'s input and its --read (issue 31); profiles of live runs are
tests/ddp_engine/rank/test_profiling.py's."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

from ddp_engine.common.profile_files import SUMMARY_FILE
from tests.conftest import run_engine

DDP_2RANK = Path(__file__).parents[2] / "fixtures" / "profiles" / "ddp-2rank"


def test_bad_input_names_the_field_and_exits_2(tmp_path: Path) -> None:
    cases = [
        ((), "RUN_DIR: the run folder of a live run is needed (or --read FOLDER)"),
        ((str(tmp_path / "nowhere"),), "is not a folder"),
        ((str(tmp_path), "--steps", "0"), "steps must be a whole number between 1 and 50, got 0"),
        ((str(tmp_path), "--steps", "51"), "got 51"),
        ((str(tmp_path), "--timeout", "0"), "timeout must be a number of seconds > 0, got 0"),
        ((str(tmp_path), "--timeout", "nan"), "got nan"),
        ((str(tmp_path), "--read", str(tmp_path)), "not both"),
        (("--read", str(tmp_path)), f"--read: no rank's trace in {tmp_path}"),
    ]
    for args, words in cases:
        proc = run_engine("profile", *args, timeout=60)
        assert proc.returncode == 2 and words in proc.stderr, (args, proc.stderr)


def test_an_ended_run_is_not_asked(tmp_path: Path) -> None:
    run = tmp_path / "run"
    (run / "ranks").mkdir(parents=True)
    (run / "config.json").write_text("{}")
    (run / "status.json").write_text(json.dumps({"state": "stopped", "step": 210}))
    proc = run_engine("profile", str(run), timeout=60)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert "the run has ended (stopped at step 210): a profile is taken of a live run" \
        in proc.stderr


def test_read_reads_a_profile_folder_again(tmp_path: Path) -> None:
    folder = tmp_path / "20261207-034520-step160"
    shutil.copytree(DDP_2RANK, folder)
    (folder / SUMMARY_FILE).write_text("{}")  # stale: made again
    proc = run_engine("profile", "--read", str(folder), timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert "Last to arrive: rank 1" in proc.stdout
    assert json.loads((folder / SUMMARY_FILE).read_text())["ranks"] == [0, 1]
