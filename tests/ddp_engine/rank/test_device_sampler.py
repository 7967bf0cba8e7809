"""A rank's device sampler: its GPU's fields from NVML (simulated here), its process's from
psutil, and None for what cannot be read."""

from __future__ import annotations

from ddp_engine.rank.device_sampler import KEYS, DeviceSampler
from tests.simulated_nvml import SimulatedNvml

B = "GPU-bbbb2222-0000-0000-0000-000000000000"


def _one_reading(sampler: DeviceSampler) -> dict[str, float | None]:
    sampler.start()
    try:
        return sampler.poll_once()
    finally:
        sampler.request_stop()
        sampler.join(timeout=10)


def test_a_gpu_rank_reads_its_own_gpu(simulated_nvml: SimulatedNvml) -> None:
    reading = _one_reading(DeviceSampler("cuda", local_rank=0, gpu_uuid=B, hz=50))
    assert reading["gpu_util_pct"] == 97.0 and reading["gpu_temp_c"] == 71.0
    assert reading["gpu_mem_used_bytes"] == 20 * 2**30
    assert reading["gpu_mem_total_bytes"] == 48 * 2**30
    assert reading["gpu_power_w"] is None  # that GPU does not report power
    assert reading["rss_bytes"] is not None and reading["rss_bytes"] > 0
    assert set(reading) == set(KEYS)
    assert simulated_nvml.initialised == 0  # its NVML session closed with the thread


def test_a_cpu_rank_has_no_gpu_fields(simulated_nvml: SimulatedNvml) -> None:
    sampler = DeviceSampler("cpu", local_rank=0)
    reading = sampler.poll_once()
    assert all(reading[k] is None for k in KEYS if k.startswith("gpu_"))
    assert reading["cpu_pct"] is not None


def test_without_nvml_a_gpu_rank_still_reports_its_process(
        simulated_nvml: SimulatedNvml) -> None:
    simulated_nvml.fail_init = True
    reading = _one_reading(DeviceSampler("cuda", local_rank=0, gpu_uuid=B, hz=50))
    assert reading["gpu_util_pct"] is None and reading["rss_bytes"] is not None
