"""Which GPUs a run can train on (ddp_engine/common/inventory.py): what torch was built for, read
without importing it, against what the driver supports, on the simulated NVML."""

from __future__ import annotations

import threading
import time
from pathlib import Path

import pytest

from ddp_engine.common.inventory import (
    FIX_CPU_BUILD,
    GpuInventory,
    TorchBuild,
    cuda_problem,
    gpu_inventory,
    gpu_inventory_within,
    installed_torch,
)
from tests.simulated_nvml import CPU_BUILD, CUDA_BUILD, SimulatedNvml, four_gpus, mig_gpu


def test_the_installed_torch_is_read_from_its_version_file_without_importing_it(
        tmp_path: Path) -> None:
    version = tmp_path / "version.py"
    version.write_text("from typing import Optional\n__all__ = ['__version__']\n"
                       "__version__ = '2.5.1+cu121'\ndebug = False\n"
                       "cuda: Optional[str] = '12.1'\nhip: Optional[str] = None\n")
    assert installed_torch(version) == TorchBuild("2.5.1+cu121", "12.1")
    version.write_text("__version__ = '2.13.0+cpu'\ncuda: Optional[str] = None\n")
    assert installed_torch(version) == CPU_BUILD
    assert installed_torch(tmp_path / "missing.py") == TorchBuild(None, None)
    here = installed_torch()  # this Python's torch, found without importing it
    assert here.version is not None and here.version.split("+")[0].count(".") == 2


def test_why_a_torch_build_cannot_use_the_gpus() -> None:
    cpu = cuda_problem(CPU_BUILD, "550.54.15", (12, 4))
    assert cpu is not None and "CPU-only build" in cpu and FIX_CPU_BUILD in cpu
    assert cuda_problem(CUDA_BUILD, "550.54.15", (12, 4)) is None
    assert cuda_problem(CUDA_BUILD, "550.54.15", (12, 2)) is None  # minor version compatibility
    too_new = cuda_problem(TorchBuild("2.13.0+cu130", "13.0"), "535.104.05", (12, 2))
    assert too_new is not None and "535.104.05" in too_new and "cu122" in too_new
    assert cuda_problem(TorchBuild(None, None), None, None) is not None


def test_nvml_gpus_with_a_cpu_build_of_torch_are_listed_but_none_is_usable(
        simulated_nvml: SimulatedNvml) -> None:
    simulated_nvml.gpus = four_gpus()
    inv = gpu_inventory({}, CPU_BUILD)
    assert len(inv.gpus) == 4 and inv.usable == []
    note = inv.cpu_note()
    assert note is not None and note.startswith("4 GPU(s) found") and FIX_CPU_BUILD in note
    assert inv.why_not(2) == inv.problem and inv.why_not(9) is None
    simulated_nvml.cuda_driver_version = 11080  # CUDA 11.8: too old for a CUDA 12 build
    assert "supports CUDA up to 11.8" in str(gpu_inventory({}, CUDA_BUILD).problem)


def test_mig_gpus_are_listed_and_never_usable(simulated_nvml: SimulatedNvml) -> None:
    simulated_nvml.gpus = [*four_gpus()[:1], mig_gpu()]
    inv = gpu_inventory({}, CUDA_BUILD)
    assert [g.index for g in inv.gpus] == [0, 1] and [g.index for g in inv.usable] == [0]
    assert inv.cpu_note() is None  # GPU 0 is usable
    why = inv.why_not(1)
    assert why is not None and "MIG mode" in why and "nvidia-smi -i 1 -mig 0" in why
    only_mig = GpuInventory([inv.gpus[1]])
    assert only_mig.usable == [] and "MIG" in str(only_mig.cpu_note())


def test_no_gpu_means_no_note(simulated_nvml: SimulatedNvml) -> None:
    simulated_nvml.fail_init = True
    inv = gpu_inventory({}, CPU_BUILD)
    assert inv.gpus == [] and inv.problem is None and inv.cpu_note() is None


@pytest.mark.parametrize("n", [0, 3])
def test_a_counted_inventory_has_indices_from_zero(n: int) -> None:
    assert [g.index for g in GpuInventory.counted(n).usable] == list(range(n))


def test_an_nvml_that_does_not_answer_is_waited_for_only_so_long(
        simulated_nvml: SimulatedNvml) -> None:
    """A wedged GPU blocks NVML's inventory: a launch or the window waits at most the timeout,
    then goes on without GPUs, saying why."""
    simulated_nvml.gpus = four_gpus()
    assert len(gpu_inventory_within(5.0, {}, CUDA_BUILD).usable) == 4  # answers: as it is
    simulated_nvml.gpus[1].blocked = threading.Event()
    start = time.monotonic()
    inv = gpu_inventory_within(0.3, {}, CUDA_BUILD)
    assert time.monotonic() - start < 3.0
    assert inv.gpus == [] and inv.usable == []
    assert inv.cpu_note() == inv.problem == (
        "NVML did not answer within 0.3 s (a wedged GPU or driver?); see whether nvidia-smi "
        "answers")
