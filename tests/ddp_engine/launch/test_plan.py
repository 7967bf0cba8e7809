"""Planning a launch on a GPU machine (ddp_engine/launch/plan.py), on the simulated NVML: what
torch can use decides the device, and the ranks get their GPUs by UUID."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from ddp_engine.common import inventory
from ddp_engine.common.config import ConfigError, RunConfig
from ddp_engine.common.inventory import FIX_CPU_BUILD
from ddp_engine.launch.launcher import launch
from ddp_engine.launch.plan import plan_launch
from tests.simulated_nvml import CPU_BUILD, CUDA_BUILD, SimulatedNvml, four_gpus, mig_gpu


@pytest.fixture
def workstation(simulated_nvml: SimulatedNvml, monkeypatch: pytest.MonkeyPatch
                ) -> SimulatedNvml:
    """Four GPUs of two models, NVML order != PCI order, the launcher's CUDA_VISIBLE_DEVICES
    unset, and the CPU wheel of torch (the test sets another build where it needs one)."""
    simulated_nvml.gpus = four_gpus()
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    monkeypatch.setattr(inventory, "installed_torch", lambda: CPU_BUILD)
    return simulated_nvml


def uuids(sim: SimulatedNvml, *indices: int) -> str:
    return ",".join(sim.gpus[i].uuid for i in indices)


def test_auto_trains_on_cpu_and_says_why_when_torch_cannot_use_the_gpus(
        workstation: SimulatedNvml) -> None:
    plan = plan_launch(RunConfig(), create_run_dir=False)
    assert plan.device == "cpu" and plan.env["CUDA_VISIBLE_DEVICES"] == ""
    assert len(plan.notes) == 1 and FIX_CPU_BUILD in plan.notes[0]
    assert plan.notes[0].startswith("training on CPU: 4 GPU(s) found")


def test_cuda_asked_for_with_a_cpu_build_is_refused_naming_the_fix(
        workstation: SimulatedNvml, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(ConfigError, match=r"^device: 'cuda' asked for: 4 GPU\(s\) found, but "
                       r"the installed torch 2\.13\.0\+cpu is a CPU-only build") as e:
        plan_launch(RunConfig(device="cuda"), create_run_dir=False)
    assert FIX_CPU_BUILD in str(e.value)
    with pytest.raises(ConfigError, match=r"^gpus: GPU 2 cannot be used: the installed torch"):
        plan_launch(RunConfig(gpus=[2]), create_run_dir=False)
    assert launch(RunConfig(device="cuda", dry_run=True)) == 2  # before any process starts
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error: device: 'cuda'") and FIX_CPU_BUILD in err[0]


def test_the_ranks_get_their_gpus_by_uuid_in_the_order_chosen(
        workstation: SimulatedNvml, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(inventory, "installed_torch", lambda: CUDA_BUILD)
    plan = plan_launch(RunConfig(gpus=[3, 1]), create_run_dir=False)
    assert plan.device == "cuda" and plan.notes == [] and plan.cfg.nproc == 2
    assert plan.env["CUDA_VISIBLE_DEVICES"] == uuids(workstation, 3, 1)
    plan = plan_launch(RunConfig(nproc=2), create_run_dir=False)  # the first two, NVML order
    assert plan.cfg.gpus == [0, 1] and plan.env["CUDA_VISIBLE_DEVICES"] == uuids(workstation, 0, 1)


def test_gpus_are_named_by_nvml_index_under_a_cuda_visible_devices(
        workstation: SimulatedNvml, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(inventory, "installed_torch", lambda: CUDA_BUILD)
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "GPU-3d3d,GPU-1b1b")  # the launcher's shell
    plan = plan_launch(RunConfig(), create_run_dir=False)
    assert plan.cfg.gpus == [3, 1] and plan.env["CUDA_VISIBLE_DEVICES"] == uuids(workstation, 3, 1)
    with pytest.raises(ConfigError, match=r"^gpus: GPU 0 does not exist; allowed: 3, 1$"):
        plan_launch(RunConfig(gpus=[0]), create_run_dir=False)


def test_mig_gpus_are_refused_by_name_and_skipped_by_auto(
        workstation: SimulatedNvml, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(inventory, "installed_torch", lambda: CUDA_BUILD)
    workstation.gpus = [four_gpus()[0], mig_gpu()]
    with pytest.raises(ConfigError, match=r"^gpus: GPU 1 cannot be used: GPU 1 \(NVIDIA A100"
                       r".*MIG mode.*nvidia-smi -i 1 -mig 0"):
        plan_launch(RunConfig(gpus=[0, 1]), create_run_dir=False)
    assert plan_launch(RunConfig(), create_run_dir=False).cfg.gpus == [0]
    workstation.gpus = [mig_gpu()]
    plan = plan_launch(RunConfig(), create_run_dir=False)
    assert plan.device == "cpu" and "MIG mode" in plan.notes[0]


def test_nccl_runs_get_the_flight_recorder_dumping_into_their_folder(
        workstation: SimulatedNvml, monkeypatch: pytest.MonkeyPatch, tmp_path) -> None:
    monkeypatch.setattr(inventory, "installed_torch", lambda: CUDA_BUILD)
    for name in ("TORCH_NCCL_DEBUG_INFO_TEMP_FILE", "TORCH_NCCL_DUMP_ON_TIMEOUT"):
        monkeypatch.delenv(name, raising=False)
    plan = plan_launch(RunConfig(gpus=[0, 1], run_dir=str(tmp_path / "run")),
                       create_run_dir=False)
    assert plan.env["TORCH_NCCL_DUMP_ON_TIMEOUT"] == "1"
    assert plan.env["TORCH_NCCL_DEBUG_INFO_TEMP_FILE"] == str(
        (tmp_path / "run").resolve() / "ranks" / "nccl_trace_rank_")
    cpu = plan_launch(RunConfig(device="cpu"), create_run_dir=False)
    assert not any(k.startswith("TORCH_NCCL") for k in cpu.env)


def test_a_scripts_working_folder_is_the_callers_unless_given(
        workstation: SimulatedNvml, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """As torchrun keeps the folder it is started in; config.json gets the absolute folder,
    so the ranks chdir there whoever starts them."""
    script = tmp_path / "scripts" / "train.py"
    script.parent.mkdir()
    script.write_text("print('hi')\n")
    project = tmp_path / "project"
    (project / "out").mkdir(parents=True)
    monkeypatch.chdir(project)
    cfg = RunConfig(script=str(script), device="cpu", nproc=2)
    assert plan_launch(cfg, create_run_dir=False).cfg.script_cwd == str(project)
    given = dataclasses.replace(cfg, script_cwd="out")  # relative: to the caller's folder
    assert plan_launch(given, create_run_dir=False).cfg.script_cwd == str(project / "out")
    assert plan_launch(RunConfig(device="cpu"), create_run_dir=False).cfg.script_cwd is None
    with pytest.raises(ConfigError, match=r"^script_cwd: 'nowhere' is not a folder; give the "
                       r"folder the script should run in"):
        plan_launch(dataclasses.replace(cfg, script_cwd="nowhere"), create_run_dir=False)
