"""Where every rank runs: host, node, local rank and, on GPUs, the GPU as nvidia-smi names it;
gathered once at a run's start (telemetry names them in every rank entry)."""

from __future__ import annotations

import socket

import torch
import torch.distributed as dist

from ddp_engine.common.gpus import Nvml, list_gpus
from ddp_engine.rank.distributed import DistInfo


def rank_places(info: DistInfo, group: dist.ProcessGroup | None,
                device: torch.device | None = None) -> list[dict[str, object]]:
    """Where every rank runs, row r for rank r: its node's host name, node rank and local rank,
    and a GPU rank's GPU as NVML names it (see :func:`gpu_identity`); gathered once, at start:
    telemetry names them in every rank entry."""
    mine: dict[str, object] = {"host": socket.gethostname(), "node": info.node_rank,
                               "local_rank": info.local_rank}
    gpu = gpu_identity(device) if device is not None and device.type == "cuda" else None
    if gpu is not None:
        mine["gpu"] = gpu
    if group is None or info.world_size == 1:
        return [mine]
    places: list[dict[str, object] | None] = [None] * info.world_size
    dist.all_gather_object(places, mine, group=group)
    return [p if p is not None else {} for p in places]


def gpu_identity(device: torch.device) -> dict[str, object] | None:
    """The GPU of CUDA ``device`` as nvidia-smi names it: NVML index, UUID, name, PCI bus id
    (CUDA's device numbers depend on CUDA_VISIBLE_DEVICES and CUDA_DEVICE_ORDER; the UUID is
    the same for CUDA and NVML). None where NVML cannot say."""
    index = device.index if device.index is not None else torch.cuda.current_device()
    uuid = str(getattr(torch.cuda.get_device_properties(index), "uuid", "") or "")
    with Nvml() as nvml:
        found = nvml.info_of(uuid if uuid.startswith("GPU-") else f"GPU-{uuid}") if uuid else None
    if found is None:  # an old torch without .uuid: CUDA_VISIBLE_DEVICES's order
        visible = list_gpus()
        found = visible[index] if index < len(visible) else None
    if found is None:
        return None
    return {"index": found.index, "uuid": found.uuid, "name": found.name,
            "pci_bus_id": found.pci_bus_id}
