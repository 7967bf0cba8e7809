"""make gpu-check (bench/gpu_check.py): where there is no GPU it runs, skips the GPU parts
with the reason and writes a row for every part; without Qt it still finds and runs the tests
that need CUDA; its GPU-only checks judge NVML's readings (simulated here); its CPU rehearsal
runs the parts that train; and ``make gpu-check`` needs no virtual environment."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

from bench import gpu_check
from bench.gpu_check_base import Ctx, Fail
from bench.gpu_check_runs import _gpu_released, nvml_fields
from bench.gpu_check_tools import _ranges
from tests.conftest import REPO
from tests.simulated_nvml import SimGpu, SimulatedNvml

HIDDEN = ("PySide6", "pyqtgraph", "pytestqt", "pytest_timeout", "tomli_w")
"""What the GPU machine lacks: only torch, nvidia-ml-py, psutil and pytest are there."""


def _like_the_gpu_machine(tmp_path: Path) -> dict[str, str]:
    """An environment where the modules of HIDDEN cannot be imported (a module of that name,
    first on the path, raises ModuleNotFoundError), pytest loads no plugin of its own accord
    (so pytest-qt and pytest-timeout are absent) and no GPU is visible."""
    hide = tmp_path / "hidden"
    hide.mkdir()
    for name in HIDDEN:
        (hide / f"{name}.py").write_text(
            f"raise ModuleNotFoundError(\"No module named '{name}'\", name='{name}')\n")
    return {**os.environ, "PYTHONPATH": f"{hide}{os.pathsep}{REPO}",
            "PYTEST_DISABLE_PLUGIN_AUTOLOAD": "1", "CUDA_VISIBLE_DEVICES": ""}


def _check(tmp_path: Path, *args: str) -> tuple[subprocess.CompletedProcess[str], dict]:
    """bench/gpu_check.py ARGS as `make gpu-check` runs it, on a machine like the GPU one;
    its output and the report's rows by part name."""
    out = tmp_path / "GPU.md"
    proc = subprocess.run([sys.executable, str(REPO / "bench" / "gpu_check.py"), "--out",
                           str(out), "--work", str(tmp_path / "work"), *args],
                          capture_output=True, text=True, timeout=240, cwd=REPO,
                          env=_like_the_gpu_machine(tmp_path))
    rows = {}
    for line in out.read_text().splitlines() if out.is_file() else []:
        cells = [c.strip() for c in line.strip().strip("|").split(" | ")]
        if line.startswith("| `") and len(cells) == 5:
            rows[cells[0].strip("`")] = {"status": cells[2], "details": cells[4]}
    return proc, rows


def test_without_a_gpu_the_gpu_parts_are_skipped_and_the_cuda_tests_found(
        tmp_path: Path) -> None:
    started = time.monotonic()
    proc, rows = _check(tmp_path)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert time.monotonic() - started < 120
    assert list(rows) == [p.name for p in gpu_check.PARTS]
    assert rows["environment"]["status"] == "passed"
    assert "Qt absent" in rows["environment"]["details"]
    gpu_parts = set(rows) - {"environment", "pytest-cuda"}
    assert {n: rows[n]["status"] for n in gpu_parts} == dict.fromkeys(gpu_parts, "skipped")
    assert {rows[n]["details"] for n in gpu_parts} == {"no CUDA device"}
    # Without Qt the CUDA tests outside tests/app and tests/faults are collected and run
    # (skipped here: no GPU); -m cuda alone selects none of them (conftest's cuda is a skipif).
    assert rows["pytest-cuda"]["status"] == "passed", rows["pytest-cuda"]
    assert "tests/app and tests/faults not collected (no Qt)" in rows["pytest-cuda"]["details"]
    ran = {c.get("name") for c in ET.parse(tmp_path / "work" / "pytest.xml").iter("testcase")}
    assert {"test_nccl_run_one_process_per_gpu", "test_gpu_telemetry_fields_are_filled",
            "test_a_process_with_a_cuda_context_is_listed_until_it_exits"} <= ran
    assert "test_without_nvml_nothing_is_listed_and_nothing_is_claimed_left" not in ran


@pytest.mark.slow
def test_a_cpu_rehearsal_trains_resumes_and_kills_the_launcher(tmp_path: Path) -> None:
    proc, rows = _check(tmp_path, "--device", "cpu", "--parts",
                        "run-fp32,run-fp16,resume,launcher-sigkill,sync-timing,sync-reducer")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    status = {n: r["status"] for n, r in rows.items()}
    assert status["run-fp32"] == status["resume"] == status["launcher-sigkill"] == "passed"
    assert "completed 300 steps (gloo)" in rows["run-fp32"]["details"]
    assert "continued at step 300" in rows["resume"]["details"]
    assert "no process of the run was left" in rows["launcher-sigkill"]["details"]
    assert status["run-fp16"] == status["sync-timing"] == status["doctor"] == "skipped"
    assert "CPU rehearsal" in rows["sync-timing"]["details"]
    # DDP's reducer timers ran and timed the gloo steps; nothing to compare them with on CPU
    assert status["sync-reducer"] == "skipped"
    timed = re.search(r"timed (\d+\.\d+) ms, (\d+)/(\d+) steps sampled\): CPU rehearsal",
                      rows["sync-reducer"]["details"])
    assert timed, rows["sync-reducer"]
    assert float(timed[1]) > 0 and timed[2] == timed[3] == "20"
    assert rows["doctor"]["details"] == "not selected (--parts)"


