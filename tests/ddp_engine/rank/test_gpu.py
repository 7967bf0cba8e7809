"""GPU paths (nccl, set_device, CUDA_VISIBLE_DEVICES, bf16). Skipped where no GPU is visible."""

from __future__ import annotations

from pathlib import Path

import pytest

from ddp_engine.common.gpus import gpu_count, list_gpus
from ddp_engine.common.run_dir import iter_metrics, rank_log_files, read_rank_files, read_status
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
    gpu = list_gpus()[-1]  # named by its NVML index, given to the rank by UUID
    run_dir = tmp_path / "run"
    proc = run_engine("launch", "--gpus", str(gpu.index), "--precision", "bf16",
                      "--max-steps", "30", "--model", "convnet", "--run-dir", str(run_dir),
                      "--dry-run")
    assert f"CUDA_VISIBLE_DEVICES={gpu.uuid}" in proc.stdout
    proc = run_engine("launch", "--gpus", str(gpu.index), "--precision", "bf16",
                      "--max-steps", "30", "--model", "convnet", "--run-dir", str(run_dir))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert read_status(run_dir)["state"] == "completed"
    entry = [m for m in iter_metrics(run_dir) if m["type"] == "metrics"][-1]["ranks"][0]
    assert entry["device"] == f"GPU {gpu.index}"  # as nvidia-smi names it, not cuda:0
    assert entry["gpu"] == {"index": gpu.index, "uuid": gpu.uuid, "name": gpu.name,
                            "pci_bus_id": gpu.pci_bus_id}


def test_no_host_device_sync_inside_the_step(tmp_path: Path) -> None:
    """torch.cuda.set_sync_debug_mode("warn") around every training step stays silent."""
    run_dir = tmp_path / "run"
    proc = run_engine("launch", "--device", "cuda", "--nproc", "1", "--max-steps", "60",
                      "--model", "convnet", "--run-dir", str(run_dir),
                      env={"RANKSCOPE_SYNC_DEBUG": "1"})
    assert proc.returncode == 0, proc.stdout + proc.stderr
    log = rank_log_files(run_dir)[0].read_text()
    assert "synchroniz" not in log, log[-3000:]


def test_gpu_telemetry_fields_are_filled(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    # Long enough for the 2 Hz device sampler to have read the GPU several times.
    proc = run_engine("launch", "--device", "cuda", "--nproc", "1", "--max-steps", "3000",
                      "--log-every", "100", "--model", "convnet", "--run-dir", str(run_dir))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    last = [m for m in iter_metrics(run_dir) if m["type"] == "metrics"][-1]["ranks"][0]
    first = list_gpus()[0]
    assert last["device"] == f"GPU {first.index}" and last["gpu"]["uuid"] == first.uuid
    assert last["gpu_mem_total_bytes"] > 0 and last["gpu_mem_used_bytes"] > 0
    assert last["gpu_util_pct"] is not None and last["forward_s"] > 0 and last["backward_s"] > 0
