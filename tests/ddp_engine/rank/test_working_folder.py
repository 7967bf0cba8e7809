"""A script's working folder is the caller's, as with torchrun (issue 28): the same command,
from a project folder, under ``ddp_engine launch --script`` and under plain torchrun, reads
its data and writes its output through the same relative paths (real 2-process gloo runs)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from ddp_engine.common.run_dir import read_status
from tests.conftest import engine_env

pytestmark = pytest.mark.slow

SCRIPT = Path(__file__).parent / "scripts" / "caller_folder.py"
ARGS = ["--data", "mydata/train.txt", "--out", "outputs/result.json", "--steps", "5"]


def _project(tmp_path: Path) -> Path:
    """A project folder with mydata/train.txt in it (the script lives elsewhere)."""
    project = tmp_path / "project"
    (project / "mydata").mkdir(parents=True)
    rows = [" ".join(str((i * 7 + j * 3) % 11 / 10) for j in range(5)) for i in range(32)]
    (project / "mydata" / "train.txt").write_text("\n".join(rows) + "\n")
    return project


def _run(argv: list[str], cwd: Path) -> subprocess.CompletedProcess[str]:
    env = {**engine_env(), "CUDA_VISIBLE_DEVICES": "", "OMP_NUM_THREADS": "1"}
    return subprocess.run([sys.executable, *argv], cwd=cwd, env=env, capture_output=True,
                          text=True, timeout=240)


def test_relative_paths_mean_the_callers_folder_as_under_torchrun(tmp_path: Path) -> None:
    results = {}
    for how, argv in (
            ("torchrun", ["-m", "torch.distributed.run", "--standalone", "--nproc-per-node",
                          "2", str(SCRIPT), *ARGS]),
            ("rankscope", ["-m", "ddp_engine", "launch", "--script", str(SCRIPT), "--nproc",
                           "2", "--device", "cpu", "--run-dir", str(tmp_path / "run"), "--",
                           *ARGS])):
        project = _project(tmp_path / how)
        proc = _run(argv, cwd=project)
        assert proc.returncode == 0, f"{how}:\n{proc.stdout}\n{proc.stderr}"
        out = project / "outputs" / "result.json"  # in the project folder, not the script's
        assert out.is_file(), how
        results[how] = json.loads(out.read_text())
        assert results[how]["cwd"] == str(project)
    assert not (SCRIPT.parent / "outputs").exists()
    assert read_status(tmp_path / "run")["state"] == "completed"
    config = json.loads((tmp_path / "run" / "config.json").read_text())
    assert config["script_cwd"] == str(tmp_path / "rankscope" / "project")  # absolute, kept
    mine, theirs = results["rankscope"]["weights"], results["torchrun"]["weights"]
    assert len(mine) == 5 and all(abs(a - b) <= 1e-6 for a, b in zip(mine, theirs, strict=True))