def _run_folder(tmp_path: Path, entry: dict) -> Path:
    run = tmp_path / "run"
    run.mkdir()
    row = {"rank": 0, "loss": 1.0, "samples_per_s": 1.0, "step_time_s": 0.01, **entry}
    (run / "metrics.jsonl").write_text(json.dumps(
        {"type": "metrics", "step": 10, "time": 1.0, "ranks": [row]}) + "\n")
    return run


H200 = SimGpu(util_pct=55, temp_c=47, power_mw=310_000, mem_used_bytes=9 * 2**30)
IDENTITY = {"device": "GPU 0", "gpu": {"index": 0, "uuid": H200.uuid, "name": H200.name,
                                       "pci_bus_id": H200.pci_bus_id},
            "gpu_util_pct": 98.0, "gpu_mem_used_bytes": 2**33, "gpu_mem_total_bytes": 2**37,
            "gpu_temp_c": 51.0, "gpu_power_w": 400.0}


def _ctx(tmp_path: Path, **runs: Path) -> Ctx:
    return Ctx(python=sys.executable, work=tmp_path, device="cuda",
               facts={"cuda_available": True}, runs=dict(runs))


def test_nvml_readings_in_range_and_a_run_on_the_gpu_nvml_names_pass(
        tmp_path: Path, simulated_nvml: SimulatedNvml) -> None:
    simulated_nvml.gpus = [H200]
    outcome = nvml_fields(_ctx(tmp_path, **{"run-fp32": _run_folder(tmp_path, IDENTITY)}))
    assert outcome.details.startswith("1 GPU(s), GPU 0 (NVIDIA H200): util 55%, memory 9.0 "
                                      "of 141 GiB, 47 C, 310 W; identity and readings of "
                                      "run-fp32 match NVML")


def test_a_run_that_names_its_gpu_as_cuda_does_fails_the_nvml_check(
        tmp_path: Path, simulated_nvml: SimulatedNvml) -> None:
    simulated_nvml.gpus = [H200]
    run = _run_folder(tmp_path, {**IDENTITY, "device": "cuda:0"})
    with pytest.raises(Fail, match="run-fp32: device 'cuda:0'"):
        nvml_fields(_ctx(tmp_path, **{"run-fp32": run}))


def test_a_gpu_without_a_power_reading_fails_the_nvml_check(
        tmp_path: Path, simulated_nvml: SimulatedNvml) -> None:
    # two_gpus(): the second GPU answers NOT_SUPPORTED for power.
    with pytest.raises(Fail, match=r"^GPU 1 \(NVIDIA RTX A6000\): power None W$"):
        nvml_fields(_ctx(tmp_path))


def test_a_process_nvml_still_lists_after_the_kill_fails_the_check(
        simulated_nvml: SimulatedNvml) -> None:
    # two_gpus(): pid 4242 holds 19 GiB on GPU 1 (the kill was 29.5 s ago: 0.5 s to wait).
    with pytest.raises(Fail, match=r"still lists the run's processes \[4242\]"):
        _gpu_released({4242}, 19 * 1024, 0, killed=time.monotonic() - 29.5)
    simulated_nvml.gpus[1].processes = []
    assert "none" in _gpu_released({4242}, 19 * 1024, 0, killed=time.monotonic())


def test_cores_are_named_as_ranges() -> None:
    assert _ranges([0, 1, 2, 5, 8, 9]) == "0-2,5,8-9"


def test_make_gpu_check_uses_the_python_at_hand_not_the_virtual_environment() -> None:
    # As a user types it: not inside `make test`'s make (whose MAKEFLAGS/MAKELEVEL would add
    # "Entering directory" lines and its variables).
    env = {k: v for k, v in os.environ.items()
           if k not in ("MAKEFLAGS", "MAKELEVEL", "MFLAGS", "PYTHON")}
    dry = subprocess.run(["make", "-n", "gpu-check"], capture_output=True, text=True,
                         cwd=REPO, check=True, env=env).stdout
    assert dry.strip().endswith("python3 bench/gpu_check.py"), dry
    assert ".venv" not in dry and "pip" not in dry, dry
    dry = subprocess.run(["make", "-n", "gpu-check", "PYTHON=/opt/py/bin/python3"],
                         capture_output=True, text=True, cwd=REPO, check=True, env=env).stdout
    assert "/opt/py/bin/python3 bench/gpu_check.py" in dry, dry


def test_past_the_deadline_every_part_is_skipped_as_out_of_time(tmp_path: Path) -> None:
    out = tmp_path / "GPU.md"
    assert gpu_check.main(["--out", str(out), "--deadline-s", "0"]) == 0
    text = out.read_text()
    assert text.count("| skipped | 0 | out of time (0 s left of the check's deadline) |") == \
        len(gpu_check.PARTS)


def test_a_part_that_raises_is_recorded_as_failed_with_its_traceback(tmp_path: Path) -> None:
    def broken(ctx: Ctx) -> gpu_check.Outcome:
        return {}["no such key"]

    ctx = _ctx(tmp_path)
    record = gpu_check.run_part(gpu_check.Part("broken", "a check with a bug", broken, 10, 0),
                                ctx, time.monotonic() + 60, None)
    assert (record.status, record.details) == ("failed", "KeyError: 'no such key'")
    text = gpu_check.render([record], ctx, 1.0, 60)
    assert "| `broken` | a check with a bug | failed | 0 | KeyError: 'no such key' |" in text
    assert "## `broken`: its output" in text and "KeyError: 'no such key'" in text.split(
        "its output")[1]
    assert "1 failed, 0 passed, 0 skipped" in text
