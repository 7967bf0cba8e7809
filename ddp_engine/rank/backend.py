"""Which backend a rank's process group uses, and whether eager NCCL init is safe (the
distributed module's set-up asks both)."""

from __future__ import annotations

import os

import torch

from ddp_engine.common.inventory import FIX_CPU_BUILD


def choose_backend(device_pref: str, local_world_size: int) -> str:
    """nccl when CUDA is wanted and every local rank has its own GPU, else gloo.

    Raises:
        RuntimeError: device "cuda" was asked for but this torch cannot use CUDA, or there are
            too few GPUs for the ranks.
    """
    gpus = torch.cuda.device_count() if device_pref != "cpu" else 0
    if gpus >= local_world_size and gpus > 0:
        return "nccl"
    if device_pref == "cuda":
        if torch.version.cuda is None:
            raise RuntimeError(f"device: cuda: the installed torch {torch.__version__} is a "
                               f"CPU-only build; install the CUDA build: "
                               f"{FIX_CPU_BUILD}")
        if not torch.cuda.is_available():
            raise RuntimeError(f"device: cuda: torch {torch.__version__} (CUDA "
                               f"{torch.version.cuda}) cannot use the GPUs (the driver is too "
                               "old for it, or not loaded): run python -m ddp_engine doctor")
        raise RuntimeError(f"device: cuda needs one GPU per local rank: {local_world_size} ranks, "
                           f"{gpus} GPUs visible (CUDA_VISIBLE_DEVICES="
                           f"{os.environ.get('CUDA_VISIBLE_DEVICES', 'unset')})")
    return "gloo"


def device_id_is_safe(version: str) -> bool:
    """Whether ``init_process_group(device_id=...)`` (eager NCCL init, bound to this rank's GPU)
    is safe on torch ``version``: 2.3 added it, and 2.6.x to 2.7.0 hang at random in NCCL
    collectives with it (pytorch/pytorch#153960, NCCL 2.26's non-blocking init, worked around
    in 2.7.1). Without it torch.cuda.set_device(local_rank) binds the GPU, as the DDP tutorial
    does."""
    try:
        major, minor, patch = (int("".join(c for c in p if c.isdigit()) or 0)
                               for p in (version.split("+")[0].split(".") + ["0", "0"])[:3])
    except ValueError:
        return False
    v = (major, minor, patch)
    return v >= (2, 3, 0) and not (2, 6, 0) <= v < (2, 7, 1)
