"""make gpu-check's real runs record the MFU the run shows: the flops event over the median
step time against the GPU's dense peak (a simulated H200 run folder here), and a run without
a flops event fails the part."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from bench.gpu_check_base import Fail
from bench.gpu_check_runs import step_flops


def _run(tmp_path: Path, *events: dict) -> Path:
    run = tmp_path / "run"
    run.mkdir()
    (run / "metrics.jsonl").write_text("".join(
        json.dumps({"type": "event", "time": 1.0, **e}) + "\n" for e in events))
    return run


def test_an_h200_bf16_run_records_its_mfu(tmp_path: Path) -> None:
    run = _run(tmp_path, {"kind": "run_start"}, {
        "kind": "flops", "flops_per_step": 4e12, "batch_size": 32, "grad_accum": 1,
        "precision": "bf16", "gpus": ["NVIDIA H200"]})
    numbers = {"step_ms": 10.0}
    words = step_flops(run, numbers)
    assert numbers["achieved_tflops"] == pytest.approx(400.0)
    assert numbers["mfu_pct"] == pytest.approx(100 * 400 / 989.4)
    assert words == "; 400 TFLOP/s of model FLOPs = MFU 40% of 989 TFLOP/s (H200 SXM, bf16 dense)"


def test_a_cpu_or_unknown_gpu_run_records_the_rate_without_mfu(tmp_path: Path) -> None:
    cpu = _run(tmp_path, {"kind": "flops", "flops_per_step": 3_915_776, "precision": "fp32",
                          "gpus": [None]})
    numbers = {"step_ms": 2.0}
    assert step_flops(cpu, numbers) == "; 1.96 GFLOP/s of model FLOPs (CPU: no peak)"
    assert "mfu_pct" not in numbers
    (cpu / "metrics.jsonl").write_text(json.dumps(
        {"type": "event", "kind": "flops", "flops_per_step": 4e12, "precision": "bf16",
         "gpus": ["NVIDIA Imaginary X1"]}) + "\n")
    assert step_flops(cpu, numbers).endswith("(peak unknown for NVIDIA Imaginary X1 in bf16)")


def test_a_run_without_a_flops_event_fails_the_part(tmp_path: Path) -> None:
    with pytest.raises(Fail, match="the run published no usable flops event: None"):
        step_flops(_run(tmp_path, {"kind": "run_start"}), {"step_ms": 1.0})
