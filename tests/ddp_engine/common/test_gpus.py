"""Every NVML call (ddp_engine/common/gpus.py): against the simulated NVML
(tests/simulated_nvml.py), where there is no GPU, and on a GPU."""

from __future__ import annotations

import os

from ddp_engine.common.gpus import (
    GpuProcess,
    Nvml,
    driver_versions,
    gpu_count,
    gpu_leftovers,
    gpu_processes,
    list_gpus,
    visible_devices_for,
)
from tests.conftest import cuda
from tests.simulated_nvml import SimulatedNvml, four_gpus, mig_gpu, two_gpus

A, B = "GPU-aaaa1111-0000-0000-0000-000000000000", "GPU-bbbb2222-0000-0000-0000-000000000000"


# ------------------------------------------------------------------------- simulated NVML
def test_the_inventory_lists_every_gpu_in_nvml_order(simulated_nvml: SimulatedNvml) -> None:
    gpus = list_gpus({})
    assert [(g.index, g.name, g.uuid, g.pci_bus_id, g.mig) for g in gpus] == [
        (0, "NVIDIA H200", A, "00000000:17:00.0", False),
        (1, "NVIDIA RTX A6000", B, "00000000:65:00.0", False)]
    assert gpus[1].mem_total_bytes == 48 * 2**30 and gpus[1].label == "GPU 1 (NVIDIA RTX A6000)"
    assert simulated_nvml.initialised == 0  # every session it opened was shut down
    # the ranks get their GPUs by UUID: rank i gets the i-th GPU chosen, whatever CUDA's order
    assert visible_devices_for([1, 0], gpus) == f"{B},{A}"


def test_gpus_keep_their_nvml_index_under_cuda_visible_devices(
        simulated_nvml: SimulatedNvml) -> None:
    """NVML's order is not PCI bus order here: NVML index 0 sits on bus 0x41, index 1 on 0x01.
    A number in CUDA_VISIBLE_DEVICES counts in PCI bus order (CUDA_DEVICE_ORDER=PCI_BUS_ID);
    the GPUs keep the NVML index nvidia-smi shows."""
    simulated_nvml.gpus = four_gpus()
    uuid = [g.uuid for g in simulated_nvml.gpus]
    assert [g.index for g in list_gpus({})] == [0, 1, 2, 3]
    by_number = list_gpus({"CUDA_VISIBLE_DEVICES": "0,1"})  # bus 0x01, then bus 0x41
    assert [(g.index, g.uuid) for g in by_number] == [(1, uuid[1]), (0, uuid[0])]
    by_uuid = list_gpus({"CUDA_VISIBLE_DEVICES": f"{uuid[3]},GPU-2c2c"})  # a unique prefix
    assert [g.index for g in by_uuid] == [3, 2]
    assert visible_devices_for([3, 2], by_uuid) == f"{uuid[3]},{uuid[2]}"
    # CUDA ignores everything after the first entry it cannot match (or a repeated one)
    assert [g.index for g in list_gpus({"CUDA_VISIBLE_DEVICES": "0,7,1"})] == [1]
    assert [g.index for g in list_gpus({"CUDA_VISIBLE_DEVICES": "0,0"})] == [1]
    assert [g.index for g in list_gpus({"CUDA_VISIBLE_DEVICES": "GPU-,1"})] == []  # ambiguous
    assert list_gpus({"CUDA_VISIBLE_DEVICES": ""}) == []


def test_a_mig_gpu_is_listed_as_such_and_a_mig_instance_ends_the_list(
        simulated_nvml: SimulatedNvml) -> None:
    simulated_nvml.gpus = [*two_gpus(), mig_gpu()]
    gpus = list_gpus({})
    assert [g.mig for g in gpus] == [False, False, True]  # listed, not an empty inventory
    assert [g.index for g in list_gpus({"CUDA_VISIBLE_DEVICES": "2,MIG-abc,0"})] == [1]  # bus order


