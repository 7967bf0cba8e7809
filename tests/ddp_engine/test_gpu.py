"""GPU paths (nccl, set_device, CUDA_VISIBLE_DEVICES, bf16). Skipped where no GPU is visible."""

from __future__ import annotations

from pathlib import Path

import pytest

from ddp_engine.devices import gpu_count
from ddp_engine.run_dir import iter_metrics, read_rank_files, read_status
from tests.conftest import cuda, run_engine

pytestmark = [cuda, pytest.mark.slow]


def _run_start(run_dir: Path) -> dict:
    return next(m for m in iter_metrics(run_dir) if m.get("kind") == "run_start")


def test_nccl_run_one_process_per_gpu(tmp_path: Path) -> None:
    n = min(gpu_count(), 2)
    run_dir = tmp_path / "run"
    proc = run_engine("launch", "--device", "cuda", "--nproc", str(n), "--max-steps", "50",
                      "--run-dir", str(run_dir))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert _run_start(run_dir)["backend"] == "nccl"
    devices = {r: d["device"] for r, d in read_rank_files(run_dir).items()}
    assert devices == {r: f"cuda:{r}" for r in range(n)}  # set_device(local_rank)
    assert read_status(run_dir)["state"] == "completed"


def test_gpus_flag_picks_the_gpu_and_bf16_trains(tmp_path: Path) -> None:
    last = gpu_count() - 1
    run_dir = tmp_path / "run"
    proc = run_engine("launch", "--gpus", str(last), "--precision", "bf16", "--max-steps", "30",
                      "--model", "convnet", "--run-dir", str(run_dir), "--dry-run")
    assert f"CUDA_VISIBLE_DEVICES={last}" in proc.stdout
    proc = run_engine("launch", "--gpus", str(last), "--precision", "bf16", "--max-steps", "30",
                      "--model", "convnet", "--run-dir", str(run_dir))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert read_status(run_dir)["state"] == "completed"
