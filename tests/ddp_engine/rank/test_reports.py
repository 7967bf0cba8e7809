"""The per-rank entries of a metrics message (ddp_engine/rank/reports.py): a GPU rank's device is
named as nvidia-smi names it, from the GPU identity gathered at start."""

from __future__ import annotations

import math

from ddp_engine.rank.reports import REPORT_FIELDS, rank_entries


def _row(local_rank: int, on_cuda: bool) -> list[float]:
    values = dict.fromkeys(REPORT_FIELDS, math.nan)
    values.update(loss=1.5, local_rank=float(local_rank), on_cuda=1.0 if on_cuda else 0.0,
                  loss_steps=1.0, logged_keys=0.0)
    return [values[k] for k in REPORT_FIELDS]


def test_a_gpu_rank_is_named_by_its_nvml_index_and_carries_its_gpu() -> None:
    """Rank 0 on NVML GPU 5 (say --gpus 5,2): "GPU 5", never its CUDA number cuda:0."""
    gpu = {"index": 5, "uuid": "GPU-5e5e5e5e-0000-0000-0000-000000000000",
           "name": "NVIDIA H200", "pci_bus_id": "00000000:C1:00.0"}
    places: list[dict[str, object]] = [
        {"host": "ws", "node": 0, "local_rank": 0, "gpu": gpu},
        {"host": "ws", "node": 0, "local_rank": 1},  # NVML could not name this one
    ]
    first, second = rank_entries([_row(0, True), _row(1, True)], places)
    assert first["device"] == "GPU 5" and first["gpu"] == gpu and first["local_rank"] == 0
    assert second["device"] == "cuda:1" and "gpu" not in second
    (cpu,) = rank_entries([_row(0, False)], [{"host": "ws", "node": 0, "local_rank": 0}])
    assert cpu["device"] == "cpu" and cpu["loss"] == 1.5