def test_a_rank_names_its_gpu_by_uuid(simulated_nvml: SimulatedNvml) -> None:
    simulated_nvml.gpus = four_gpus()
    with Nvml() as nvml:
        gpu = nvml.info_of("GPU-2c2c2c2c-0000-0000-0000-000000000000")
        assert gpu is not None and gpu.label == "GPU 2 (NVIDIA GeForce RTX 4090)"
        assert nvml.info_of("GPU-ffff") is None and nvml.info_of(9) is None


def test_the_driver_says_which_cuda_it_supports(simulated_nvml: SimulatedNvml) -> None:
    assert driver_versions() == ("550.54.15", (12, 4))
    simulated_nvml.fail_init = True
    assert driver_versions() == (None, None)


def test_readings_are_none_where_the_gpu_cannot_say(simulated_nvml: SimulatedNvml) -> None:
    with Nvml() as nvml:
        h200, a6000 = nvml.read(nvml.handle(A)), nvml.read(nvml.handle(1))
        assert nvml.handle("GPU-nothing") is None and nvml.read(None).util_pct is None
    assert (h200.util_pct, h200.mem_used_bytes, h200.temp_c, h200.power_w) == (3.0, 2**30,
                                                                             40.0, 75.0)
    assert (a6000.util_pct, a6000.mem_total_bytes, a6000.power_w) == (97.0, 48 * 2**30, None)
    assert simulated_nvml.initialised == 0


def test_a_rank_finds_its_gpu_by_uuid_or_by_its_cuda_visible_devices_entry(
        simulated_nvml: SimulatedNvml) -> None:
    with Nvml() as nvml:
        assert nvml.rank_handle(0, uuid=B) is simulated_nvml.gpus[1]
        env = {"CUDA_VISIBLE_DEVICES": f"1,{A}"}
        assert nvml.rank_handle(0, environ=env) is simulated_nvml.gpus[1]
        assert nvml.rank_handle(1, environ=env) is simulated_nvml.gpus[0]
        assert nvml.rank_handle(1, environ={}) is simulated_nvml.gpus[1]


def test_compute_processes_and_leftovers(simulated_nvml: SimulatedNvml) -> None:
    assert gpu_processes() == [GpuProcess(1, 4242, 19 * 2**30)]
    assert gpu_leftovers([4242, 1], timeout_s=0) == [GpuProcess(1, 4242, 19 * 2**30)]
    assert gpu_leftovers([1], timeout_s=0) == []


def test_a_driver_that_fails_to_load_reads_as_no_gpu_not_as_nothing_left(
        simulated_nvml: SimulatedNvml) -> None:
    simulated_nvml.fail_init = True
    assert list_gpus({}) == [] and gpu_count({}) == 0
    assert gpu_processes() is None  # "cannot check", not "nothing left"
    with Nvml() as nvml:
        assert not nvml.available and nvml.count() is None and nvml.info(0) is None


# ---------------------------------------------------------------------------- real NVML


def test_without_nvml_nothing_is_listed_and_nothing_is_claimed_left() -> None:
    if gpu_count():
        procs = gpu_processes()
        assert procs is not None and all(p.pid > 0 for p in procs)
    else:  # "cannot check" must not read as "nothing left": None, not []
        assert gpu_processes() is None
    assert gpu_leftovers([os.getpid()], timeout_s=0) == []  # this process has no CUDA context


@cuda
def test_a_process_with_a_cuda_context_is_listed_until_it_exits() -> None:
    import subprocess
    import sys

    child = subprocess.Popen([sys.executable, "-c", "import torch, sys; "
                              "torch.zeros(1 << 20, device='cuda'); print('up', flush=True); "
                              "sys.stdin.read()"], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                             text=True)
    try:
        assert child.stdout is not None and child.stdout.readline().strip() == "up"
        held = gpu_leftovers([child.pid], timeout_s=0)
        assert [p.pid for p in held] == [child.pid], (
            f"NVML lists {gpu_processes()}, not pid {child.pid}: another pid namespace?")
        assert held[0].used_bytes is None or held[0].used_bytes > 0
    finally:
        child.kill()
        child.wait()
    assert gpu_leftovers([child.pid], timeout_s=10) == []
