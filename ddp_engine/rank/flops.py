"""The FLOPs of one training step, counted once before the loop, for the dashboard's achieved
FLOP/s and model FLOPs utilization (MFU).

``torch.utils.flop_counter.FlopCounterMode`` counts the FLOPs of the matrix multiplies,
convolutions and attention of one forward and backward of one batch (elementwise work is not
counted: "model FLOPs", as MFU is defined). It runs on the unwrapped module, outside DDP, so
it is no training step: DDP's reducer ignores gradients it did not prepare a backward for (no
all-reduce), and every trace of the pass is undone: the RNG states are forked, buffers such as
BatchNorm's running statistics restored, gradients set to None. Every rank counts, so a model
whose forward holds a collective (SyncBatchNorm) meets it on every rank, and no rank starts
its first timed step later than the others. The run's loss function is not called (a plugin's
may count its calls): the backward starts from the output's sum. The batch is the first
``batch_size`` samples of the training set, collated as the loader does: the loader itself
(its workers, its sampler) is not touched.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Callable
from typing import Any

import torch
from torch import nn
from torch.utils.data import DataLoader
from torch.utils.flop_counter import FlopCounterMode

from ddp_engine.common.gpu_peaks import PRECISIONS

log = logging.getLogger("ddp_engine.rank.flops")


def count_step_flops(module: nn.Module, loader: DataLoader[Any],
                     loss_fn: Callable[[torch.Tensor, torch.Tensor], torch.Tensor],
                     device: torch.device, autocast_dtype: torch.dtype | None,
                     grad_accum: int) -> int | None:
    """FLOPs of one optimizer step on this rank: forward and backward of ``grad_accum``
    micro-batches of the loader's batch size (the optimizer's own work is not counted).
    None, with a warning in the rank's log, where counting failed: training goes on."""
    try:
        x, y = _first_batch(loader, device)
        return _count(module, x, y, loss_fn, device, autocast_dtype) * grad_accum
    except Exception as e:  # a model the counter cannot run: no FLOP/s on the dashboard
        log.warning("FLOPs of a step not counted: %s: %s", type(e).__name__, e)
        return None


def _first_batch(loader: DataLoader[Any], device: torch.device) -> tuple[Any, Any]:
    dataset: Any = loader.dataset
    size = loader.batch_size or 1
    x, y = loader.collate_fn([dataset[i] for i in range(size)])
    return x.to(device), y.to(device)


def _count(module: nn.Module, x: Any, y: Any,
           loss_fn: Callable[[torch.Tensor, torch.Tensor], torch.Tensor],
           device: torch.device, autocast_dtype: torch.dtype | None) -> int:
    saved = [b.detach().clone() for b in module.buffers()]
    rng_devices = [device] if device.type == "cuda" else []
    try:
        with torch.random.fork_rng(devices=rng_devices), \
                FlopCounterMode(display=False) as counter:
            autocast = (torch.autocast(device.type, dtype=autocast_dtype)
                        if autocast_dtype is not None else contextlib.nullcontext())
            with autocast:
                out = module(x)
                # Not the run's loss function: a plugin's may keep state (count its calls,
                # log), and its own FLOPs are not model FLOPs. Any scalar of the output gives
                # the model's backward.
                loss = out.float().sum() if isinstance(out, torch.Tensor) else loss_fn(out, y)
            loss.backward()
        return int(counter.get_total_flops())
    finally:
        with torch.no_grad():
            for buf, old in zip(module.buffers(), saved, strict=True):
                buf.copy_(old)
        module.zero_grad(set_to_none=True)


def matmul_precision(precision: str, device: torch.device) -> str:
    """The math a step's matrix multiplies run in (gpu_peaks.PRECISIONS): the autocast dtype,
    else on CUDA "tf32" where fp32 matmuls may use TF32, else "fp32"."""
    if precision in ("bf16", "fp16"):
        return precision
    if device.type == "cuda" and torch.get_float32_matmul_precision() != "highest":
        return "tf32"
    return "fp32"


def flops_event_fields(flops_per_step: int, precision: str, device: torch.device,
                       batch_size: int, grad_accum: int,
                       places: list[dict[str, object]]) -> dict[str, Any]:
    """The ``flops`` event's fields (docs/PROTOCOL.md): the count, what it counts, the
    precision the peak is looked up in, and each rank's GPU name (null on CPU ranks)."""
    math = matmul_precision(precision, device)
    assert math in PRECISIONS
    gpus = [g.get("name") if isinstance(g := p.get("gpu"), dict) else None for p in places]
    return {"flops_per_step": flops_per_step, "batch_size": batch_size,
            "grad_accum": grad_accum, "precision": math, "gpus": gpus}
